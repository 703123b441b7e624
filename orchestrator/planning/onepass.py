"""One pass over the queue, for the live daemon and the what-if simulator alike.

The pass is a list of named steps, as pueue's daemon loop is: ``suspend`` jobs whose
planned piece ended, ``reap`` attempts that ended, ``admit`` new jobs, ``plan`` the waiting
ones, ``launch`` what is due and fits, in queue order, and ``guard`` deadlines. The steps
are written once, here, over ``QueueState``: the queue's state as the pass needs it. The
daemon's is the SQL store (``orchestrator.daemon.sqlqueue``), the simulator's plain arrays
(``orchestrator.sim.engine``), which keeps a what-if run of 100,000 jobs in seconds. Each
side may add steps of its own before and after (the daemon: fence, recover, cancel, notes,
health; the simulator: power split, fragmentation samples).

``tick(now_s)`` returns when something is due next: a planned start, a guard check, or
what the state knows (a piece's end, an arrival), as APScheduler's ``_process_jobs``
returns the seconds to sleep. Only how each side waits differs, as SimPy's real-time
environment differs from its simulated one: the daemon sleeps on the wall clock, the
simulator jumps its event loop.

The deadline guard: when the job at the head of the queue cannot start and must start
within a slot to finish by its latest finish at full speed, the jobs that may be suspended
and keep at least ``GUARD_SLACK_SLOTS`` slots of slack (``guard_slack_s``, the planner's
rule) are checkpointed, the fewest GPUs' worth that make room for it; it starts ahead of
them as soon as they have left their GPUs (at once in the simulator; on a later pass for
real processes, which take time to checkpoint).

The ``resize`` step (``Pass(resize=True)``; ``orchestrator.planning.resizestep``), between
``launch`` and ``guard``: a blocked elastic job starts narrower, running elastic jobs shrink
to make room for it, or, with nobody waiting, grow into free GPUs; each only when it saves
more than the restart costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from orchestrator.planning.backfill import Cluster
from orchestrator.planning.pieces import width_of
from orchestrator.planning.policies.base import Decision, QueuedJob
from orchestrator.planning.resizestep import Resizer
from orchestrator.planning.scheduler import Scheduler
from placement.cluster import ClusterAllocator

GUARD_SLACK_SLOTS = 4  # a job the guard suspends keeps at least this many slots of slack
GUARD_ROUNDS = 8  # urgent jobs the guard makes room for in one pass, at most

Step = Callable[[float], object]


def guard_slack_s(job: QueuedJob, remaining_s: float | None, now_s: float,
                  max_defer_s: float) -> float:  # fmt: skip
    """How long a running job could still wait and finish by its latest finish at full
    speed: the planner's rule (``QueuedJob.latest_finish_s``) for the job as it would be
    planned now, with ``remaining_s`` left to run (without a deadline: what is left of its
    maximum deferral). A run time nobody knows leaves a job with a deadline no slack."""
    if remaining_s is None:
        return 0.0 if job.deadline_s is not None else job.latest_finish_s(max_defer_s) - now_s
    finish = replace(job, duration_s=remaining_s).latest_finish_s(max_defer_s)
    return finish - now_s - remaining_s


def may_make_room(job: QueuedJob, remaining_s: float | None, now_s: float, slot_s: float,
                  max_defer_s: float) -> bool:  # fmt: skip
    """May the deadline guard suspend this running job? Only one that may be suspended
    and keeps ``GUARD_SLACK_SLOTS`` slots of slack."""
    if not job.interruptible:
        return False
    return guard_slack_s(job, remaining_s, now_s, max_defer_s) >= GUARD_SLACK_SLOTS * slot_s


@dataclass(slots=True)
class Running:
    """A running attempt as the guard sees it."""

    key: Hashable  # what holds its GPUs in the state's allocator
    job: QueuedJob
    remaining_s: float | None  # its run time left at full speed (None: unknown)
    checkpointing: bool = False  # told to checkpoint, not ended yet
    ref: object = None  # the state's own record of it
    gpus: int = 0  # its width now (0: unknown)
    end_s: float | None = None  # when it is expected to end (None: unknown)
    elastic: bool = False  # the resize step may resize it (not while it runs a planned piece)
    age_s: float = math.inf  # how long this attempt has run (the resize step lets it settle)


class QueueState(Protocol):
    """The queue's state as the pass needs it. Times are epoch seconds."""

    slot_s: float
    max_defer_s: float

    def suspend_due(self, now_s: float) -> None:
        """Suspend running jobs whose planned piece has ended."""

    def reap(self, now_s: float) -> None:
        """Record attempts that ended; requeue those that checkpointed."""

    def admit(self, now_s: float) -> None:
        """Take in jobs that arrived (or became runnable) since the last pass."""

    def plan(self, now_s: float) -> Scheduler:
        """The scheduler holding every waiting job with its plan."""

    def allocate(self, job: QueuedJob, decision: Decision, now_s: float) -> object | None:
        """GPUs for a due job, or None: it does not fit now."""

    def launch(self, job: QueuedJob, decision: Decision, allocation, now_s: float) -> None:
        """Start (or resume) a job on what ``allocate`` gave it."""

    def running(self, now_s: float) -> list[Running]:
        """The running attempts (for the guard)."""

    def make_room(self, width: int, movable: dict, gpu_type: str | None = None) -> list:
        """The fewest of ``movable``'s keys whose GPUs make room for ``width`` (on nodes of
        ``gpu_type``, when given)."""

    def checkpoint(self, run: Running, now_s: float) -> bool:
        """Tell a running job to checkpoint and leave its GPUs (SIGTERM)."""

    def next_due_s(self, now_s: float) -> float | None:
        """The state's own next due time (a piece's end, an arrival), if any."""

    def cluster(self, now_s: float) -> tuple[ClusterAllocator, dict]:
        """For backfill, asked only when the head is blocked: the allocator ``allocate``
        takes from, and when each of its holders is expected to give its GPUs back (the
        running jobs' expected ends; None: unknown)."""

    # for the resize step (``Pass(resize=True)``, ``orchestrator.planning.resize``): the
    # allocator over what runs now, and a checkpoint whose job starts again at once on
    # ``width`` GPUs
    # alloc: placement.cluster.ClusterAllocator
    # def resize(self, run: Running, width: int, now_s: float) -> bool


class Pass:
    """The named steps over a ``QueueState``; ``tick(now_s)`` runs them in order."""

    STEPS = ("suspend", "reap", "admit", "plan", "launch", "resize", "guard")

    def __init__(
        self,
        state: QueueState,
        *,
        guard: bool = True,
        resize: bool = False,
        before: Sequence[tuple[str, Step]] = (),
        after: Sequence[tuple[str, Step]] = (),
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.state = state
        # the daemon's: each step reads the time when it begins (a job reaped in this pass
        # may have ended after the pass began; one planned now is due now). The simulator's
        # time stands still within a pass.
        self.clock = clock
        self.guard_on = guard
        self.scheduler: Scheduler | None = None
        core = [(name, getattr(self, name)) for name in self.STEPS]
        self.steps: list[tuple[str, Step]] = [*before, *core, *after]
        self.wakes: list[float] = []  # what this pass found due later (the simulator's)
        self.guard_suspensions = 0
        self.resizer = Resizer() if resize else None  # resizes running elastic jobs

    def tick(self, now_s: float) -> float | None:
        """One pass. Returns when something is due next (None: nothing known)."""
        self.wakes = []
        for _name, step in self.steps:
            if self.clock is not None:
                now_s = max(now_s, self.clock())
            step(now_s)
        if self.scheduler is not None:
            self._due(self.scheduler.next_start_s(), now_s)
        self._due(self.state.next_due_s(now_s), now_s)
        return min(self.wakes, default=None)

    def _due(self, at: float | None, now_s: float) -> None:
        if at is not None and at > now_s:
            self.wakes.append(at)

    # -- the steps ----------------------------------------------------------------------
    def suspend(self, now_s: float) -> None:
        self.state.suspend_due(now_s)

    def reap(self, now_s: float) -> None:
        self.state.reap(now_s)

    def admit(self, now_s: float) -> None:
        self.state.admit(now_s)

    def plan(self, now_s: float) -> None:
        self.scheduler = self.state.plan(now_s)

    def launch(self, now_s: float) -> None:
        state = self.state
        cluster = getattr(state, "cluster", None)  # for backfill: what holds GPUs until when
        ready = self.scheduler.launchable(
            now_s, self._allocate(now_s), cluster and (lambda: Cluster(*cluster(now_s)))
        )
        promises = getattr(self.scheduler, "promises", {})  # jobs started by backfill
        promised = getattr(state, "promised", None)
        for job, decision, allocation in ready:
            state.launch(job, decision, allocation, now_s)
            until = promises.pop(job.id, None)
            if promised is not None and until is not None:
                promised(job, until, now_s)  # started by backfill on its run time
        overran = getattr(state, "overran", None)
        if overran is not None and (blocked := self.scheduler.blocked()) is not None:
            overran(blocked, now_s)  # backfilled jobs past their promise while it waits

    def resize(self, now_s: float) -> None:
        """Start a blocked elastic job narrower, shrink running ones to make room for
        it, or grow them into GPUs nobody waits for (``orchestrator.planning.resize``)."""
        if self.resizer is not None and self.scheduler is not None:
            self.resizer.step(self, now_s)

    def guard(self, now_s: float) -> None:
        """While the blocked head of the queue must start within a slot to meet its
        latest finish, checkpoint the fewest movable jobs that make room for it, and start
        it ahead of them once they have left."""
        if not self.guard_on or self.scheduler is None:
            return
        state = self.state
        for _ in range(GUARD_ROUNDS):
            scheduler = self.scheduler
            latest = scheduler.blocked_latest_start_s()
            if latest is None:
                return
            if now_s < latest - state.slot_s:
                self._due(latest - state.slot_s, now_s)  # look again then
                return
            running = state.running(now_s)
            if any(r.checkpointing for r in running):
                return  # room is being made already
            head = scheduler.blocked()
            width = width_of(head, scheduler.decision_of(head.id), now_s)
            movable = {
                r.key: r
                for r in running
                if may_make_room(r.job, r.remaining_s, now_s, state.slot_s, state.max_defer_s)
            }
            victims = state.make_room(width, movable, head.gpu_type)
            if not victims:
                return
            heard = [key for key in victims if state.checkpoint(movable[key], now_s)]
            if not heard:
                return  # no SIGTERM reached its job (one still starting): the next pass
            self.guard_suspensions += len(heard)
            self.start_ahead(head.id, now_s)

    def start_ahead(self, job_id: int, now_s: float) -> None:
        """Once running jobs were told to leave its GPUs (the guard's checkpoints, the
        resize step's shrinks): reap those that left (back to the queue, behind it),
        start the waiting job ``job_id`` ahead of them if it fits now (real processes take
        a later pass to checkpoint), then plan and launch the rest."""
        self.state.reap(now_s)
        started = self.scheduler.launch_out_of_order(job_id, self._allocate(now_s))
        if started is not None:
            self.state.launch(*started, now_s)
        self.plan(now_s)
        self.launch(now_s)

    def _allocate(self, now_s: float):
        state = self.state
        return lambda job, decision: state.allocate(job, decision, now_s)
