"""Changes to jobs already queued, each one transaction, all or none: ``hold`` and
``release`` (a held job is never planned or started), ``edit`` (a queued or held job's
priority, deadline, run time, GPUs, GPU type or name) and ``restart`` (a finished job
queued again as a new job with the same spec). Each job must be the user's (root may
change any)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from orchestrator.errors import PlacementError, SpecError, UserError
from orchestrator.queue.checks import too_wide
from orchestrator.queue.db import Database
from orchestrator.queue.models import Job
from orchestrator.queue.ownership import User, check_may_change
from orchestrator.queue.spec import JobSpec, build_spec
from orchestrator.queue.states import FINAL, WAITING, JobState, transition
from orchestrator.queue.store import dependencies, get_job, insert_jobs

#: The fields ``edit`` changes, as ``submit`` (and a sweep file) names them.
EDITABLE = ("priority", "deadline", "within", "duration", "gpus", "gpu_type", "name")
#: A check of a spec beyond ``build_spec``'s (the daemon's: its GPU type and its width in
#: that type's GPUs, as ``submit`` checks them); raises SpecError.
SpecCheck = Callable[[JobSpec], None]
#: What ``restart`` copies: a job that ended this way may be queued again.
RESTARTABLE = FINAL | {JobState.LOST}
#: A dependency that ended so fails its dependants.
BAD_END = (JobState.FAILED, JobState.CANCELLED, JobState.LOST)


def _jobs(
    session: Session, job_ids: list[int], user: User, states=None, only: str = ""
) -> list[Job]:
    """The jobs, locked, each one ``user`` may change and (``states``) in one of those
    states, else one line for the first that is not: ``job N is S: only {only}``."""
    if not job_ids:
        raise SpecError("give at least one job id")
    jobs = [get_job(session, i, lock=True) for i in dict.fromkeys(job_ids)]
    for job in jobs:
        check_may_change(job, user)
    for job in jobs:
        if states is not None and job.state not in states:
            raise UserError(f"job {job.id} is {job.state}: only {only}")
    return jobs


def hold(db: Database, job_ids: list[int], *, user: User, now: datetime) -> list[tuple[int, str]]:
    """queued → held; a held job stays held. Any other state refuses them all."""

    def _hold(session: Session) -> list[tuple[int, str]]:
        only = "a queued job can be held (cancel stops a started one)"
        jobs = _jobs(session, job_ids, user, WAITING, only)
        out = []
        for job in jobs:
            if job.state == JobState.HELD:
                out.append((job.id, "already held"))
                continue
            transition(session, job, JobState.HELD, at=now, reason=f"held by {user.name}",
                       actor=user.name)  # fmt: skip
            job.planned_start, job.plan_note = None, None
            out.append((job.id, "held"))
        return out

    return db.write_retrying(_hold)


def release(
    db: Database, job_ids: list[int], *, user: User, now: datetime
) -> list[tuple[int, str]]:
    """held → queued: planned again at the daemon's next pass."""

    def _release(session: Session) -> list[tuple[int, str]]:
        jobs = _jobs(session, job_ids, user)
        for job in jobs:
            if job.state != JobState.HELD:
                raise UserError(f"job {job.id} is not held (it is {job.state})")
        for job in jobs:
            transition(session, job, JobState.QUEUED, at=now,
                       reason=f"released by {user.name}", actor=user.name)  # fmt: skip
        return [(job.id, "released") for job in jobs]

    return db.write_retrying(_release)


def edit(
    db: Database,
    job_id: int,
    changes: dict[str, Any],
    *,
    user: User,
    now: datetime,
    largest_node_gpus: int | None,
    check: SpecCheck | None = None,
) -> dict[str, Any]:
    """Change a queued or held job's fields, checked as ``submit`` checks them (one
    SpecError, nothing written; ``check``: the daemon's further check). Returns the fields
    as they are now."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise SpecError(f"cannot edit {', '.join(sorted(unknown))}: only {', '.join(EDITABLE)}")
    given = {k: v for k, v in changes.items() if v is not None}
    if not given:
        raise SpecError("nothing to change: give --priority, --deadline, --within, --duration, "
                        "--gpus, --gpu-type or --name")  # fmt: skip

    def _edit(session: Session) -> dict[str, Any]:
        (job,) = _jobs(session, [job_id], user, WAITING, "a queued or held job can be edited")
        spec = _checked(job, given, now)
        if "gpus" in given or "gpu_type" in given:  # the width in that type's GPUs
            if (why := too_wide(spec.gpus_min, largest_node_gpus)) is not None:
                raise SpecError(why)
            if check is not None:
                check(spec)
        said = []
        if "name" in given:
            job.name = spec.name
            said.append("name")
        if "priority" in given:
            job.priority = spec.priority
            said.append("priority")
        if "duration" in given:
            job.duration_s = spec.duration_s
            said.append("duration")
        if "gpus" in given:
            job.gpus_min, job.gpus_max = spec.gpus_min, spec.gpus_max
            said.append("gpus")
        if "gpu_type" in given:
            job.gpu_type = spec.gpu_type
            said.append("gpu type")
        if "deadline" in given or "within" in given:
            job.deadline = spec.deadline
            said.append("deadline")
        job.planned_start, job.plan_note = None, None  # planned again at the next pass
        session.add(job)
        from orchestrator.queue.models import Event

        session.add(Event(job_id=job.id, at=now, from_state=job.state, to_state=job.state,
                          reason=f"edited by {user.name}: {', '.join(said)}",
                          actor=user.name))  # fmt: skip
        return _fields(job)

    return db.write_retrying(_edit)


def _checked(job: Job, given: dict[str, Any], now: datetime) -> JobSpec:
    """The job's spec with ``given`` applied, through ``submit``'s checks. A deadline not
    changed is checked against a new run time only while it is ahead."""
    raw: dict[str, Any] = {"command": job.command, "workdir": job.workdir}
    raw |= {k: given[k] for k in ("priority", "name") if k in given}
    raw["gpus"] = given.get("gpus", f"{job.gpus_min}-{job.gpus_max}")
    raw["gpu_type"] = given.get("gpu_type", job.gpu_type)  # "": any type
    raw["duration"] = given.get("duration", job.duration_s)
    if "deadline" in given or "within" in given:
        raw |= {k: given[k] for k in ("deadline", "within") if k in given}
    elif job.deadline is not None and job.deadline > now and "duration" in given:
        raw["deadline"] = job.deadline.isoformat()
    return build_spec(raw, now=now, cwd=job.workdir, base_env={}, check_workdir=False)


def _fields(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "name": job.name,
        "priority": job.priority,
        "duration_s": job.duration_s,
        "deadline": job.deadline.isoformat() if job.deadline else None,
        "gpus_min": job.gpus_min,
        "gpus_max": job.gpus_max,
        "gpu_type": job.gpu_type,
    }


def restart(
    db: Database,
    job_ids: list[int],
    *,
    user: User,
    now: datetime,
    largest_node_gpus: int | None = None,
    check: SpecCheck | None = None,
) -> list[tuple[int, int, str | None]]:
    """Queue each finished job again as a new job of its owner's, with its spec (its
    deadline as far after the new submission as it was after the old one), checked as
    ``submit`` checks it (the largest node, a deadline the run time fits, ``check``). It waits on
    what the old job waited on; on a job restarted with it, on that one's new copy; a
    dependency that failed, was cancelled or lost and is not restarted with it refuses
    all; one ``clean`` removed cannot be waited on: the note says so. Returns (old id,
    new id, note or None), in the order given."""
    from orchestrator.queue.retention import dropped_waits

    def _restart(session: Session) -> list[tuple[int, int, str | None]]:
        only = "a finished job (completed, failed, cancelled or lost) can be restarted"
        jobs = _jobs(session, job_ids, user, RESTARTABLE, only)
        after = dependencies(session, [j.id for j in jobs])
        copies: dict[int, int] = {}
        notes: dict[int, str | None] = {}
        for job in sorted(jobs, key=lambda j: j.id):  # a dependency's id is the smaller
            waits = []
            for dep in sorted(after[job.id]):
                if dep in copies:
                    waits.append(copies[dep])
                    continue
                state = get_job(session, dep).state
                if state in BAD_END:
                    raise UserError(
                        f"job {job.id} waits on job {dep}, which is {state}: restart them "
                        f"together (gridshift restart {dep} {job.id})"
                    )
                waits.append(dep)
            spec = _spec_of(job, waits, now, largest_node_gpus, check)
            owner = User(name=job.user, uid=job.uid)
            (new,) = insert_jobs(session, [spec], user=owner, now=now,
                                 reason=f"restart of job {job.id} by {user.name}",
                                 actor=user.name)  # fmt: skip
            copies[job.id] = new.id
            gone = dropped_waits(session, job.id)
            notes[job.id] = (
                f"not waiting on job {', '.join(map(str, gone))}, which clean removed"
                if gone
                else None
            )
        return [(job.id, copies[job.id], notes[job.id]) for job in jobs]

    return db.write_retrying(_restart)


def _spec_of(
    job: Job, after: list[int], now: datetime, largest_node_gpus: int | None, check=None
) -> JobSpec:
    """The job's spec for a new submission now, through ``submit``'s checks (its
    messages, after the job's id)."""
    raw: dict[str, Any] = {
        "command": list(job.command),
        "workdir": job.workdir,
        "gpus": f"{job.gpus_min}-{job.gpus_max}",
        "duration": job.duration_s,
        "interruptible": job.interruptible,
        "priority": job.priority,
        "after": sorted(after),
        "labels": list(job.labels),
        "name": job.name,
        "gpu_type": job.gpu_type,
    }
    if job.checkpoint_s is not None:
        raw["checkpoint_cost"] = job.checkpoint_s
    if job.deadline is not None:
        raw["within"] = max(job.deadline - job.submitted_at, timedelta(0)).total_seconds()
    try:
        spec = build_spec(raw, now=now, cwd=job.workdir, base_env=dict(job.env),
                          check_workdir=False)  # fmt: skip
    except SpecError as exc:
        raise SpecError(f"job {job.id}: {exc}") from None
    if (why := too_wide(spec.gpus_min, largest_node_gpus)) is not None:
        raise PlacementError(f"job {job.id}: {why}")
    try:
        if check is not None:
            check(spec)
    except SpecError as exc:
        raise SpecError(f"job {job.id}: {exc}") from None
    return spec
