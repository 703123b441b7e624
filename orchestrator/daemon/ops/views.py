"""Jobs as JSON objects with stable keys, and what one user may see of another's jobs."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

JOB_KEYS = (
    "id",
    "name",
    "state",
    "reason",
    "user",
    "gpus",
    "gpus_min",
    "gpus_max",
    "gpu_ids",
    "node",
    "command",
    "workdir",
    "priority",
    "labels",
    "after",
    "interruptible",
    "duration_s",
    "checkpoint_s",
    "deadline",
    "submitted_at",
    "started_at",
    "finished_at",
    "exit_code",
    "energy_kwh",
    "energy_modelled",
    "carbon_g",
    "cost",
    "attempts",
    "cancel_requested",
    "log_path",
    "progress",
    "progress_source",
    "planned_start",
    "plan_note",
    "cron_id",
)


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def progress_of(
    job, report: tuple[float | None, float | None] | None, now: datetime
) -> tuple[float | None, str | None]:
    """Fraction done: the job's own report (done / total) where it made one, else an
    estimate from elapsed time over the declared duration while it runs."""
    if job.state == "completed":
        return 1.0, "completed"
    if report and report[0] is not None and report[1]:
        return min(1.0, report[0] / report[1]), "reported"
    if job.state == "running" and job.started_at and job.duration_s:
        elapsed = (now - job.started_at).total_seconds()
        return min(0.99, max(0.0, elapsed / job.duration_s)), "estimated"
    return None, None


def job_dict(job, after: list[int], log_path: str, report=None, now=None) -> dict[str, Any]:
    """A job as JSON. ``gpus`` is the number it holds (or held) once placed, else the
    most it asks for. The environment is never shown: it may hold secrets."""
    from datetime import UTC

    progress, source = progress_of(job, report, now or datetime.now(UTC))
    data = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "user": job.user,
        "gpus": len(job.gpu_ids) if job.node else job.gpus_max,
        "gpus_min": job.gpus_min,
        "gpus_max": job.gpus_max,
        "gpu_ids": list(job.gpu_ids),
        "node": job.node,
        "command": list(job.command),
        "workdir": job.workdir,
        "priority": job.priority,
        "labels": list(job.labels),
        "after": sorted(after),
        "interruptible": job.interruptible,
        "duration_s": job.duration_s,
        "checkpoint_s": job.checkpoint_s,
        "deadline": iso(job.deadline),
        "submitted_at": iso(job.submitted_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "exit_code": job.exit_code,
        "energy_kwh": None if job.energy_j is None else job.energy_j / 3.6e6,
        "energy_modelled": job.energy_modelled,
        "carbon_g": job.carbon_g,
        "cost": job.cost,
        "attempts": job.attempts,
        "cancel_requested": job.cancel_requested_at is not None,
        "log_path": log_path,
        "progress": None if progress is None else round(progress, 4),
        "progress_source": source,
        "planned_start": iso(job.planned_start) if job.state == "queued" else None,
        "plan_note": job.plan_note if job.state in ("queued", "suspended") else None,
        "cron_id": job.cron_id,
    }
    assert tuple(data) == JOB_KEYS
    return data


#: What anyone in the group sees of another user's job (as ``squeue`` shows): its id, name,
#: user, state, GPUs and times. Its command shows only the program's name: the arguments
#: often name private paths, data sets or tokens. Its working directory, labels and log
#: are left out (None, []). Its environment is never shown to anyone.
PRIVATE = {"workdir": None, "labels": [], "log_path": None}


def public_view(data: dict[str, Any]) -> dict[str, Any]:
    """``job_dict`` as another user sees it: the same keys, private values left out."""
    command = data["command"]
    program = [os.path.basename(command[0])] if command else []
    return {**data, **PRIVATE, "command": program}
