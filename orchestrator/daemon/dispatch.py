"""Starting attempts: the launch and resume the pass's ``launch`` step calls on the live
side (``orchestrator.daemon.sqlqueue``), the buddy allocator over what attempts hold, and
the hand-over of a planned job to Slurm.

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
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, col, select

from executors.base import Executor, Handle
from executors.errors import HostUnreachable
from executors.gang import PartsNotStarted
from orchestrator.daemon.energy.gputypes import with_types
from orchestrator.daemon.energy.sharedcaps import settle
from orchestrator.daemon.launchspec import gpu_list as _gpu_list
from orchestrator.daemon.launchspec import launch_spec, part_specs
from orchestrator.daemon.reaper import mark_running
from orchestrator.errors import ExecutorError, translate
from orchestrator.nodes.inventory import ResolvedNode, topology
from orchestrator.nodes.powercaps import PowerCaps
from orchestrator.planning.pieces import piece_cap_until
from orchestrator.planning.policies.base import Decision
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState, remaining_run_s
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job
from orchestrator.queue.ownership import User
from orchestrator.queue.states import FINAL, JobState, fail_unreadable, transition
from orchestrator.settings import Settings
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology

log = logging.getLogger(__name__)
ACTOR = "daemon"


@dataclass
class Dispatcher:
    """Starts and resumes attempts on what the pass placed them on."""

    settings: Settings
    db: Database
    executor: Executor
    nodes: list[ResolvedNode]
    user: User  # the daemon's own user
    log_gid: int | None = None
    topology: ClusterTopology | None = None
    caps: PowerCaps | None = None
    power_sample_s: float | None = None
    site: object = None  # daemon.energy.sitelimit.SiteLimit: the site power limit, if any
    # PostgreSQL: raises LeaseLost inside the launch transaction unless this daemon still
    # holds the queue's lease (orchestrator.daemon.lease)
    lease_check: Callable[[Session], None] | None = None
    sharing: object | None = None  # orchestrator.daemon.energy.sharing.Sharing (co-location)

    def __post_init__(self) -> None:
        if self.topology is None:
            self.topology = topology(self.nodes)
        self.topology = with_types(self.topology, self.nodes)  # each node's GPU type
        self._warned: set[int] = set()  # attempts on GPUs this daemon lacks, said once

    def allocator(self, session: Session) -> ClusterAllocator:
        """Buddy allocation over the cluster, holding what running attempts hold."""
        alloc = ClusterAllocator(self.topology)
        # submitted: handed to Slurm; orphaned: until fenced
        held = attempts.values(attempts.HOLDING)
        rows = session.exec(select(Attempt).where(col(Attempt.state).in_(held))).all()
        batch = {n.name for n in self.nodes if n.executor == "slurm"}
        for att in rows:
            if att.parts:  # a job across servers holds its servers whole
                for name in {p["node"] for p in att.parts} & set(alloc.node_names):
                    free = alloc.free_on(name)
                    if free:
                        alloc.hold(("attempt", att.id), name, free)
                continue
            if not att.gpu_ids:
                continue
            if att.node not in alloc.node_names:  # a node no longer configured
                self._warn_missing(att, att.gpu_ids)
                continue
            if att.node in batch:  # Slurm picks the GPUs: hold a count
                free = alloc.free_on(att.node)[: len(att.gpu_ids)]
                if free:
                    alloc.hold(("attempt", att.id), att.node, free)
                continue
            there = set(alloc.gpus_of(att.node))
            gone = [g for g in att.gpu_ids if g not in there]
            if gone:  # fewer GPUs than when it started: it keeps those still there
                self._warn_missing(att, gone)
            held = [g for g in att.gpu_ids if g in there and g in alloc.free_on(att.node)]
            if held:
                alloc.hold(("attempt", att.id), att.node, held)
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

    def admitted(self, alloc: ClusterAllocator, job_id: int, got, decision, now_s: float):
        """``got`` (an allocation: node, GPUs[, parts]), if the site power limit lets the
        job start on it now; else None, its GPUs given back (it waits)."""
        if self.site is None or got is None:
            return got
        cap, _ = piece_cap_until(decision, now_s)
        if self.site.admits(job_id, got[2] if len(got) > 2 else [got[:2]], cap or 1.0):
            return got
        alloc.free(("job", job_id))
        return None

    def _warn_missing(self, att: Attempt, gpus: list[int]) -> None:
        """An attempt holds GPUs this daemon does not have (the config lists fewer, or a
        GPU fell off the bus): it runs on and is reaped as usual; nothing is placed there.
        Said once per attempt."""
        if att.id in self._warned:
            return
        self._warned.add(att.id)
        log.warning(
            "job %s: attempt %s holds GPU(s) %s of node %s, which this daemon does not have; "
            "it keeps running and is followed as usual, and nothing new is placed there",
            att.job_id, att.id, _gpu_list(gpus), att.node,
        )  # fmt: skip

    def _model_of(
        self, node: ResolvedNode, gpus: list[int], parts: list[tuple[str, list[int]]] | None
    ) -> str | None:
        """The attempt's GPU model; a job across servers: its parts' one model, or None
        where they differ (calibration then learns nothing from it)."""
        if not parts:
            return node.model_of(gpus) if gpus else None
        by_name = {n.name: n for n in self.nodes}
        models = {by_name[n].model_of(g) for n, g in parts}
        return models.pop() if len(models) == 1 else None

    def fail_queued(self, job_id: int, now: datetime, reason: str) -> None:
        try:
            with self.db.write() as session:
                job = session.get(Job, job_id)
                if job.state == JobState.QUEUED.value:
                    transition(session, job, JobState.FAILED, at=now, actor=ACTOR, reason=reason)
        except (ValueError, TypeError, OverflowError):  # a row that cannot even be read
            with self.db.write() as session:
                fail_unreadable(session, job_id, now, reason)
        log.info("job %s: failed (%s)", job_id, reason)

    def launch(
        self,
        queued: Job,
        node_name: str,
        gpus: list[int],
        now: datetime,
        decision: Decision | None = None,
        begin_at: datetime | None = None,
        parts: list[tuple[str, list[int]]] | None = None,
    ) -> bool:
        """Start a queued job on ``gpus`` of ``node_name``; a job across servers on
        ``parts`` ((node, GPUs) per server, rank order; the first is ``node_name``'s)."""
        node = next(n for n in self.nodes if n.name == node_name)
        cap, until = piece_cap_until(decision, now.timestamp())
        width = sum(len(g) for _, g in parts) if parts else len(gpus)
        if self.caps is None or not self.caps.enabled_on(node_name) or not gpus or parts:
            cap = None  # a job across servers runs uncapped
        with self.db.write() as session:  # transaction 1: planned + launching attempt
            if self.lease_check is not None:
                self.lease_check(session)
            job = session.get(Job, queued.id, with_for_update=True)
            if job.state != JobState.QUEUED.value:
                return False  # cancelled meanwhile
            if _edited(queued, job, width):  # planned again at the next pass
                log.info("job %s: edited since this pass planned it; planned again", job.id)
                return False
            job.attempts += 1
            job.node, job.gpu_ids = node_name, gpus
            if parts:  # its servers joined with "+", every part's GPUs in rank order
                job.node = "+".join(n for n, _ in parts)
                job.gpu_ids = [g for _, part in parts for g in part]
            att = attempts.begin(
                session,
                at=now,
                job_id=job.id,
                number=job.attempts,
                node=node_name,
                gpu_ids=gpus,
                run_dir="",
                run_as_uid=self._run_as(job),
                cap=cap,
                planned_until=until if job.interruptible else None,
                gpu_model=self._model_of(node, gpus, parts),
                parts=[{"node": n, "gpu_ids": list(g)} for n, g in parts] if parts else None,
            )
            att.run_dir = str(self.settings.runs_dir / f"attempt-{att.id}")
            transition(
                session,
                job,
                JobState.PLANNED,
                at=now,
                actor=ACTOR,
                reason=_placed(node_name, gpus, parts),
            )
        left_s = None
        if node.executor == "slurm" and job.duration_s:  # its time limit
            with self.db.read() as session:
                left_s = remaining_run_s(session, job)
        spec = launch_spec(
            self.settings, job, att, node, left_s=left_s, log_gid=self.log_gid,
            power_sample_s=self.power_sample_s, begin_at=begin_at,
        )  # fmt: skip
        try:
            if self.site is not None:  # under the site limit: its share (admitted)
                self.site.launch_limits(job.id)
            elif not parts and (cap is not None or self.sharing is not None):  # before it draws
                settle(self.caps, self.db, node_name, gpus)  # shared: the lowest cap
            if parts:
                by_name = {n.name: n for n in self.nodes}
                specs = part_specs(self.settings, job, att, [by_name[n] for n, _ in parts],
                                   power_sample_s=self.power_sample_s)  # fmt: skip
                handle = self.executor.launch_parts(specs, att.run_dir)
            else:
                handle = self.executor.launch(spec)
        except PartsNotStarted as exc:
            self._parts_not_started(att.id, exc, now)
            return False
        except HostUnreachable as exc:
            # Started or not is unknown: the attempt stays ``launching`` and recovery
            # settles it when the server answers (or gives it up after ``lost_after``).
            log.warning("job %s: node %s went away during the launch: %s", job.id, node_name, exc)
            return False
        except Exception as exc:
            err = translate(exc) or ExecutorError(str(exc))
            settle(self.caps, self.db, node_name, gpus, without=att.id)  # a partner's
            with self.db.write() as session:
                row, job = session.get(Attempt, att.id), session.get(Job, job.id)
                attempts.move(
                    session, row, AttemptState.FAILED, at=now, finished_at=now, detail=str(err)
                )
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
        if not self._record_launch(att.id, handle, now):
            return False
        if handle.data.get("slurm_job_id"):  # running once Slurm starts it
            self._release(handle)
            log.info("job %s: submitted to Slurm as job %s", job.id, handle.data["slurm_job_id"])
            return True
        capped = f" capped at {100 * cap:.0f}%" if cap else ""
        where = _placed(node_name, gpus, parts).removeprefix("placed on ")
        log.info("job %s: running on %s%s", job.id, where, capped)
        return True

    def _parts_not_started(self, attempt_id: int, exc: PartsNotStarted, now: datetime) -> None:
        """A part of a job across servers did not start; the others were stopped. Every
        part known not to run: the launch failed (the job fails) or, where a server went
        away, the job is requeued. Else the attempt is orphaned with every part's handle
        (it keeps its GPUs) until its servers answer and each part is fenced; where a
        server went away, the job is requeued only then (or once that server has been
        away for its ``lost_after``, as a single-server launch), by the reaper."""
        with self.db.write() as session:
            row = session.get(Attempt, attempt_id)
            job = session.get(Job, row.job_id)
            if exc.fenced and not exc.unreachable:
                attempts.move(session, row, AttemptState.FAILED, at=now, finished_at=now,
                              detail=str(exc))  # fmt: skip
                transition(session, job, JobState.FAILED, at=now, actor=ACTOR,
                           reason=f"launch failed: {exc}")  # fmt: skip
                log.error("job %s: launch failed: %s", job.id, exc)
                return
            to = AttemptState.ABANDONED if exc.fenced else AttemptState.ORPHANED
            attempts.move(session, row, to, at=now, finished_at=now, detail=str(exc),
                          handle=exc.handle.to_dict())  # fmt: skip
            if exc.unreachable and not exc.fenced:  # a part may run there: not yet
                job.reason = f"launch interrupted: {exc}; requeued once every part is fenced"
                session.add(job)
                log.warning("job %s: launch interrupted: %s", row.job_id, exc)
                return
            transition(session, job, JobState.QUEUED, at=now, actor=ACTOR,
                       reason=f"launch interrupted: {exc}; requeued")  # fmt: skip
        log.warning("job %s: launch interrupted: %s; requeued", row.job_id, exc)

    def _record_launch(self, attempt_id: int, handle: Handle, now: datetime) -> bool:
        """Transaction 2: the attempt is running (or handed to Slurm), when this daemon
        still holds the lease and the attempt is still the ``launching`` one it began (a
        daemon that took over meanwhile may have settled it). Otherwise the launch is
        withdrawn (``Executor.withdraw``: a Slurm job, submitted held, is cancelled
        before it ever ran) and, when the lease was lost, ``LeaseLost`` goes on up."""
        from orchestrator.daemon.lease import LeaseLost

        try:
            with self.db.write() as session:
                if self.lease_check is not None:
                    self.lease_check(session)
                row = session.get(Attempt, attempt_id, with_for_update=True,
                                  populate_existing=True)  # fmt: skip
                if row.state != AttemptState.LAUNCHING.value:
                    log.warning("attempt %s: settled by another daemon (%s) during its "
                                "launch; withdrawn", attempt_id, row.state)  # fmt: skip
                    stale = True
                else:
                    stale = False
                    job = session.get(Job, row.job_id, populate_existing=True)
                    if handle.data.get("slurm_job_id"):
                        attempts.move(session, row, AttemptState.SUBMITTED, at=now,
                                      handle=handle.to_dict())  # fmt: skip
                    else:
                        mark_running(session, row, job, handle, now)
        except LeaseLost:
            self._withdraw(handle)
            raise
        if stale:
            self._withdraw(handle)
        return not stale

    def _withdraw(self, handle: Handle) -> None:
        try:
            self.executor.withdraw(handle)
        except Exception as exc:  # a held job left behind never runs; logged
            log.warning("attempt %s: cannot withdraw its launch: %s", handle.attempt_id, exc)

    def _release(self, handle: Handle) -> None:
        try:
            self.executor.release(handle)
        except Exception as exc:  # released when the reaper finds it still held
            log.warning("attempt %s: cannot release it yet: %s", handle.attempt_id, exc)

    def resume(self, att: Attempt, decision: Decision, now: datetime) -> int:
        """SIGCONT a stopped job on the GPUs it kept, under its new piece's cap."""
        cap, until = piece_cap_until(decision, now.timestamp())
        if self.site is not None:  # parked while stopped: a resume is an admission
            parts = [(p["node"], p["gpu_ids"]) for p in att.parts or ()]
            parts = parts or [(att.node, att.gpu_ids)]
            if not self.site.admits(att.job_id, parts, cap or 1.0):
                return 0  # it stays stopped; the next pass tries again
            self.site.launch_limits(att.job_id)  # others lowered first, then its GPUs up
        try:
            capped = self.caps is not None and self.caps.enabled_on(att.node) and not att.parts
            if capped and self.site is None:  # under a site limit: the GPUs keep its share
                settle(self.caps, self.db, att.node, att.gpu_ids, without=att.id, plus=(cap,))
            self.executor.signal(Handle.from_dict(att.handle), signal.SIGCONT)
        except Exception as exc:  # logged; the next pass tries again
            log.warning("job %s: cannot resume: %s", att.job_id, exc)
            return 0
        with self.db.write() as session:
            row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
            attempts.move(
                session, row, AttemptState.RUNNING, at=now, reason="resumed (SIGCONT)",
                stopped_at=None, planned_until=until, cap=cap if capped else None,
            )  # fmt: skip
            transition(session, job, JobState.RUNNING, at=now, actor=ACTOR, reason="resumed")
        log.info("job %s: resumed (SIGCONT)", att.job_id)
        return 1

    def _run_as(self, job: Job) -> int | None:
        return job.uid if self.user.is_root and job.uid != self.user.uid else None

    # -- a plan handed to a batch scheduler ----------------------------------------------
    def hand_over(self, job_id: int, node_name: str, gpus: int, begin_at: datetime,
                  now: datetime) -> bool:  # fmt: skip
        """Submit a queued job to a Slurm node now, to start at its planned time."""
        with self.db.read() as session:
            job = session.get(Job, job_id)
        if job is None or job.state != JobState.QUEUED.value:
            return False
        return self.launch(job, node_name, list(range(gpus)), now, begin_at=begin_at)

    # -- idleness -----------------------------------------------------------------------
    def pending_count(self) -> int:
        """The jobs that keep the queue busy: every unfinished one but a held job and
        those that wait on one (directly or through others), which wait for a release."""
        from orchestrator.queue.store import dependencies

        done = [s.value for s in FINAL] + [JobState.LOST.value]
        with self.db.read() as session:
            states = dict(
                session.exec(select(Job.id, Job.state).where(col(Job.state).not_in(done))).all()
            )
            stuck = {i for i, state in states.items() if state == JobState.HELD.value}
            if not stuck:
                return len(states)
            queued = [i for i, state in states.items() if state == JobState.QUEUED.value]
            after = dependencies(session, queued)
        grew = True
        while grew:
            new = {i for i, deps in after.items() if i not in stuck and stuck.intersection(deps)}
            stuck |= new
            grew = bool(new)
        return len(states) - len(stuck)


#: What ``edit`` changes that the plan (when, how many GPUs, its pieces) was made on.
PLANNED_ON = ("gpus_min", "gpus_max", "gpu_type", "duration_s", "deadline")


def _placed(node: str, gpus: list[int], parts: list[tuple[str, list[int]]] | None) -> str:
    if not parts:
        return f"placed on {node} GPUs {_gpu_list(gpus) or 'none'}"
    return "placed on " + ", ".join(f"{n} GPUs {_gpu_list(g)}" for n, g in parts)


def _edited(planned: Job, row: Job, gpus: int) -> bool:
    """The job's row, read under lock at its launch, is not what the pass planned it on
    (``edit`` landed meanwhile), or its GPU range no longer holds the GPUs given."""
    if not row.gpus_min <= gpus <= row.gpus_max:
        return True
    return any(getattr(planned, f) != getattr(row, f) for f in PLANNED_ON)
