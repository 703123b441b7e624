"""What an attempt runs: the piece of its job's plan a start falls in (its GPUs, its cap,
when it ends), and what is left of a job that ran before."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session, col, select

from orchestrator.models import Attempt, Job
from orchestrator.policies.base import Decision, QueuedJob


def piece_index(decision: Decision, now_s: float) -> int:
    """The interval of ``decision`` a start at ``now_s`` runs in."""
    for k, (_, b) in enumerate(decision.intervals or ()):
        if b > now_s + 1e-6:
            return k
    return max(0, len(decision.intervals or ()) - 1)


def width_of(view: QueuedJob, decision: Decision, now_s: float) -> int:
    gpus = decision.piece_config(piece_index(decision, now_s))[0]
    return min(gpus, view.gpus) if gpus else view.gpus


def piece_cap_until(
    decision: Decision | None, now_s: float
) -> tuple[float | None, datetime | None]:
    """The cap of the piece a start at ``now_s`` runs in (None: uncapped), and when that
    piece ends if more follow (the job is suspended then)."""
    if decision is None:
        return None, None
    k = piece_index(decision, now_s)
    cap = decision.piece_config(k)[1]
    until = None
    if decision.intervals and k < len(decision.intervals) - 1:
        until = datetime.fromtimestamp(decision.intervals[k][1], UTC)
    return (cap if cap < 1.0 - 1e-9 else None), until


def remaining_run_s(session: Session, job: Job, now: datetime | None = None) -> float:
    """A job's run time left at full speed: from its last progress report with a total,
    else its duration less the time its attempts ran (an attempt still running counts to
    ``now``; a stopped one to when it was stopped)."""
    atts = session.exec(
        select(Attempt).where(Attempt.job_id == job.id).order_by(col(Attempt.number))
    ).all()
    last = atts[-1] if atts else None
    if last is not None and last.progress_total and last.progress_done is not None:
        share = min(1.0, last.progress_done / last.progress_total)
        return max(1.0, job.duration_s * (1.0 - share))
    ran = 0.0
    for a in atts:
        end = a.finished_at or a.stopped_at or (now if a.state == "running" else None)
        if a.started_at and end:
            ran += (end - a.started_at).total_seconds()
    return max(1.0, job.duration_s - ran)
