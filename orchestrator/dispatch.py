"""One pass of the daemon, in named parts: recover (once, at start), reap finished
attempts, stop cancelled jobs (those three in ``orchestrator.reaper``), settle
dependencies, plan and launch what is due (this module).

Launching is two transactions around the executor call: (1) the job becomes ``planned``
and a ``launching`` attempt is recorded; (2) after the monitor process started, the
attempt and the job become ``running``. A crash between them leaves a ``launching``
attempt, which recovery settles through the executor's claim protocol: the job is either
found started or provably never started and requeued. No job ever runs twice at once.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from executors.base import Executor, Handle, LaunchSpec
from executors.errors import HostUnreachable
from orchestrator.accounting import Accountant
from orchestrator.db import Database
from orchestrator.errors import ExecutorError, translate
from orchestrator.inventory import ResolvedNode, topology
from orchestrator.models import Attempt, Job
from orchestrator.ownership import User
from orchestrator.pieces import piece_cap_until, remaining_run_s, width_of
from orchestrator.policies.base import Decision, Policy, QueuedJob
from orchestrator.policies.baselines import Fifo
from orchestrator.powercaps import PowerCaps
from orchestrator.reaper import Reaper, mark_running
from orchestrator.scheduler import Scheduler
from orchestrator.settings import Settings
from orchestrator.states import FINAL, JobState, transition
from orchestrator.store import dependencies
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology

if TYPE_CHECKING:
    from orchestrator.live import LivePlanner

log = logging.getLogger("gridshift.daemon")
ACTOR = "daemon"
FAKE_GPU_STATE = "fake-gpus.json"  # the fake GPUs' power limits, under GRIDSHIFT_HOME


@dataclass
class Dispatcher(Reaper):
    settings: Settings
    db: Database
    executor: Executor
    nodes: list[ResolvedNode]
    user: User  # the daemon's own user
    log_gid: int | None = None
    topology: ClusterTopology | None = None
    policy: Policy = field(default_factory=Fifo)
    planner: LivePlanner | None = None  # None: fifo, no signal
    caps: PowerCaps | None = None
    suspend_mode: str = "signal"  # signal (SIGTERM, requeue) | stop (SIGSTOP/SIGCONT)
    power_sample_s: float | None = None
    # PostgreSQL: raises LeaseLost inside the launch transaction unless this daemon still
    # holds the queue's lease (orchestrator.lease)
    lease_check: Callable[[Session], None] | None = None

    def __post_init__(self) -> None:
        if self.topology is None:
            self.topology = topology(self.nodes)
        feed = self.planner.feed if self.planner else None
        price = self.planner.price if self.planner else None
        self.accountant = Accountant(
            carbon=feed.integral if feed is not None else _no_signal,
            price=price.integral if price is not None else _no_signal,
            modelled_power_w=self._modelled_power_w,
        )
        self._last_written: dict[int, float] = {}

    def launch_due(self, now: datetime) -> int:
        """Plan the waiting jobs, then start (or resume) those that are due while GPUs
        allow. Strict order: the first due job that does not fit waits, and so do those
        behind it (no job is starved by narrower ones); the deadline guard makes room for
        it when it must start. Jobs still waiting for a dependency step aside. Returns how
        many started."""
        with self.db.read() as session:
            queued = list(
                session.exec(
                    select(Job)
                    .where(Job.state == JobState.QUEUED.value)
                    .order_by(col(Job.priority).desc(), col(Job.id))
                ).all()
            )
            stopped = {
                a.job_id: a
                for a in session.exec(select(Attempt).where(Attempt.state == "stopped")).all()
            }
            stopped_jobs = [session.get(Job, i) for i in stopped]
            running = self._running_rows(session)
            deps = dependencies(session, [j.id for j in queued])
            dep_ids = {d for ds in deps.values() for d in ds}
            dep_state = dict(
                session.exec(select(Job.id, Job.state).where(col(Job.id).in_(dep_ids))).all()
            )
            alloc = self._allocator(session)
            remaining = self._remaining_s(session, [*queued, *stopped_jobs])
            spent = self._spent_g(session, now)
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
        for job in stopped_jobs:
            if job.cancel_requested_at is None:
                eligible[job.id] = job
        now_s = now.timestamp()
        if self.planner is not None:
            scheduler = self.planner.schedule(
                now, list(eligible.values()), remaining, running, alloc.total_gpus, largest,
                spent,
            )  # fmt: skip
        else:  # the decision core the simulator drives too: plan, then due jobs in order
            scheduler = Scheduler(self.policy)
            scheduler.add(_queued_view(job, largest) for job in eligible.values())
            scheduler.plan(now_s)

        def allocate(view: QueuedJob, decision: Decision):
            held = stopped.get(view.id)
            if held is not None:  # a stopped job resumes on the GPUs it holds
                return (held.node, list(held.gpu_ids))
            width = width_of(view, decision, now_s)
            if width == 0:  # a CPU-only job: the first node, no GPUs
                return (self.nodes[0].name, [])
            allocation = alloc.allocate(("job", view.id), width)
            if allocation is None:
                return None
            (node, gpu_tuple), *_ = allocation.parts
            return (node, list(gpu_tuple))

        started = 0
        for view, decision, (node, gpus) in scheduler.launchable(now_s, allocate):
            if view.id in stopped:
                started += self._resume(stopped[view.id], decision, now)
            elif self._launch(eligible[view.id], node, gpus, now, decision):
                started += 1
            elif gpus:
                alloc.free(("job", view.id))
        if self.planner is not None:
            from orchestrator.guard import guard_deadlines, note_plans

            note_plans(self, scheduler, eligible, now)
            guard_deadlines(self, scheduler, alloc, now)
        return started

    def _running_rows(self, session: Session) -> list:
        rows = session.exec(
            select(Attempt, Job)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(Attempt.state == "running")
        ).all()
        return [(job, len(att.gpu_ids), att.started_at or job.started_at) for att, job in rows]

    def _remaining_s(self, session: Session, jobs: list[Job]) -> dict[int, float]:
        """Run time left of jobs that ran before (suspended and requeued): from their last
        progress report when it has a total, else their duration less the time they ran."""
        out = {}
        for job in jobs:
            if job.attempts and job.duration_s:
                out[job.id] = remaining_run_s(session, job)
        return out

    def _spent_g(self, session: Session, now: datetime) -> float:
        if self.planner is None:
            return 0.0
        window = self.planner.budget_window(now)
        if window is None:
            return 0.0
        from orchestrator.accounting import spent_g

        return spent_g(session, *window)

    def _allocator(self, session: Session) -> ClusterAllocator:
        """Buddy allocation over the cluster, holding what running attempts hold."""
        alloc = ClusterAllocator(self.topology)
        # submitted: handed to Slurm; orphaned: until fenced
        held = ["launching", "submitted", "running", "stopped", "orphaned"]
        rows = session.exec(select(Attempt).where(col(Attempt.state).in_(held))).all()
        batch = {n.name for n in self.nodes if n.executor == "slurm"}
        for att in rows:
            if att.gpu_ids and att.node in batch:  # Slurm picks the GPUs: hold a count
                free = alloc.free_on(att.node)[: len(att.gpu_ids)]
                if free:
                    alloc.hold(("attempt", att.id), att.node, free)
            elif att.gpu_ids:
                alloc.hold(("attempt", att.id), att.node, att.gpu_ids)
        down = self.executor.unreachable_nodes()
        for node in self.nodes:  # nothing is placed on a server that cannot be reached
            if node.name in down:
                free = alloc.free_on(node.name)
                if free:
                    alloc.hold(("down", node.name), node.name, free)
        # a batch cluster's GPUs that jobs submitted by hand hold are not gridshift's
        for name, busy in self.executor.foreign_gpus().items():
            free = alloc.free_on(name)
            if busy and free:
                alloc.hold(("foreign", name), name, free[:busy])
        return alloc

    def _fail_queued(self, job_id: int, now: datetime, reason: str) -> None:
        with self.db.write() as session:
            job = session.get(Job, job_id)
            if job.state == JobState.QUEUED.value:
                transition(session, job, JobState.FAILED, at=now, actor=ACTOR, reason=reason)
        log.info("job %s: failed (%s)", job_id, reason)

    def _launch(
        self,
        queued: Job,
        node_name: str,
        gpus: list[int],
        now: datetime,
        decision: Decision | None = None,
        begin_at: datetime | None = None,
    ) -> bool:
        node = next(n for n in self.nodes if n.name == node_name)
        cap, until = piece_cap_until(decision, now.timestamp())
        if self.caps is None or not self.caps.enabled_on(node_name) or not gpus:
            cap = None
        with self.db.write() as session:  # transaction 1: planned + launching attempt
            if self.lease_check is not None:
                self.lease_check(session)
            job = session.get(Job, queued.id, with_for_update=True)
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
                cap=cap,
                planned_until=until if job.interruptible else None,
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
        spec = self._launch_spec(job, att, node, begin_at.isoformat() if begin_at else None)
        try:
            if cap is not None:  # before the job draws: it starts under its cap
                self.caps.apply(node_name, gpus, cap)
            handle = self.executor.launch(spec)
        except HostUnreachable as exc:
            # Started or not is unknown: the attempt stays ``launching`` and recovery
            # settles it when the server answers (or gives it up after ``lost_after``).
            log.warning("job %s: node %s went away during the launch: %s", job.id, node_name, exc)
            return False
        except Exception as exc:
            err = translate(exc) or ExecutorError(str(exc))
            if self.caps is not None:
                self.caps.restore(node_name, gpus)
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
        with self.db.write() as session:  # transaction 2: running (or handed to Slurm)
            row, job = session.get(Attempt, att.id), session.get(Job, job.id)
            if handle.data.get("slurm_job_id"):  # running once Slurm starts it
                row.state, row.handle = "submitted", handle.to_dict()
                session.add(row)
                log.info("job %s: submitted to Slurm as job %s", job.id,
                         handle.data["slurm_job_id"])  # fmt: skip
                return True
            mark_running(session, row, job, handle, now)
        capped = f" capped at {100 * cap:.0f}%" if cap else ""
        log.info(
            "job %s: running on %s GPUs %s%s", job.id, node_name, _gpu_list(gpus) or "-", capped
        )
        return True

    def _resume(self, att: Attempt, decision: Decision, now: datetime) -> int:
        """SIGCONT a stopped job on the GPUs it kept, under its new piece's cap."""
        cap, until = piece_cap_until(decision, now.timestamp())
        try:
            capped = self.caps is not None and self.caps.enabled_on(att.node)
            if capped:
                self.caps.apply(att.node, att.gpu_ids, cap)
            self.executor.signal(Handle.from_dict(att.handle), signal.SIGCONT)
        except Exception as exc:  # logged; the next pass tries again
            log.warning("job %s: cannot resume: %s", att.job_id, translate(exc) or exc)
            return 0
        with self.db.write() as session:
            row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
            row.state, row.stopped_at, row.planned_until = "running", None, until
            row.cap = cap if capped else None
            session.add(row)
            transition(session, job, JobState.RUNNING, at=now, actor=ACTOR, reason="resumed")
        log.info("job %s: resumed (SIGCONT)", att.job_id)
        return 1

    def _run_as(self, job: Job) -> int | None:
        return job.uid if self.user.is_root and job.uid != self.user.uid else None

    def _time_limit_s(self, job: Job, att: Attempt, node: ResolvedNode) -> float | None:
        """The model's estimate of the run time left, at this width and cap, plus the
        node's margin and 5 minutes; None (the partition's default) when unknown."""
        if not job.duration_s:
            return None
        with self.db.read() as session:
            left_s = remaining_run_s(session, job)
        width = max(1, len(att.gpu_ids))
        slower = max(1.0, (job.gpus_max or width) / width) / (att.cap or 1.0)
        margin = node.config.time_margin if node.config is not None else 0.25
        return left_s * slower * (1 + margin) + 300.0

    def _launch_spec(
        self, job: Job, att: Attempt, node: ResolvedNode, begin_at_iso: str | None = None
    ) -> LaunchSpec:
        env = dict(job.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": _gpu_list(att.gpu_ids),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's order, as placement uses
                "GRIDSHIFT_JOB_ID": str(job.id),
                "GRIDSHIFT_JOB_NAME": job.name or "",
            }
        )
        remote = node.executor != "local"
        begin_at = time_limit_s = None
        if node.executor == "slurm":  # Slurm picks the GPUs and sets CUDA_VISIBLE_DEVICES
            env.pop("CUDA_VISIBLE_DEVICES")
            time_limit_s = self._time_limit_s(job, att, node)
            begin_at = begin_at_iso
        if node.fake:
            power = self.settings.fake_gpu_power_w
            state = self.settings.home / FAKE_GPU_STATE
            backend = f"fake:{power}@{state}" if power else f"fake:@{state}"
        else:
            backend = {"nvml": "nvml", "nvidia-smi": "smi"}.get(node.gpu_source, "none")
        return LaunchSpec(
            job_id=job.id,
            attempt_id=att.id,
            command=list(job.command),
            workdir=job.workdir,
            env=env,
            gpu_indices=list(att.gpu_ids),
            log_path=str(self.settings.log_path(job.id)),
            run_dir=att.run_dir,
            run_as_uid=None if remote else att.run_as_uid,  # a server runs it as its user
            log_gid=None if remote else self.log_gid,
            gpu_backend=backend,
            power_sample_s=self.power_sample_s,
            node=node.name,
            begin_at=begin_at,
            time_limit_s=time_limit_s,
            interruptible=job.interruptible,
        )

    # -- a plan handed to a batch scheduler ----------------------------------------------
    def hand_over(self, job_id: int, node_name: str, gpus: int, begin_at: datetime,
                  now: datetime) -> bool:  # fmt: skip
        """Submit a queued job to a Slurm node now, to start at its planned time."""
        with self.db.read() as session:
            job = session.get(Job, job_id)
        if job is None or job.state != JobState.QUEUED.value:
            return False
        return self._launch(job, node_name, list(range(gpus)), now, begin_at=begin_at)

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


def _no_signal(_t0: float, _t1: float) -> None:
    return None


def _gpu_list(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)
