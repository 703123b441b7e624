"""What the daemon will do with a job, said at submit time and in ``show``: how long it
is expected to run and where that came from (``accounting.estimates``), and until when
it may wait for low carbon."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orchestrator.planning.policies.base import DEFAULT_MAX_DEFER_S
from orchestrator.queue.states import JobState

UNFINISHED = (
    JobState.QUEUED,
    JobState.HELD,
    JobState.PLANNED,
    JobState.RUNNING,
    JobState.SUSPENDED,
)


def defers(settings) -> bool:
    """Whether the daemon these settings describe plans jobs in time (a grid signal and
    a policy other than ``fifo``), as ``daemon.planner.build_live`` decides."""
    cfg = settings.daemon
    grid = cfg.grid or settings.grid.source
    return bool(grid) and (cfg.policy or "budget") != "fifo"


def outlooks(session, settings, jobs: list, now: datetime) -> dict[int, dict[str, Any]]:
    """For each new job: its estimate, and the latest time it may start
    (``may_wait_until``; None: it starts as soon as GPUs are free), and the one line."""
    from orchestrator.accounting.estimates import describe, estimates
    from orchestrator.daemon.ops.wakeoutlook import servers, wake_wait
    from orchestrator.planning.devices.typenames import type_of
    from orchestrator.timeparse import format_time

    known = estimates(session, jobs, settings.daemon.seconds("default_duration"), now)
    plans = defers(settings)
    cluster = servers(session, settings)  # none: right-sizing powers no server
    out = {}
    for job in jobs:
        est = known[job.id]
        until = _latest_start(job, est.run_s, now) if plans else None
        wake = wake_wait(job.gpus_min, type_of(job.gpu_type), cluster, now) if cluster else None
        if not plans:
            when = "starts when GPUs are free (the daemon plans with no grid signal)"
        elif until is None:
            asked = job.deadline == job.submitted_at
            when = "starts now" + (" (--now)" if asked else ": its deadline leaves no time to wait")
        else:
            when = f"may wait until {format_time(until)} for low carbon"
        if wake is not None:
            when = _waking(when, wake, until is not None)
        if job.share:
            when += _sharing_note(job, settings)
        out[job.id] = {
            "estimate_s": round(est.run_s, 1),
            "estimate_source": est.source,
            "may_wait_until": until.isoformat() if until else None,
            # right-sizing: the servers it waits for (nodes, power_state, wake_s), or None
            "wake": None if wake is None else {k: wake[k] for k in WAKE_KEYS},
            "outlook": f"{when}; {describe(est)}",
        }
    return out


WAKE_KEYS = ("nodes", "power_state", "wake_s")


def _sharing_note(job, settings) -> str:
    """Why a ``--share`` job will run alone all the same, where it will (else nothing):
    the sharing rule (``daemon.energy.sharing``) pairs one-GPU jobs on servers whose
    ``[[nodes]]`` table says ``share``, never on a Slurm node."""
    if (job.gpus_max or job.gpus_min) != 1:
        return "; runs alone all the same: only one-GPU jobs share a GPU"
    if not any(c.share != "never" and c.executor != "slurm" for c in settings.nodes):
        return "; runs alone all the same: no server here shares GPUs (a [[nodes]] table's share)"
    return ""


def _waking(when: str, wake: dict, defers: bool) -> str:
    """The outlook of a job that waits for a server to wake (``wakeoutlook``)."""
    if "failed" in wake:
        return (f"{when}, then waits for " if defers else "waits for ") + wake["failed"]
    if defers:  # right-sizing wakes it ahead of the job's planned start
        return f"{when}; right-sizing wakes {wake['names']} for it{wake['span']}"
    return f"starts once {wake['names']} wakes{wake['span']}"


def estimate_keys(session, settings, job) -> dict[str, Any]:
    """``show``'s keys: the estimate planned with, for a job that has not finished."""
    from orchestrator.accounting.estimates import describe, estimates
    from orchestrator.timeparse import utc_now

    if job.state not in UNFINISHED:
        return {"estimate_s": None, "estimate_source": None, "estimate": None}
    default_s = settings.daemon.seconds("default_duration")
    est = estimates(session, [job], default_s, utc_now())[job.id]
    return {
        "estimate_s": round(est.run_s, 1),
        "estimate_source": est.source,
        "estimate": describe(est),
    }


def _latest_start(job, run_s: float, now: datetime) -> datetime | None:
    """Its latest start at full power (the planner's bound); None: now."""
    if job.deadline is not None:
        latest = job.deadline - timedelta(seconds=run_s)
    else:
        latest = job.submitted_at + timedelta(seconds=DEFAULT_MAX_DEFER_S)
    return latest if latest > now else None
