"""Queue operations on the database: submit, look up, list, cancel. Each public function
is one transaction; a failure writes nothing."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, func, select

from orchestrator.errors import NotFoundError, PlacementError, SpecError
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.checks import spec_label, too_wide
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Dependency, Event, Job
from orchestrator.queue.ownership import User, check_may_change
from orchestrator.queue.spec import JobSpec
from orchestrator.queue.states import FINAL, JobState, transition


def submit(
    db: Database,
    specs: list[JobSpec],
    *,
    user: User,
    now: datetime,
    largest_node_gpus: int | None,
    labels: list[str] | None = None,
) -> list[Job]:
    """Queue ``specs`` in one transaction, all or nothing. ``largest_node_gpus`` None: not
    known yet (a server never asked), so the daemon checks it. ``labels``: what a refusal
    calls each spec (``file:line: ``; default ``job N: `` where there are several)."""
    for i, spec in enumerate(specs):
        if (why := too_wide(spec.gpus_min, largest_node_gpus)) is not None:
            raise PlacementError(f"{spec_label(specs, i, labels)}{why}")

    return db.write_retrying(lambda session: insert_jobs(session, specs, user=user, now=now))


def insert_jobs(
    session: Session,
    specs: list[JobSpec],
    *,
    user: User,
    now: datetime,
    cron_id: int | None = None,
    reason: str | None = None,
    actor: str | None = None,
) -> list[Job]:
    """Queue ``specs`` in the caller's transaction (``reason``: the first event's, if not
    "submitted"; ``actor``: who queued them, if not ``user``)."""
    wanted = {a for spec in specs for a in spec.after}
    if wanted:
        found = set(session.exec(select(Job.id).where(col(Job.id).in_(wanted))).all())
        missing = sorted(wanted - found)
        if missing:
            raise NotFoundError(f"--after: no job {', '.join(map(str, missing))}")
    jobs = []
    for spec in specs:
        job = Job(
            name=spec.name,
            state=JobState.QUEUED.value,
            user=user.name,
            uid=user.uid,
            command=spec.command,
            workdir=spec.workdir,
            env=spec.env,
            gpus_min=spec.gpus_min,
            gpus_max=spec.gpus_max,
            duration_s=spec.duration_s,
            deadline=spec.deadline,
            interruptible=spec.interruptible,
            share=spec.share,
            checkpoint_s=spec.checkpoint_s,
            priority=spec.priority,
            labels=spec.labels,
            submitted_at=now,
            cron_id=cron_id,
            gpu_type=spec.gpu_type,
        )
        session.add(job)
        jobs.append(job)
    session.flush()  # assigns ids
    for spec, job in zip(specs, jobs, strict=True):
        for after_id in sorted(set(spec.after)):
            session.add(Dependency(job_id=job.id, after_id=after_id))
        session.add(
            Event(
                job_id=job.id,
                at=now,
                from_state=None,
                to_state=JobState.QUEUED.value,
                reason=reason
                or ("submitted" if cron_id is None else f"queued by cron template {cron_id}"),
                actor=actor or user.name,
            )
        )
    return jobs


def get_job(session: Session, job_id: int, *, lock: bool = False) -> Job:
    query = select(Job).where(Job.id == job_id)
    if lock:
        query = query.with_for_update()
    job = session.exec(query).first()
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    return job


def list_jobs(session: Session, *, include_finished: bool) -> list[Job]:
    query = select(Job).order_by(col(Job.id))
    if not include_finished:
        query = query.where(col(Job.state).not_in([s.value for s in FINAL]))
    return list(session.exec(query).all())


def count_finished(session: Session) -> int:
    from sqlalchemy import func

    query = (
        select(func.count()).select_from(Job).where(col(Job.state).in_([s.value for s in FINAL]))
    )
    return int(session.exec(query).one())


def dependencies(session: Session, job_ids: list[int]) -> dict[int, list[int]]:
    deps: dict[int, list[int]] = {i: [] for i in job_ids}
    if job_ids:
        rows = session.exec(select(Dependency).where(col(Dependency.job_id).in_(job_ids)))
        for row in rows:
            deps[row.job_id].append(row.after_id)
    return deps


def events(session: Session, job_id: int) -> list[Event]:
    return list(
        session.exec(select(Event).where(Event.job_id == job_id).order_by(col(Event.id))).all()
    )


def cancel(db: Database, job_ids: list[int], *, user: User, now: datetime) -> list[tuple[int, str]]:
    """Cancel jobs, all or none. Returns (id, what happened) per job. A job that has not
    started is cancelled at once; a starting or running one is marked, and the daemon
    stops it (SIGTERM, then SIGKILL after the grace period) and records it cancelled."""
    if not job_ids:
        raise SpecError("give at least one job id")

    def _cancel(session: Session) -> list[tuple[int, str]]:
        jobs = [get_job(session, i, lock=True) for i in dict.fromkeys(job_ids)]
        for job in jobs:
            check_may_change(job, user)
        outcome = []
        for job in jobs:
            state = JobState(job.state)
            if state in FINAL:
                outcome.append((job.id, f"already {state}"))
            elif state in (JobState.PLANNED, JobState.RUNNING) or _holds_gpus(session, job):
                if job.cancel_requested_at is None:
                    job.cancel_requested_at = now
                    session.add(job)
                outcome.append((job.id, "stopping"))
            else:
                transition(
                    session,
                    job,
                    JobState.CANCELLED,
                    at=now,
                    reason=f"cancelled by {user.name}",
                    actor=user.name,
                )
                outcome.append((job.id, "cancelled"))
        return outcome

    return db.write_retrying(_cancel)


def attempts(session: Session, job_id: int) -> list[Attempt]:
    return list(
        session.exec(
            select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
        ).all()
    )


def latest_progress(session: Session, job_ids: list[int]) -> dict[int, tuple]:
    """The progress report of each job's latest attempt: (done, total)."""
    if not job_ids:
        return {}
    rows = session.exec(
        select(Attempt).where(col(Attempt.job_id).in_(job_ids)).order_by(col(Attempt.number))
    ).all()
    return {a.job_id: (a.progress_done, a.progress_total) for a in rows}


def submitted_since(session: Session, since: datetime) -> tuple[list[tuple], datetime | None]:
    """The jobs submitted since ``since``, whatever became of them, as (id, gpus_max,
    duration_s, started_at, finished_at), and the queue's first submission (the recent
    load the planners pace budgets and GPUs against: ``Snapshot.expected_load``)."""
    rows = session.exec(
        select(Job.id, Job.gpus_max, Job.duration_s, Job.started_at, Job.finished_at)
        .where(col(Job.submitted_at) >= since)
        .order_by(col(Job.id))
    ).all()
    first = session.exec(select(func.min(Job.submitted_at))).one()
    return [tuple(r) for r in rows], first


def _holds_gpus(session: Session, job: Job) -> bool:
    """A job suspended with SIGSTOP still has a process: the daemon stops it."""
    return (
        session.exec(
            select(Attempt.id)
            .where(Attempt.job_id == job.id)
            .where(Attempt.state == AttemptState.STOPPED)
        ).first()
        is not None
    )
