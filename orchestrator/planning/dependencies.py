"""Planning jobs that wait for others (``submit --after``): a dependant may start no
earlier than each of its dependencies is expected to end.

A running dependency's end is its start plus its estimated run time (the caller's); a
queued one's is its planned end, so a chain is planned in rounds: plan, give each
dependant the planned ends of its dependencies as its earliest start, plan again, until
nothing moves (at most one round per dependant, and ``MAX_ROUNDS``); a start still early
after that is moved later, whole.
A dependency that is neither running nor queued has ended: it holds nothing back. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.planning.policies.base import Decision, Plan, Policy, Snapshot, not_before

MAX_ROUNDS = 4  # replans at most; a deeper chain's later links are shifted, not replanned


def planned_end_s(decision: Decision, duration_s: float | None) -> float:
    """When a planned job is expected to end: its decision's end, else its last piece's,
    else its start plus its run time (its start, without one)."""
    if decision.end_s is not None:
        return decision.end_s
    if decision.intervals:
        return decision.intervals[-1][1]
    return decision.start_s + (duration_s or 0.0)


def plan_with_dependencies(
    policy: Policy,
    snap: Snapshot,
    after: Mapping[int, Sequence[int]],
    running_end_s: Mapping[int, float],
) -> tuple[Snapshot, Plan]:
    """``policy``'s plan of ``snap`` with each job starting no earlier than its
    dependencies' expected ends (``after``: job id -> ids it waits for;
    ``running_end_s``: running job id -> expected end). Returns the snapshot planned last
    (its jobs carry ``earliest_s``) and the plan."""
    queued = {j.id for j in snap.jobs}
    waits = {j.id: [d for d in after.get(j.id, ()) if d != j.id] for j in snap.jobs}
    waits = {k: v for k, v in waits.items() if v}

    def bound(job_id: int, plan: Plan, durations: dict) -> float | None:
        ends = [running_end_s[d] for d in waits[job_id] if d in running_end_s]
        for d in waits[job_id]:
            if d in queued and d in plan:
                ends.append(planned_end_s(plan[d], durations.get(d)))
        return max(ends) if ends else None

    durations = {j.id: j.duration_s for j in snap.jobs}
    snap = _with_earliest(snap, {k: bound(k, {}, durations) for k in waits})
    plan = policy.plan(snap) if snap.jobs else {}
    for _ in range(min(len(waits), MAX_ROUNDS)):
        if not any(d in queued for v in waits.values() for d in v):
            break
        wanted = {k: bound(k, plan, durations) for k in waits}
        current = {j.id: j.earliest_s for j in snap.jobs if j.id in waits}
        if all(_same(wanted[k], current[k]) for k in waits):
            break
        snap = _with_earliest(snap, wanted)
        plan = policy.plan(snap)
    by_id = {j.id: j for j in snap.jobs}
    plan = {k: not_before(d, by_id[k].earliest_s if k in by_id else None) for k, d in plan.items()}
    for _ in range(len(waits)):  # rounds ran out or a joint plan moved: shift what is early
        moved = False
        for k in waits:
            at = bound(k, plan, durations) if k in plan else None
            if at is not None and plan[k].start_s < at - 1e-6:
                plan[k], moved = not_before(plan[k], at), True
        if not moved:
            break
    return snap, plan


def _with_earliest(snap: Snapshot, earliest: Mapping[int, float | None]) -> Snapshot:
    jobs = [replace(j, earliest_s=earliest[j.id]) if j.id in earliest else j for j in snap.jobs]
    return replace(snap, jobs=jobs)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) < 1.0
