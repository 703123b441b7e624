"""One pass of the daemon, in named parts: recover (once, at start), reap finished
attempts, stop cancelled jobs, settle dependencies, launch what is due.

Launching is two transactions around the executor call: (1) the job becomes ``planned``
and a ``launching`` attempt is recorded; (2) after the monitor process started, the
attempt and the job become ``running``. A crash between them leaves a ``launching``
attempt, which recovery settles through the executor's claim protocol: the job is either
found started or provably never started and requeued. No job ever runs twice at once.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from orchestrator.calibration import learn
from orchestrator.db import Database
from orchestrator.errors import ExecutorError, translate
from orchestrator.inventory import ResolvedNode, topology
from orchestrator.models import Attempt, Job
from orchestrator.ownership import User
from orchestrator.policies.base import Policy, QueuedJob
from orchestrator.policies.baselines import Fifo
from orchestrator.scheduler import Scheduler
from orchestrator.settings import Settings
from orchestrator.states import FINAL, JobState, transition
from orchestrator.store import dependencies
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology

log = logging.getLogger("gridshift.daemon")
ACTOR = "daemon"


@dataclass
class Dispatcher:
    settings: Settings
    db: Database
    executor: Executor
    nodes: list[ResolvedNode]
    user: User  # the daemon's own user
    log_gid: int | None = None
    topology: ClusterTopology | None = None
    policy: Policy = field(default_factory=Fifo)

    def __post_init__(self) -> None:
        if self.topology is None:
            self.topology = topology(self.nodes)

    # -- recovery -----------------------------------------------------------------------
    def recover(self, now: datetime) -> None:
        """Settle attempts a crash left behind, before anything new starts."""
        with self.db.read() as session:
            launching = session.exec(select(Attempt).where(Attempt.state == "launching")).all()
        for attempt in launching:
            handle = self.executor.recover(attempt.id, attempt.run_dir)
            with self.db.write() as session:
                att = session.get(Attempt, attempt.id)
                job = session.get(Job, att.job_id)
                if handle is None:
                    att.state, att.finished_at = "abandoned", now
                    att.detail = "the daemon stopped before the job started"
                    transition(
                        session,
                        job,
                        JobState.QUEUED,
                        at=now,
                        actor=ACTOR,
                        reason="launch interrupted by a daemon restart; requeued",
                    )
                    log.info("job %s: launch was interrupted; requeued", job.id)
                else:
                    _mark_running(
                        session,
                        att,
                        job,
                        handle,
                        now,
                        reason="found started after a daemon restart",
                    )
                    log.info("job %s: reattached after restart", job.id)
                session.add(att)

    # -- reap ---------------------------------------------------------------------------
    def reap(self, now: datetime) -> int:
        """Record attempts that ended. Returns how many ended."""
        with self.db.read() as session:
            running = session.exec(select(Attempt).where(Attempt.state == "running")).all()
        ended = 0
        for attempt in running:
            handle = Handle.from_dict(attempt.handle)
            result = self.executor.poll(handle)
            self._record_progress(attempt, self.executor.progress(handle), now)
            if result.status is RunStatus.RUNNING:
                continue
            self._record_end(attempt.id, result, now)
            ended += 1
        return ended

    def _record_progress(self, attempt: Attempt, progress, now: datetime) -> None:
        if progress is None or progress == (attempt.progress_done, attempt.progress_total):
            return
        with self.db.write() as session:
            row = session.get(Attempt, attempt.id)
            row.progress_done, row.progress_total = progress
            row.progress_at = now
            session.add(row)

    def _record_end(self, attempt_id: int, result: PollResult, now: datetime) -> None:
        with self.db.write() as session:
            att = session.get(Attempt, attempt_id)
            job = session.get(Job, att.job_id)
            ended_at = result.ended_at or now
            att.finished_at, att.exit_code, att.signal = ended_at, result.exit_code, result.signal
            att.energy_j, att.detail = result.energy_j, result.detail
            att.state = "exited" if result.status is RunStatus.EXITED else "lost"
            session.add(att)
            job.exit_code = result.exit_code
            if result.energy_j is not None:
                job.energy_j = (job.energy_j or 0.0) + result.energy_j
            job.finished_at = ended_at
            if job.cancel_requested_at is not None:
                to, reason = JobState.CANCELLED, "cancelled by request"
            elif result.status is RunStatus.LOST:
                to, reason = JobState.LOST, result.detail or "vanished"
            elif result.exit_code == 0:
                to, reason = JobState.COMPLETED, None
            else:
                to, reason = JobState.FAILED, _exit_reason(result)
            transition(session, job, to, at=ended_at, actor=ACTOR, reason=reason)
            if to is JobState.COMPLETED:
                learn(session, job, att, now)
        log.info("job %s: %s%s", job.id, to, f" ({reason})" if reason else "")

    # -- cancel -------------------------------------------------------------------------
    def stop_cancelled(self, now: datetime) -> None:
        """SIGTERM the process group of each running job whose cancel was requested;
        SIGKILL once the grace period has passed."""
        grace = timedelta(seconds=self.settings.cancel_grace_s)
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(Attempt.state == "running")
                .where(col(Job.cancel_requested_at).is_not(None))
            ).all()
        for att in rows:
            if att.kill_sent_at is not None:
                continue
            if att.term_sent_at is None:
                sig, field = signal.SIGTERM, "term_sent_at"
            elif now - att.term_sent_at >= grace:
                sig, field = signal.SIGKILL, "kill_sent_at"
            else:
                continue
            try:
                self.executor.signal(Handle.from_dict(att.handle), sig)
            except Exception as exc:  # logged; retried next tick
                log.warning("job %s: cannot signal: %s", att.job_id, translate(exc) or exc)
                continue
            with self.db.write() as session:
                row = session.get(Attempt, att.id)
                setattr(row, field, now)
                session.add(row)

    # -- schedule and launch ------------------------------------------------------------
    def launch_due(self, now: datetime) -> int:
        """Start queued jobs in priority, then submission order, while GPUs allow.
        Strict order: the first job that does not fit waits, and so do those behind it
        (no job is starved by narrower ones). Jobs still waiting for a dependency step
        aside. Returns how many started."""
        with self.db.read() as session:
            queued = list(
                session.exec(
                    select(Job)
                    .where(Job.state == JobState.QUEUED.value)
                    .order_by(col(Job.priority).desc(), col(Job.id))
                ).all()
            )
            if not queued:
                return 0
            deps = dependencies(session, [j.id for j in queued])
            dep_ids = {d for ds in deps.values() for d in ds}
            dep_state = dict(
                session.exec(select(Job.id, Job.state).where(col(Job.id).in_(dep_ids))).all()
            )
            alloc = self._allocator(session)
        largest = alloc.max_node_gpus
        eligible: dict[int, Job] = {}
        for job in queued:
            failed_dep = next(
                (
                    d
                    for d in deps[job.id]
                    if dep_state[d] in (JobState.FAILED, JobState.CANCELLED, JobState.LOST)
                ),
                None,
            )
            if failed_dep is not None:
                self._fail_queued(job.id, now, f"dependency {failed_dep} {dep_state[failed_dep]}")
                continue
            if any(dep_state[d] != JobState.COMPLETED for d in deps[job.id]):
                continue
            if job.gpus_min > largest:
                self._fail_queued(
                    job.id, now, f"needs {job.gpus_min} GPUs; the largest node has {largest}"
                )
                continue
            if not self.user.is_root and job.uid != self.user.uid:
                self._fail_queued(
                    job.id,
                    now,
                    f"the daemon runs as {self.user.name} and "
                    f"cannot run jobs as {job.user}; run it as root",
                )
                continue
            eligible[job.id] = job
        # The decision core the simulator drives too: plan, then due jobs in strict order.
        scheduler = Scheduler(self.policy)
        scheduler.add(_queued_view(job, largest) for job in eligible.values())
        now_s = now.timestamp()
        scheduler.plan(now_s)

        def allocate(view: QueuedJob, _decision):
            if view.gpus == 0:  # a CPU-only job: the first node, no GPUs
                return (self.nodes[0].name, [])
            allocation = alloc.allocate(("job", view.id), view.gpus)
            if allocation is None:
                return None
            (node, gpu_tuple), *_ = allocation.parts
            return (node, list(gpu_tuple))

        started = 0
        for view, _plan, (node, gpus) in scheduler.launchable(now_s, allocate):
            if self._launch(eligible[view.id], node, gpus, now):
                started += 1
            elif gpus:
                alloc.free(("job", view.id))
        return started

    def _allocator(self, session: Session) -> ClusterAllocator:
        """Buddy allocation over the cluster, holding what running attempts hold."""
        alloc = ClusterAllocator(self.topology)
        rows = session.exec(
            select(Attempt).where(col(Attempt.state).in_(["launching", "running"]))
        ).all()
        for att in rows:
            if att.gpu_ids:
                alloc.hold(("attempt", att.id), att.node, att.gpu_ids)
        return alloc

    def _fail_queued(self, job_id: int, now: datetime, reason: str) -> None:
        with self.db.write() as session:
            job = session.get(Job, job_id)
            if job.state == JobState.QUEUED.value:
                transition(session, job, JobState.FAILED, at=now, actor=ACTOR, reason=reason)
        log.info("job %s: failed (%s)", job_id, reason)

    def _launch(self, queued: Job, node_name: str, gpus: list[int], now: datetime) -> bool:
        node = next(n for n in self.nodes if n.name == node_name)
        with self.db.write() as session:  # transaction 1: planned + launching attempt
            job = session.get(Job, queued.id)
            if job.state != JobState.QUEUED.value:
                return False  # cancelled meanwhile
            job.attempts += 1
            job.node, job.gpu_ids = node_name, gpus
            att = Attempt(
                job_id=job.id,
                number=job.attempts,
                state="launching",
                node=node_name,
                gpu_ids=gpus,
                run_dir="",
                run_as_uid=self._run_as(job),
            )
            session.add(att)
            session.flush()
            att.run_dir = str(self.settings.runs_dir / f"attempt-{att.id}")
            transition(
                session,
                job,
                JobState.PLANNED,
                at=now,
                actor=ACTOR,
                reason=f"placed on {node_name} GPUs {_gpu_list(gpus) or 'none'}",
            )
        spec = self._launch_spec(job, att, node)
        try:
            handle = self.executor.launch(spec)
        except Exception as exc:
            err = translate(exc) or ExecutorError(str(exc))
            with self.db.write() as session:
                row, job = session.get(Attempt, att.id), session.get(Job, job.id)
                row.state, row.finished_at, row.detail = "failed", now, str(err)
                session.add(row)
                transition(
                    session,
                    job,
                    JobState.FAILED,
                    at=now,
                    actor=ACTOR,
                    reason=f"launch failed: {err}",
                )
            log.error("job %s: launch failed: %s", job.id, err)
            return False
        with self.db.write() as session:  # transaction 2: running
            row, job = session.get(Attempt, att.id), session.get(Job, job.id)
            _mark_running(session, row, job, handle, now)
        log.info("job %s: running on %s GPUs %s", job.id, node_name, _gpu_list(gpus) or "-")
        return True

    def _run_as(self, job: Job) -> int | None:
        return job.uid if self.user.is_root and job.uid != self.user.uid else None

    def _launch_spec(self, job: Job, att: Attempt, node: ResolvedNode) -> LaunchSpec:
        env = dict(job.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": _gpu_list(att.gpu_ids),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's order, as placement uses
                "GRIDSHIFT_JOB_ID": str(job.id),
            }
        )
        if node.fake:
            power = self.settings.fake_gpu_power_w
            backend = f"fake:{power}" if power else "fake"
        else:
            backend = "nvml" if node.gpu_source == "nvml" else "none"
        return LaunchSpec(
            job_id=job.id,
            attempt_id=att.id,
            command=list(job.command),
            workdir=job.workdir,
            env=env,
            gpu_indices=list(att.gpu_ids),
            log_path=str(self.settings.log_path(job.id)),
            run_dir=att.run_dir,
            run_as_uid=att.run_as_uid,
            log_gid=self.log_gid,
            gpu_backend=backend,
        )

    # -- idleness -----------------------------------------------------------------------
    def pending_count(self) -> int:
        from sqlalchemy import func

        with self.db.read() as session:
            return int(
                session.exec(
                    select(func.count())
                    .select_from(Job)
                    .where(col(Job.state).not_in([s.value for s in FINAL] + [JobState.LOST.value]))
                ).one()
            )


def _mark_running(
    session: Session,
    att: Attempt,
    job: Job,
    handle: Handle,
    now: datetime,
    reason: str | None = None,
) -> None:
    att.state, att.handle, att.started_at = "running", handle.to_dict(), now
    session.add(att)
    job.started_at = job.started_at or now
    transition(session, job, JobState.RUNNING, at=now, actor=ACTOR, reason=reason)


def _queued_view(job: Job, largest: int) -> QueuedJob:
    return QueuedJob(
        id=job.id,
        gpus=min(job.gpus_max, largest),
        submitted_s=job.submitted_at.timestamp(),
        priority=job.priority,
        duration_s=job.duration_s,
        deadline_s=job.deadline.timestamp() if job.deadline else None,
        interruptible=job.interruptible,
    )


def _gpu_list(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def _exit_reason(result: PollResult) -> str:
    if result.detail:
        return result.detail
    if result.signal:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"killed by {name}"
    return f"exit code {result.exit_code}"
