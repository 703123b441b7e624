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
    "gpu_type",
    "node",
    "command",
    "workdir",
    "priority",
    "labels",
    "after",
    "interruptible",
    "share",
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
    "wait_reason",
    "waits_for",
    "runtime_s",
)
#: Why a waiting job waits (``wait_reason``), from the most to the least binding.
WAIT_REASONS = (
    "held", "dependency", "capacity", "power", "wake", "low carbon", "budget", "fallback", "due",
    "planned",
)  # fmt: skip


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


def job_dict(
    job, after: list[int], log_path: str, report=None, now=None, *,
    waits_for: list[int] | None = None, runtime_s: float | None = None, budgeted: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """A job as JSON. ``gpus`` is the number it holds (or held) once placed, else the
    most it asks for (a queued job, requeued or not). ``waits_for``: its dependencies not
    completed yet; ``runtime_s``: its attempts' run time, suspensions left out. The
    environment is never shown: it may hold secrets."""
    from datetime import UTC

    progress, source = progress_of(job, report, now or datetime.now(UTC))
    placed = job.node and job.state != "queued"
    waits_for = list(waits_for or []) if job.state == "queued" else []
    data = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "user": job.user,
        "gpus": len(job.gpu_ids) if placed else job.gpus_max,
        "gpus_min": job.gpus_min,
        "gpus_max": job.gpus_max,
        "gpu_ids": list(job.gpu_ids),
        "gpu_type": job.gpu_type,
        "node": job.node,
        "command": list(job.command),
        "workdir": job.workdir,
        "priority": job.priority,
        "labels": list(job.labels),
        "after": sorted(after),
        "interruptible": job.interruptible,
        "share": bool(job.share),
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
        "wait_reason": wait_reason(job, waits_for, budgeted),
        "waits_for": waits_for,
        "runtime_s": None if runtime_s is None else round(runtime_s, 1),
    }
    assert tuple(data) == JOB_KEYS
    return data


def wait_reason(job, waits_for: list[int], budgeted: bool = False) -> str | None:
    """Why a queued (or suspended) job waits, one of ``WAIT_REASONS``, from its state,
    its dependencies and the daemon's note (``daemon.guard.note_plans``); None: it does
    not wait, or no daemon has planned it yet."""
    if job.state == "held" or getattr(job, "held", False):  # hook for hold/release
        return "held"
    if job.state not in ("queued", "suspended"):
        return None
    if waits_for:
        return "dependency"
    note = job.plan_note or ""
    if note.startswith("due; waiting for ") and " to wake: " in note:  # Levers.wake_notes
        return "wake"  # first: a server may be named "GPUs" or "power"
    if note.startswith("due; waiting for GPUs"):
        return "capacity"
    if note.startswith("due; waiting for power"):
        return "power"
    if note.startswith("waiting for lower carbon"):
        return "low carbon"
    if " fallback: " in note:
        return "fallback"
    if note.startswith(("starts now", "due now")):
        return "due"
    if note.startswith("planned for") and budgeted and " by budget" in note:
        return "budget"
    return "planned" if job.planned_start is not None and job.state == "queued" else None


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
