"""The attempt state machine: the only place that changes an attempt's state.

    launching → running | submitted | failed | abandoned | orphaned
    submitted → running | exited | lost | orphaned   (handed to a batch scheduler)
    running   → stopped | exited | lost | orphaned
    stopped   → running | exited | lost | orphaned   (SIGSTOP, then SIGCONT)
    orphaned  → lost                                 (fenced once its server answers)

``exited``, ``failed``, ``lost`` and ``abandoned`` are final. An illegal move raises
``StateError``. Each move is one write of the attempt and one ``AttemptEvent`` row, in the
caller's transaction, as ``states.transition`` does for jobs.

Also here: what is left of a job that ran before (``remaining_run_s``), read from its
attempts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from orchestrator.errors import StateError
from orchestrator.queue.models import Attempt, AttemptEvent, Job


class AttemptState(enum.StrEnum):
    LAUNCHING = "launching"  # recorded; the monitor may or may not have started
    SUBMITTED = "submitted"  # handed to a batch scheduler (Slurm), not started yet
    RUNNING = "running"
    STOPPED = "stopped"  # SIGSTOPped; it keeps its GPUs
    EXITED = "exited"  # ended with an exit record (any code)
    FAILED = "failed"  # the launch itself failed
    LOST = "lost"  # vanished without an exit record, or fenced after its node was lost
    ABANDONED = "abandoned"  # a launch cut short that provably never started
    ORPHANED = "orphaned"  # given up while its server was away; fenced when it is back


_S = AttemptState
ALLOWED: dict[AttemptState, frozenset[AttemptState]] = {
    _S.LAUNCHING: frozenset({_S.RUNNING, _S.SUBMITTED, _S.FAILED, _S.ABANDONED, _S.ORPHANED}),
    _S.SUBMITTED: frozenset({_S.RUNNING, _S.EXITED, _S.LOST, _S.ORPHANED}),
    _S.RUNNING: frozenset({_S.STOPPED, _S.EXITED, _S.LOST, _S.ORPHANED}),
    _S.STOPPED: frozenset({_S.RUNNING, _S.EXITED, _S.LOST, _S.ORPHANED}),
    _S.ORPHANED: frozenset({_S.LOST}),
    _S.EXITED: frozenset(),
    _S.FAILED: frozenset(),
    _S.LOST: frozenset(),
    _S.ABANDONED: frozenset(),
}
FINAL = frozenset(s for s, moves in ALLOWED.items() if not moves)
#: Attempts that hold their GPUs (orphaned ones until they are fenced).
HOLDING = (_S.LAUNCHING, _S.SUBMITTED, _S.RUNNING, _S.STOPPED, _S.ORPHANED)
#: Attempts the reaper polls.
LIVE = (_S.SUBMITTED, _S.RUNNING, _S.STOPPED)
#: Attempts whose process exists on a GPU (running or stopped).
ON_GPU = (_S.RUNNING, _S.STOPPED)


def values(states) -> list[str]:
    """The stored strings of ``states`` (for ``col(Attempt.state).in_(...)``)."""
    return [s.value for s in states]


def begin(session: Session, *, at: datetime, **fields: Any) -> Attempt:
    """Record a new ``launching`` attempt (flushed: it has its id)."""
    att = Attempt(state=_S.LAUNCHING.value, **fields)
    session.add(att)
    session.flush()
    session.add(AttemptEvent(attempt_id=att.id, job_id=att.job_id, at=at, to_state=att.state))
    return att


def move(
    session: Session,
    att: Attempt,
    to: AttemptState,
    *,
    at: datetime,
    reason: str | None = None,
    **fields: Any,
) -> AttemptEvent:
    """Move ``att`` to ``to``, set ``fields`` on it and record the event; the caller
    commits."""
    src = AttemptState(att.state)
    if to not in ALLOWED[src]:
        raise StateError(f"attempt {att.id}: illegal transition {src} → {to}")
    att.state = to.value
    for name, value in fields.items():
        setattr(att, name, value)
    event = AttemptEvent(
        attempt_id=att.id, job_id=att.job_id, at=at, from_state=src.value, to_state=to.value,
        reason=reason,
    )  # fmt: skip
    session.add(att)
    session.add(event)
    return event


def remaining_run_s(
    session: Session,
    job: Job,
    now: datetime | None = None,
    total_s: float | None = None,
    rate: Callable[[int], float] | None = None,
) -> float:
    """A job's run time left at full speed: from its last progress report with a total,
    else its duration (or ``total_s``, its estimate) less the time its attempts ran (an
    attempt still running counts to ``now``; a stopped one to when it was stopped), each
    attempt's time at its width's ``rate`` (an elastic job's speed on n GPUs as a share of
    its full speed; None: all at full speed)."""
    total_s = total_s or job.duration_s
    atts = session.exec(
        select(Attempt).where(Attempt.job_id == job.id).order_by(col(Attempt.number))
    ).all()
    last = atts[-1] if atts else None
    if last is not None and last.progress_total and last.progress_done is not None:
        share = min(1.0, last.progress_done / last.progress_total)
        return max(1.0, total_s * (1.0 - share))
    return max(1.0, total_s - ran_s(atts, now, rate))


def ran_s(
    atts: list[Attempt], now: datetime | None, rate: Callable[[int], float] | None = None
) -> float:
    """How long a job's attempts ran (one still running to ``now``; a stopped one to when
    it was stopped), each at its width's ``rate`` (None: all at full speed)."""
    ran = 0.0
    for a in atts:
        running = a.state == _S.RUNNING.value
        end = a.finished_at or a.stopped_at or (now if running else None)
        if a.started_at and end:
            share = rate(len(a.gpu_ids)) if rate is not None and a.gpu_ids else 1.0
            ran += (end - a.started_at).total_seconds() * share
    return ran


def note_forced(session: Session, job_id: int, grams: float, wh: float) -> None:
    """The job's latest attempt started because its deadline forced it against the
    budget, expected to spend ``grams`` g CO2e and ``wh`` Wh in the budget's period: added
    to what its earlier forced starts (resumes of a stopped attempt) recorded."""
    att = session.exec(
        select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number).desc())
    ).first()
    if att is not None:
        att.forced_g = (att.forced_g or 0.0) + grams
        att.forced_wh = (att.forced_wh or 0.0) + wh
        session.add(att)


def parts_of(att: Attempt) -> list[tuple[str, list[int]]]:
    """(node, GPUs) of each part of an attempt, in rank order: one for a single-node
    attempt, one per server for a job across servers (``Attempt.parts``)."""
    if not att.parts:
        return [(att.node, list(att.gpu_ids))]
    return [(str(p["node"]), [int(g) for g in p["gpu_ids"]]) for p in att.parts]


def nodes_of(att: Attempt) -> list[str]:
    """The node of each part of an attempt, in rank order."""
    return [node for node, _ in parts_of(att)]


def down_since(att: Attempt, down: dict[str, float]) -> float | None:
    """Since when a node of the attempt has been unreachable (``down``: node -> since),
    the earliest; None while every node of it answers."""
    return min((down[n] for n in nodes_of(att) if n in down), default=None)


def gpus_held(attempts: Iterable[Attempt]) -> int:
    """The distinct GPUs the attempts run on, over all their parts: a GPU two of them
    share (co-location) counts once."""
    return len({(node, gpu) for att in attempts for node, gpus in parts_of(att) for gpu in gpus})


def width_of_attempt(att: Attempt) -> int:
    """The GPUs an attempt runs on, over all its parts."""
    return sum(len(gpus) for _, gpus in parts_of(att))
