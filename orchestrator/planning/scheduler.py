"""The decision core of one daemon pass, shared by the live daemon and the simulator:
plan queued jobs with a policy, then pick the jobs that are due and fit, in queue order.

Queue order is priority (high first), then submission time, then id. Among jobs that are
due, the first one that does not fit waits; the jobs behind it start only by backfill
(``planning.backfill``: ``conservative`` by default, ``easy``, or ``strict``: none),
which never delays it, so a wide job is never starved by narrow ones. Jobs not yet due
wait in a heap by planned start; ``next_start_s`` tells the daemon when to wake for them.

A joint planner (``replans_all``) replans every queued job together at most every
``replan_every_s``, and whenever ``invalidate`` says something changed that all plans
depend on (a new forecast, a budget change). In between, jobs that arrive (or come back
from a suspension off-plan) are planned around the plans that stand, which the snapshot
lists as commitments alongside the running jobs. ``context(now)`` gives the rest of the
snapshot: running jobs, cluster size, budget state, price forecast, objective, limits;
it is built only for a policy that reads them (``Policy.reads_cluster``): building the
running jobs' commitments on every pass was most of a baseline's what-if run.

``ahead(now)`` (the simulator's) gives the jobs that wait for a dependency to end: a joint
replan plans them too, each no earlier than its dependencies' planned ends
(``planning.dependencies``), so the plans of the others leave room for them; they are
never due here until the caller adds them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from orchestrator.planning.backfill import (
    DEFAULT_BACKFILL,
    STRICT,
    Backfill,
    Cluster,
    hold_until_s,
    job_key,
    promise_s,
)
from orchestrator.planning.dependencies import plan_with_dependencies
from orchestrator.planning.policies.base import (
    DEFAULT_MAX_DEFER_S,
    Commitment,
    Decision,
    Policy,
    QueuedJob,
    Snapshot,
    not_before,
)

# (job, its decision) -> an allocation, or None: it does not fit now
Allocate = Callable[[QueuedJob, Decision], object | None]
Context = Callable[[float], dict]
# now -> the jobs waiting for a dependency, the ids each waits for, running jobs' ends
Ahead = Callable[[float], tuple[list[QueuedJob], dict[int, list[int]], dict[int, float]]]


@dataclass(slots=True)
class _Entry:
    job: QueuedJob
    decision: Decision
    seq: int  # heap items carry it: an item is stale unless its job's entry has it


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        forecast=None,
        max_defer_s: float | None = None,
        context: Context | None = None,
        ahead: Ahead | None = None,
        backfill: str = DEFAULT_BACKFILL,
    ) -> None:
        self.policy = policy
        self.backfill = backfill
        self.forecast = forecast
        self.max_defer_s = max_defer_s
        self.context = context
        self.ahead = ahead
        self._last_full = -float("inf")
        self._stale = True
        self.replans = 0
        self._entries: dict[int, _Entry] = {}
        # jobs started by backfill on a known run time: when each promised to be done by
        # (``backfill.promise_s``); the state records it when it starts them
        self.promises: dict[int, float] = {}
        # a suspended job gives its GPUs back (SIGTERM); False: it keeps them (SIGSTOP)
        self.pieces_release = True
        self._unplanned: list[QueuedJob] = []
        self._waiting: list[tuple[float, int, int]] = []  # (start, seq, id)
        self._due: list[tuple[int, float, int, int]] = []  # (-priority, submitted, seq, id)
        self._seq = 0

    # -- the queue ----------------------------------------------------------------------
    def add(self, jobs: Iterable[QueuedJob]) -> None:
        self._unplanned.extend(jobs)

    def withdraw(self, job_id: int) -> None:
        """Forget a job (cancelled, or started elsewhere); its heap entries go stale."""
        self._entries.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._entries) + len(self._unplanned)

    # -- plan ---------------------------------------------------------------------------
    def invalidate(self) -> None:
        """Replan every queued job on the next pass (a new forecast, a new budget)."""
        self._stale = True

    def plan(self, now_s: float) -> None:
        """Plan the jobs that have no plan yet, or, for a joint planner when a replan is
        due, every queued job."""
        policy = self.policy
        full = policy.replans_all and (
            self._stale or now_s >= self._last_full + policy.replan_every_s
        )
        if full and (self._entries or self._unplanned):
            jobs = [e.job for e in self._entries.values()] + self._unplanned
            self._last_full, self._stale = now_s, False
        else:
            jobs = self._unplanned
        if not jobs:
            return
        held, after, ends = self.ahead(now_s) if full and self.ahead else ([], {}, {})
        snapshot = Snapshot(now_s, [*jobs, *held], self.forecast)
        if self.max_defer_s is not None:
            snapshot.max_defer_s = self.max_defer_s
        if self.context is not None and policy.reads_cluster:
            for key, value in self.context(now_s).items():
                setattr(snapshot, key, value)
        if policy.replans_all and not full:
            snapshot.committed = list(snapshot.committed) + self.standing()
        if held:
            _, plan = plan_with_dependencies(policy, snapshot, after, ends)
        else:
            plan = policy.plan(snapshot)
        self.replans += 1
        self._unplanned = []
        for job in jobs:
            self.add_planned(job, plan.get(job.id) or Decision(now_s))

    def standing(self) -> list[Commitment]:
        """The GPUs and watts the plans of queued jobs hold (those with an estimate)."""
        out = []
        for entry in self._entries.values():
            d = entry.decision
            if d.end_s is None:
                continue
            pieces = d.intervals or ((d.start_s, d.end_s),)
            for i, (a, b) in enumerate(pieces):
                gpus, _, watts = d.piece_config(i)
                out.append(Commitment(entry.job.id, gpus or entry.job.gpus, watts or 0.0, a, b))
        return out

    def planned(self) -> list[tuple[QueuedJob, Decision]]:
        """Every queued job with its plan (for ``gridshift plan``)."""
        return [(e.job, e.decision) for e in self._entries.values()]

    def add_planned(self, job: QueuedJob, decision: Decision) -> None:
        """Queue a job with a plan it already has (e.g. the rest of its intervals after a
        suspension)."""
        decision = not_before(decision, job.earliest_s)  # never before a dependency's end
        self._seq += 1
        self._entries[job.id] = _Entry(job, decision, self._seq)
        heapq.heappush(self._waiting, (decision.start_s, self._seq, job.id))

    def next_start_s(self) -> float | None:
        """When the earliest job not yet due becomes due."""
        while self._waiting:
            start, seq, job_id = self._waiting[0]
            entry = self._entries.get(job_id)
            if entry is not None and entry.seq == seq:
                return start
            heapq.heappop(self._waiting)  # stale
        return None

    # -- launch -------------------------------------------------------------------------
    def launchable(
        self, now_s: float, allocate: Allocate, cluster: Callable[[], Cluster] | None = None
    ) -> list[tuple[QueuedJob, Decision, object]]:
        """Due jobs that fit now, each with its plan and what ``allocate`` gave it, in
        queue order up to the first that does not fit, then those that backfill behind it
        (given ``cluster``: what holds GPUs now and until when). They leave the
        scheduler. ``allocate`` holds a job's new GPUs under ``backfill.job_key``."""
        waiting, due, entries = self._waiting, self._due, self._entries
        while waiting and waiting[0][0] <= now_s:
            _, seq, job_id = heapq.heappop(waiting)
            entry = entries.get(job_id)
            if entry is not None and entry.seq == seq:
                job = entry.job
                heapq.heappush(due, (-job.priority, job.submitted_s, seq, job_id))
        started: list[tuple[QueuedJob, Decision, object]] = []
        while due:
            _, _, seq, job_id = due[0]
            entry = entries.get(job_id)
            if entry is None or entry.seq != seq:
                heapq.heappop(due)
                continue
            allocation = allocate(entry.job, entry.decision)
            if allocation is None:
                break
            heapq.heappop(due)
            del entries[job_id]
            started.append((entry.job, entry.decision, allocation))
        if due and cluster is not None and self.backfill != STRICT:
            started += self._backfill(now_s, allocate, cluster(), started)
        return started

    def _backfill(
        self, now_s: float, allocate: Allocate, cluster: Cluster, started: list
    ) -> list[tuple[QueuedJob, Decision, object]]:
        """The due jobs behind the blocked head that may start now without delaying it
        (``planning.backfill``). The due heap is rebuilt sorted (a sorted list is a heap)."""
        entries = self._entries
        items = sorted(
            item for item in self._due if (e := entries.get(item[3])) and e.seq == item[2]
        )
        for job, decision, _ in started:  # started in this pass: their ends from their plans
            cluster.ends[job_key(job.id)] = hold_until_s(job, decision, now_s, self.pieces_release)
        queue = [(entries[item[3]].job, entries[item[3]].decision) for item in items]
        release = self.pieces_release
        backfill = Backfill(self.backfill, now_s, cluster, allocate, release)
        backfill.planned = self._planned_later()
        chosen = backfill.fill(queue)
        taken = {index for index, _ in chosen}
        self._due = [item for index, item in enumerate(items) if index not in taken]
        out = []
        for index, allocation in chosen:
            job, decision = queue[index]
            del entries[job.id]
            if (until := hold_until_s(job, decision, now_s, release)) is not None:
                self.promises[job.id] = promise_s(now_s, until)
            out.append((job, decision, allocation))
        return out

    def _planned_later(self) -> list[tuple[QueuedJob, Decision]]:
        """The jobs not due yet, each with its planned start, earliest first: backfill may
        not delay one that is ahead of a candidate in queue order."""
        entries, out = self._entries, []
        for _, seq, job_id in sorted(self._waiting):
            entry = entries.get(job_id)
            if entry is not None and entry.seq == seq:
                out.append((entry.job, entry.decision))
        return out

    def blocked_latest_start_s(self) -> float | None:
        """When the blocked head of the queue must start at the latest to finish by its
        latest finish at full speed (the deadline guard makes room for it by then)."""
        job = self.blocked()
        if job is None or job.duration_s is None:
            return None
        max_defer = DEFAULT_MAX_DEFER_S if self.max_defer_s is None else self.max_defer_s
        return job.latest_finish_s(max_defer) - job.duration_s

    def decision_of(self, job_id: int) -> Decision | None:
        entry = self._entries.get(job_id)
        return None if entry is None else entry.decision

    def launch_out_of_order(
        self, job_id: int, allocate: Allocate
    ) -> tuple[QueuedJob, Decision, object] | None:
        """Start one queued job ahead of its turn (the deadline guard's), if it fits."""
        entry = self._entries.get(job_id)
        if entry is None:
            return None
        allocation = allocate(entry.job, entry.decision)
        if allocation is None:
            return None
        del self._entries[job_id]  # its heap items go stale
        return entry.job, entry.decision, allocation

    def blocked(self) -> QueuedJob | None:
        """The due job at the head of the queue that did not fit, if any."""
        while self._due:
            _, _, seq, job_id = self._due[0]
            entry = self._entries.get(job_id)
            if entry is not None and entry.seq == seq:
                return entry.job
            heapq.heappop(self._due)
        return None
