"""The job state machine: the only place that changes a job's state.

    queued → planned → running → completed | failed
    running → suspended → queued         (--suspend signal: it checkpointed and exited)
    running → suspended → running        (--suspend stop: SIGSTOP, then SIGCONT)
    running → lost → queued (retry)
    queued → held → queued               (``gridshift hold`` / ``release``)
    any non-final state → cancelled

Also allowed, each for a stated reason: queued → failed (a dependency failed, or no node
could ever hold the job), planned → queued (a launch that a crash interrupted before the
job started), planned → failed (the launch itself failed), planned → lost (handed to a
batch scheduler that no longer knows it: it may have run, so it is not requeued),
suspended → completed | failed | lost (a stopped job's process ended while stopped, e.g.
killed). An illegal transition raises
``StateError``. Every transition adds one row to the events table, in the caller's
transaction, so the state change and its event commit together or not at all.
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlmodel import Session

from orchestrator.errors import StateError
from orchestrator.queue.models import Event, Job


class JobState(enum.StrEnum):
    QUEUED = "queued"
    HELD = "held"  # queued, but never planned or started until released
    PLANNED = "planned"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
#: States in which a job holds or may soon hold GPUs.
ACTIVE = frozenset({JobState.PLANNED, JobState.RUNNING})
#: States that keep the daemon busy (``--until-idle`` waits for none to remain).
PENDING = frozenset({JobState.QUEUED, JobState.PLANNED, JobState.RUNNING, JobState.SUSPENDED})
#: States whose job may be edited, held or released: not started, not handed over.
WAITING = frozenset({JobState.QUEUED, JobState.HELD})

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset(
        {JobState.PLANNED, JobState.HELD, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.HELD: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.PLANNED: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.LOST, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.COMPLETED, JobState.FAILED, JobState.SUSPENDED, JobState.LOST, JobState.CANCELLED}
    ),
    JobState.SUSPENDED: frozenset(
        {
            JobState.QUEUED,
            JobState.RUNNING,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.LOST,
            JobState.CANCELLED,
        }
    ),
    JobState.LOST: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in ALLOWED[src]


def transition(
    session: Session,
    job: Job,
    to: JobState,
    *,
    at: datetime,
    reason: str | None = None,
    actor: str | None = None,
) -> Event:
    """Move ``job`` to ``to`` and record the event; the caller commits."""
    src = JobState(job.state)
    if not can_transition(src, to):
        raise StateError(f"job {job.id}: illegal transition {src} → {to}")
    job.state = to.value
    job.reason = reason
    if to in FINAL and job.finished_at is None:
        job.finished_at = at
    event = Event(
        job_id=job.id, at=at, from_state=src.value, to_state=to.value, reason=reason, actor=actor
    )
    session.add(job)
    session.add(event)
    return event


def fail_unreadable(session: Session, job_id: int, at: datetime, reason: str) -> None:
    """Fail a queued job whose row cannot be loaded (a column not of its type), without
    loading it: its state, reason and end time, and the event; the caller commits."""
    from sqlalchemy import update

    done = session.exec(
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED.value)
        .values(state=JobState.FAILED.value, reason=reason, finished_at=at)
    )
    if done.rowcount:
        session.add(
            Event(
                job_id=job_id,
                at=at,
                from_state=JobState.QUEUED.value,
                to_state=JobState.FAILED.value,
                reason=reason,
                actor="daemon",
            )
        )
