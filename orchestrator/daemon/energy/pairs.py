"""The pairs running on shared GPUs, as the deadline guard, backfill and caps see them.

A GPU two attempts share is freed only when both leave it: the guard never moves one of a
pair to make room (that frees no GPU: the simulator's ``SharingDaemon.make_room`` too),
and the attempt whose key holds the GPU in the allocator is expected to give it back at
the later of the two ends (unknown where either is unknown), as the simulator's
``SharingDaemon.cluster`` does. A job whose previous attempt was split from its partner
(``daemon.energy.splits``) runs alone in its next one (``after_split``).
"""

from __future__ import annotations

from sqlmodel import col, func, select

from orchestrator.daemon.guard import ACTOR, SPLIT
from orchestrator.queue.attempts import HOLDING, values
from orchestrator.queue.models import Attempt, Event


def partners(session) -> dict[int, list[int]]:
    """Attempt id -> the other attempts on its one GPU, for every GPU two hold."""
    rows = session.exec(
        select(Attempt.id, Attempt.node, Attempt.gpu_ids).where(
            col(Attempt.state).in_(values(HOLDING))
        )
    ).all()
    on: dict[tuple[str, int], list[int]] = {}
    for att_id, node, gpus in rows:
        if gpus and len(gpus) == 1:
            on.setdefault((node, gpus[0]), []).append(att_id)
    out: dict[int, list[int]] = {}
    for ids in on.values():
        if len(ids) > 1:
            for i in ids:
                out[i] = [j for j in ids if j != i]
    return out


def after_split(session, atts: list[Attempt]) -> set[int]:
    """The ids of ``atts`` whose job's previous attempt was split from its partner: the
    daemon wrote a job event whose reason starts with ``SPLIT`` since that attempt began
    (the job's own words never start one: only the daemon writes events' reasons)."""
    again = {a.job_id: a for a in atts if a.number > 1}
    if not again:
        return set()
    split_at = dict(
        session.exec(
            select(Event.job_id, func.max(Event.at))
            .where(col(Event.job_id).in_(list(again)), Event.actor == ACTOR)
            .where(col(Event.reason).startswith(SPLIT))
            .group_by(col(Event.job_id))
        ).all()
    )
    if not split_at:
        return set()
    began = {
        (job_id, number): started
        for job_id, number, started in session.exec(
            select(Attempt.job_id, Attempt.number, Attempt.started_at).where(
                col(Attempt.job_id).in_(list(split_at))
            )
        ).all()
    }
    out = set()
    for job_id, at in split_at.items():
        att = again[job_id]
        previous = began.get((job_id, att.number - 1))
        if previous is not None and _naive(at) >= _naive(previous):
            out.add(att.id)
    return out


def _naive(t):
    return t.replace(tzinfo=None) if t.tzinfo is not None else t


def movable_alone(movable: dict, paired: dict[int, list[int]]) -> dict:
    """The guard's candidates less the attempts sharing their GPU."""
    return {k: v for k, v in movable.items() if not (k[0] == "attempt" and k[1] in paired)}


def pair_ends(ends: dict, paired: dict[int, list[int]]) -> dict:
    """Each paired attempt's expected end: the later of its pair's (None: unknown)."""
    out = dict(ends)
    for key, end in ends.items():
        if key[0] != "attempt" or key[1] not in paired:
            continue
        others = [ends.get(("attempt", j)) for j in paired[key[1]]]
        out[key] = None if end is None or None in others else max([end, *others])
    return out
