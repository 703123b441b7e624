"""The live side of the one pass (``orchestrator.planning.onepass``): the queue's state in
the SQL store.

``SqlQueue`` answers the pass's steps from the database, through small collaborators:
the ``Suspender`` (pieces that ended, the guard's checkpoints), the ``Reaper`` (attempts
that ended), cron (occurrences due), the ``LivePlanner`` (the plan) and the
``Dispatcher`` (launch and resume). ``plan`` reads the queue once per pass: the jobs that
may run (a job whose dependency failed, that is wider than the largest node or that this
daemon may not run as its user fails here), stopped jobs that resume, running jobs, and
the buddy allocator over what attempts hold; ``launch`` and the guard use that reading.
Each step is given the clock's time when it begins (``Pass(clock=...)``) and records
that: a dependency reaped in this pass may have ended after the pass began.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, select

from orchestrator.daemon.contain import Faults
from orchestrator.daemon.dispatch import Dispatcher
from orchestrator.daemon.energy.across import across_servers
from orchestrator.daemon.energy.gputypes import allocate_typed, planner_types, type_problem
from orchestrator.daemon.guard import Suspender
from orchestrator.daemon.planner import LivePlanner, expected_load
from orchestrator.daemon.reaper import Reaper
from orchestrator.daemon.running import RunningViews, elastic_rate
from orchestrator.nodes.inventory import widest_job_gpus
from orchestrator.planning.backfill import DEFAULT_BACKFILL
from orchestrator.planning.devices.gputypes import type_of
from orchestrator.planning.onepass import Running
from orchestrator.planning.pieces import width_of
from orchestrator.planning.policies.base import (
    DEFAULT_MAX_DEFER_S,
    Decision,
    QueuedJob,
)
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.planning.scheduler import Scheduler
from orchestrator.planning.snapshot import RunEstimate, across_servers_width
from orchestrator.queue import cron
from orchestrator.queue.attempts import (
    AttemptState,
    note_forced,
    remaining_run_s,
    width_of_attempt,
)
from orchestrator.queue.checks import stored_job_problem, too_wide
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job
from orchestrator.queue.states import JobState
from orchestrator.queue.store import dependencies, submitted_since
from placement.cluster import ClusterAllocator

log = logging.getLogger(__name__)
BAD_DEPENDENCY = (JobState.FAILED, JobState.CANCELLED, JobState.LOST)


@dataclass
class SqlQueue(RunningViews):
    db: Database
    dispatcher: Dispatcher
    reaper: Reaper
    suspender: Suspender
    planner: LivePlanner | None = None  # None: fifo, no signal, no guard
    max_defer_s: float = DEFAULT_MAX_DEFER_S
    # this pass's reading of the queue (``plan``), for ``launch`` and the guard
    eligible: dict[int, Job] = field(default_factory=dict)
    stopped: dict[int, Attempt] = field(default_factory=dict)
    waiting: dict[int, Job] = field(default_factory=dict)  # for a dependency to end
    alloc: ClusterAllocator | None = None
    faults: Faults = field(default_factory=Faults)
    history: object = None  # accounting.estimates.History: earlier runs, kept between passes
    known: dict = field(default_factory=dict)  # this pass's run-time estimates, by job id
    widest: int = 0  # GPUs one job may have: a node's, or the SSH servers' together
    backfill: str = DEFAULT_BACKFILL  # conservative | easy | strict (planning.backfill)
    # elastic jobs the resize step checkpointed: job id -> the width they start again on
    # (in memory: after a restart of the daemon they are planned as any other)
    resize_to: dict[int, int] = field(default_factory=dict)
    resize_from: dict[int, object] = field(default_factory=dict)  # job id -> attempt's key
    power: object = None  # daemon.energy.rightsizing.RightSizer: servers powered off

    @property
    def slot_s(self) -> float:
        return self.planner.slot_s if self.planner is not None else 900.0

    def _at(self, now_s: float) -> datetime:
        return datetime.fromtimestamp(now_s, UTC)

    # -- the steps ----------------------------------------------------------------------
    def suspend_due(self, now_s: float) -> None:
        """Planned pieces that ended, and SIGKILL for a job that ignored its SIGTERM
        past the grace: on every daemon (without a planner no piece is planned, but a
        backfilled job past its promise, a co-location move, or a piece planned before a
        restart without one is told to checkpoint all the same)."""
        self.alloc = None  # the pass begins: the last pass's reading is stale
        self.suspender.suspend_due(self._at(now_s))

    def reap(self, now_s: float) -> None:
        ended = self.reaper.reap(self._at(now_s))
        if ended and self.alloc is not None:  # within the pass (the guard's): GPUs freed
            with self.db.read() as session:
                self.alloc = self._allocator(session)

    def admit(self, now_s: float) -> None:
        """Cron occurrences that are due become queued jobs."""
        largest = widest_job_gpus(self.dispatcher.nodes)
        cron.materialise(self.db, self._at(now_s), largest)

    def plan(self, now_s: float) -> Scheduler:
        now = self._at(now_s)
        d = self.dispatcher
        with self.db.read() as session:
            queued, bad = _queued_rows(session)
            bad |= {j.id: why for j in queued if (why := stored_job_problem(j)) is not None}
            queued = [j for j in queued if j.id not in bad]
            stopped = {
                a.job_id: a
                for a in session.exec(
                    select(Attempt).where(Attempt.state == AttemptState.STOPPED)
                ).all()
            }
            stopped_jobs = [session.get(Job, i) for i in stopped]
            for job in stopped_jobs:  # a stopped job resumes on its plan: checked too
                if (why := stored_job_problem(job)) is not None:
                    stopped.pop(job.id)  # left out of the plan (it stays stopped), said once
                    self.faults.report(
                        f"job {job.id}",
                        f"job {job.id}: plan: the stored job cannot be believed: {why}; cancel it",
                    )
            stopped_jobs = [j for j in stopped_jobs if j.id in stopped]
            running, held_on = _running_rows(session)
            deps = dependencies(session, [j.id for j in queued])
            dep_ids = {x for xs in deps.values() for x in xs}
            dep_state = dict(
                session.exec(select(Job.id, Job.state).where(col(Job.id).in_(dep_ids))).all()
            )
            alloc = self._allocator(session)
            everyone = [*queued, *stopped_jobs, *(j for j, _, _ in running)]
            known = self.known = self._estimates(session, everyone, now)
            remaining = {
                j.id: remaining_run_s(session, j, now, known[j.id].run_s, elastic_rate(j, alloc))
                for j in [*queued, *stopped_jobs]
                if j.attempts and j.id in known
            }
            remaining |= {  # a running job's own reports tell what is left of it
                j.id: remaining_run_s(session, j, now, known[j.id].run_s, elastic_rate(j, alloc))
                for j, _, _ in running
                if j.id in known and known[j.id].source == "progress"
            }
            spent = self._spent_g(session, now)
            since = now - timedelta(seconds=self.max_defer_s)  # the recent load
            submitted, first = submitted_since(session, since) if self.planner else ([], None)
        for job_id, why in bad.items():
            d.fail_queued(job_id, now, f"the stored job cannot be believed: {why}")
        largest = alloc.max_node_gpus
        widest = widest_job_gpus(d.nodes)  # or whole SSH servers together
        eligible: dict[int, Job] = {}
        waiting: dict[int, Job] = {}  # planned ahead for show, not started
        for job in queued:
            failed = next((x for x in deps[job.id] if dep_state[x] in BAD_DEPENDENCY), None)
            if failed is not None:
                d.fail_queued(job.id, now, f"dependency {failed} {dep_state[failed]}")
                continue
            held = [x for x in deps[job.id] if dep_state[x] == JobState.HELD]
            if held:  # not planned ahead: nobody knows when it is released
                _note_held(self.db, job, held)
                continue
            if any(dep_state[x] != JobState.COMPLETED for x in deps[job.id]):
                if self._cannot_run(job, widest) is None:
                    waiting[job.id] = job
                continue  # still waiting for a dependency
            reason = self._cannot_run(job, widest)
            if reason is not None:
                d.fail_queued(job.id, now, reason)
                continue
            eligible[job.id] = job
        for job in stopped_jobs:
            if job.cancel_requested_at is None:
                eligible[job.id] = job
        self.eligible, self.stopped, self.alloc = eligible, stopped, alloc
        self.waiting, self.widest = waiting, widest
        if self.planner is not None:
            load = expected_load(
                submitted, first, known, self.planner.default_run_s, now_s, alloc.total_gpus,
                largest, self.max_defer_s,
            )  # fmt: skip
            scheduler = self.planner.schedule(
                now, list(eligible.values()), remaining, running, alloc.total_gpus, largest,
                spent, known, list(waiting.values()), {i: deps[i] for i in waiting}, load,
                widest, planner_types(alloc.topology, held_on),
            )  # fmt: skip
            scheduler.backfill = self.backfill
            self._restart_resized(scheduler, {j.id for j, _, _ in running}, now_s)
            scheduler.pieces_release = self.suspender.mode != "stop"  # SIGSTOP keeps GPUs
            return scheduler
        scheduler = Scheduler(Fifo(), backfill=self.backfill)  # the simulator's core too
        scheduler.add(_queued_view(job, largest, widest) for job in eligible.values())
        scheduler.plan(now.timestamp())
        return scheduler

    def allocate(self, view: QueuedJob, decision: Decision, now_s: float):
        held = self.stopped.get(view.id)
        if held is not None:  # a stopped job resumes on the GPUs it holds
            return (held.node, list(held.gpu_ids))
        width = width_of(view, decision, now_s)
        if self.widest:  # a job across servers: at most every SSH server's GPUs
            width = min(width, self.widest)
        if width == 0:  # a CPU-only job: the first node, no GPUs
            return (self.dispatcher.nodes[0].name, [])
        job = self.eligible.get(view.id)
        if shared := self._shared(job, width, now_s):  # co-location: a GPU a --share job runs on
            return shared
        place = self.power.placer(self.alloc, now_s) if self.power else None  # servers on first
        allocation = allocate_typed(self.alloc, ("job", view.id), width, job, view, decision,
                                    now_s, place=place)  # fmt: skip
        if allocation is None:
            return None
        (node, gpus), *more = allocation.parts
        got = (
            across_servers(
                self.alloc,
                self._ssh_nodes(),
                ("job", view.id),
                allocation.parts,
                width,
                view.gpu_type,
                place,
            )
            if more
            else (node, list(gpus))
        )
        return self.dispatcher.admitted(self.alloc, view.id, got, decision, now_s)

    def launch(self, view: QueuedJob, decision: Decision, allocation, now_s: float) -> None:
        """Start (or resume) one job. A fault of this job's launch fails the job (while
        it is still queued; one recorded as launching is settled by recovery), and the
        pass goes on with the others (``contain``)."""
        node, gpus, *across = allocation
        self.resize_to.pop(view.id, None)
        self.resize_from.pop(view.id, None)
        now = self._at(now_s)
        started, resumed = False, view.id in self.stopped
        with self.faults.contained(
            f"job {view.id}", f"job {view.id}: launch",
            lambda why: self.dispatcher.fail_queued(view.id, now, f"cannot launch: {why}"),
        ):  # fmt: skip
            if resumed:
                self.dispatcher.resume(self.stopped.pop(view.id), decision, now)
                started = True
            else:
                started = self.dispatcher.launch(self.eligible[view.id], node, gpus, now, decision,
                                                 parts=across[0] if across else None)  # fmt: skip
        if not started:
            if not resumed and gpus and self.alloc.allocation(("job", view.id)):
                self.alloc.free(("job", view.id))
            return
        spend = self.planner.forced_spend(view, decision, now_s) if self.planner else None
        if spend is not None:  # a start its deadline forced: named with its grams
            with self.db.write() as session:
                note_forced(session, view.id, *spend)

    def promised(self, view: QueuedJob, until_s: float, now_s: float) -> None:
        """A job started by backfill: by when it promised to give its GPUs back."""
        self.suspender.promised(view.id, self._at(until_s))

    def overran(self, blocked: QueuedJob, now_s: float) -> None:
        """Stop jobs backfilled past ``blocked`` that broke their promise while it waits."""
        self.suspender.overran(self._at(now_s), self._at(blocked.submitted_s))

    def running(self, now_s: float) -> list[Running]:
        now = self._at(now_s)
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(Attempt.state == AttemptState.RUNNING)
                .order_by(col(Attempt.id))
            ).all()
            out = []
            for att, job in rows:
                # its estimate (``accounting.estimates``), as planned: without one (no
                # planner) or only the lab's default, a job with no --duration runs for a
                # time nobody knows (a deadline job then has no slack to be moved with)
                est = self.known.get(job.id)
                known = est is not None and est.source != "default"
                total_s = est.run_s if known else job.duration_s
                rate = elastic_rate(job, self.alloc) if self.alloc is not None else None
                left = remaining_run_s(session, job, now, total_s, rate) if total_s else None
                view = replace(_queued_view(job, width_of_attempt(att)), duration_s=total_s)
                checkpointing = att.suspend_sent_at is not None
                age_s = (now - att.started_at).total_seconds() if att.started_at else 0.0
                run = Running(("attempt", att.id), view, left, checkpointing, att, age_s=age_s)
                out.append(self._elastic(run, job, att, now_s))
        return out

    def make_room(self, width: int, movable: dict, gpu_type: str | None = None) -> list:
        movable = self._not_paired(movable)  # co-location: moving one of a pair frees no GPU
        if width <= self.alloc.max_node_gpus:
            return self.alloc.make_room(width, movable, gpu_type) or []
        # a job across servers runs on SSH servers alone: room made there, by jobs there
        ssh, held = self._ssh_nodes(), self.alloc.allocations()
        movable = {key: run for key, run in movable.items()
                   if key in held and all(n in ssh for n, _ in held[key].parts)}  # fmt: skip
        others = ("not ssh", "room")
        hidden = [n for n in self.alloc.node_names if n not in ssh and self.alloc.free_on(n)]
        for name in hidden:
            self.alloc.hold(others, name, self.alloc.free_on(name))
        try:
            return self.alloc.make_room(width, movable, gpu_type) or []
        finally:
            if hidden:
                self.alloc.free(others)

    def _ssh_nodes(self) -> set[str]:
        return {n.name for n in self.dispatcher.nodes if n.executor == "ssh"}

    def checkpoint(self, run: Running, now_s: float) -> bool:
        return self.suspender.checkpoint(run.ref, self._at(now_s))

    def next_due_s(self, now_s: float) -> float | None:
        """The next end of a planned piece, and the next cron occurrence."""
        now = datetime.fromtimestamp(now_s, UTC)
        with self.db.read() as session:
            ends = session.exec(
                select(Attempt.planned_until)
                .where(Attempt.state == AttemptState.RUNNING)
                .where(col(Attempt.planned_until).is_not(None))
                .where(col(Attempt.suspend_sent_at).is_(None))
            ).all()
            fires = [cron.next_fire(row, now) for row in cron.active(session)]
        times = [t.timestamp() for t in (*ends, *fires) if t is not None]
        return min(times, default=None)

    # -- parts --------------------------------------------------------------------------
    def _cannot_run(self, job: Job, widest: int) -> str | None:
        if (why := too_wide(job.gpus_min, widest)) is not None:
            return why
        if (why := type_problem(job, self.dispatcher.topology)) is not None:
            return why
        user = self.dispatcher.user
        if not user.is_root and job.uid != user.uid:
            return (
                f"the daemon runs as {user.name} and cannot run jobs as {job.user}; run it as root"
            )
        return None

    def _estimates(self, session: Session, jobs: list[Job], now: datetime) -> dict:
        """Each job's run-time estimate (``accounting.estimates``): planned jobs only. One
        job's that fails is that job's fault (``contain``): it is planned by the lab's
        default and the pass goes on with the others."""
        if self.planner is None:
            return {}
        from orchestrator.accounting.estimates import History, estimates

        if self.history is None:
            self.history = History()
        default_s = self.planner.default_run_s
        with self.faults.contained("estimates", "run-time estimates"):
            return estimates(session, jobs, default_s, now, self.history)
        out: dict = {}  # each job on its own, to find the one at fault
        for job in jobs:
            with self.faults.contained(f"estimate {job.id}", f"job {job.id}: run-time estimate"):
                out |= estimates(session, [job], default_s, now, self.history)
            if job.id not in out:
                out[job.id] = RunEstimate(default_s, "default", "by the lab default (see the log)")
        return out

    def _spent_g(self, session: Session, now: datetime) -> float:
        window = self.planner.budget_window(now) if self.planner is not None else None
        if window is None:
            return 0.0
        from orchestrator.accounting.meter import spent_g

        return spent_g(session, *window, self.planner.budget.kind)


def _queued_rows(session: Session) -> tuple[list[Job], dict[int, str]]:
    """The queued jobs, by priority then id, and those whose row cannot even be read (a
    column that is not of its type): id -> why. One query while every row reads."""
    order = (col(Job.priority).desc(), col(Job.id))
    query = select(Job).where(Job.state == JobState.QUEUED.value)
    try:
        return list(session.exec(query.order_by(*order)).all()), {}
    except (ValueError, TypeError, OverflowError):  # JSONDecodeError is a ValueError
        session.rollback()  # one row does not read: each on its own, to name it
    ids = session.exec(select(Job.id).where(Job.state == JobState.QUEUED.value)).all()
    rows, bad = [], {}
    for job_id in ids:
        try:
            rows.append(session.exec(select(Job).where(Job.id == job_id)).one())
        except (ValueError, TypeError, OverflowError) as exc:
            session.rollback()
            bad[job_id] = f"a column cannot be read ({type(exc).__name__}: {exc})"[:300]
    rows.sort(key=lambda j: (-j.priority, j.id))
    return rows, bad


def _note_held(db: Database, job: Job, held: list[int]) -> None:
    """A job waiting for a held job: no planned start, and why, in words."""
    ids = ", ".join(str(i) for i in sorted(held))
    note = f"after job {ids}, which is held: it waits until that is released and has ended"
    if job.plan_note == note and job.planned_start is None:
        return
    with db.write() as session:
        row = session.get(Job, job.id)
        if row is not None and row.state == JobState.QUEUED.value:
            row.planned_start, row.plan_note = None, note
            session.add(row)


def _running_rows(session: Session) -> tuple[list, dict[int, tuple]]:
    """(job, width, started) of each running attempt, and the nodes each holds."""
    rows = session.exec(
        select(Attempt, Job)
        .join(Job, col(Job.id) == col(Attempt.job_id))
        .where(Attempt.state == AttemptState.RUNNING)
    ).all()
    nodes = {job.id: tuple(p["node"] for p in att.parts or ()) or (att.node,) for att, job in rows}
    return [
        (job, width_of_attempt(att), att.started_at or job.started_at) for att, job in rows
    ], nodes


def _queued_view(job: Job, largest: int, widest: int | None = None) -> QueuedJob:
    return QueuedJob(
        id=job.id,
        gpus=across_servers_width(job.gpus_min, job.gpus_max, largest, widest),
        submitted_s=job.submitted_at.timestamp(),
        priority=job.priority,
        duration_s=job.duration_s,
        deadline_s=job.deadline.timestamp() if job.deadline else None,
        interruptible=job.interruptible,
        gpu_type=type_of(job.gpu_type),
    )
