"""What ``gridshift plan`` shows: the live queue planned by a policy against the grid
forecast, each job with its planned start, GPUs and power cap, and its expected energy,
carbon and cost, against running it now at full power.

The snapshot is the daemon's: queued jobs (with their performance models), running jobs
as commitments, the cluster's GPUs from the configured nodes, the forecast from the
configured (or given) grid source. Pure apart from the signal: the caller fetches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.planning.backfill import PROMISED_SOURCES
from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.dependencies import plan_with_dependencies
from orchestrator.planning.policies.base import (
    DEFAULT_CHECKPOINT_S,
    Commitment,
    Decision,
    Policy,
    QueuedJob,
    Snapshot,
    not_before,
)

DEFAULT_RUNNING_S = 3600.0  # a running job without an estimate holds its GPUs this long


@dataclass(frozen=True)
class RunEstimate:
    """A job's expected run time at full width and power, and where it came from: its
    ``--duration`` ("duration"), its own progress reports ("progress"), earlier runs of
    its name ("history") or the lab's ``default_duration`` ("default"). The caller looks
    it up (``orchestrator.accounting.estimates``); planning only reads it."""

    run_s: float
    source: str
    note: str  # in words, e.g. "from 3 earlier runs"
    power_w_per_gpu: float | None = None  # measured by earlier runs (calibration)


@dataclass
class PlanInputs:
    now_s: float
    queued: list  # orchestrator.queue.models.Job
    running: list  # (Job, gpu count, started_at)
    total_gpus: int
    curve: object  # PowerCurve
    carbon: object  # StepForecaster
    price: object | None = None
    budget: object | None = None  # BudgetState
    objective: str = "carbon"
    slot_s: float = 900.0
    remaining_s: dict | None = None  # job id -> run time left (after a suspension)
    estimates: dict | None = None  # job id -> RunEstimate (jobs without one: --duration)
    checkpoint_s: float = DEFAULT_CHECKPOINT_S  # run time a suspension costs (daemon setting)
    after: dict | None = None  # job id -> ids of the jobs it waits for (``--after``)
    expected_load: float = 0.0  # recent arrivals' share of the GPUs (``recent_load``)
    widest_gpus: int | None = None  # most GPUs one job may get (SSH servers together)
    # on a cluster of several GPU types: GPUs per type, and each running job's (None: one
    # type; the planner's capacity by type, ``policies.tiers``)
    type_gpus: dict | None = None
    running_types: dict | None = None  # job id -> the type of its GPUs (None: several)


def model_for(job, curve, duration_s: float | None = None, estimate: RunEstimate | None = None):
    """The job's performance model at ``duration_s`` (default: its estimate, else its
    ``--duration``), drawing the power earlier runs measured where the estimate has it."""
    from orchestrator.planning.perfmodel import JobModel

    duration_s = duration_s or (estimate.run_s if estimate else None) or job.duration_s
    if not duration_s or job.gpus_max < 1:  # no duration, or no GPU: nothing to model
        return None
    model = JobModel(duration_s, job.gpus_max, curve)
    measured_w = estimate.power_w_per_gpu if estimate else None
    if measured_w and curve.power_w(1.0) > 0:
        model = model.with_power_scale(measured_w / curve.power_w(1.0))
    return model


def estimate_of(inp: PlanInputs, job) -> RunEstimate | None:
    """The job's run-time estimate: the caller's, else its ``--duration``, else none."""
    found = (inp.estimates or {}).get(job.id)
    if found is not None:
        return found
    if job.duration_s:
        return RunEstimate(job.duration_s, "duration", "from --duration")
    return None


def _checkpoint_s(job, lab_s: float) -> float:
    """The run time a suspension costs the job: its own (``--checkpoint-cost``), else the
    lab's (``daemon.checkpoint_cost``)."""
    own = getattr(job, "checkpoint_s", None)
    return lab_s if own is None else own


def across_servers_width(
    gpus_min: int, gpus_max: int, largest_node: int, most: int | None = None
) -> int:
    """The widest a job is planned: at most one node where it fits one; a job that needs
    more than the largest node runs across servers (whole ones), at most ``most``."""
    if gpus_min <= largest_node:
        return min(gpus_max, largest_node)
    return gpus_max if most is None else max(gpus_min, min(gpus_max, most))


def build_snapshot(inp: PlanInputs, largest_node: int) -> Snapshot:
    from orchestrator.planning.devices.gputypes import type_of  # numpy: not for the CLI

    jobs = []
    left = inp.remaining_s or {}
    for job in inp.queued:
        most = inp.widest_gpus or inp.total_gpus  # what a job across servers can be placed on
        width = across_servers_width(job.gpus_min, job.gpus_max, largest_node, most)
        est = estimate_of(inp, job)
        duration = left.get(job.id, est.run_s if est else None)
        jobs.append(
            QueuedJob(
                id=job.id,
                gpus=width,
                submitted_s=job.submitted_at.timestamp(),
                priority=job.priority,
                duration_s=duration,
                deadline_s=job.deadline.timestamp() if job.deadline else None,
                interruptible=job.interruptible,
                min_gpus=min(job.gpus_min, width),
                max_gpus=width,
                model=model_for(job, inp.curve, duration, est),
                checkpoint_s=_checkpoint_s(job, inp.checkpoint_s),
                run_known=est is None or est.source in PROMISED_SOURCES,
                gpu_type=type_of(job.gpu_type),
            )
        )
    committed = []
    for job, gpus, started in inp.running:
        est = estimate_of(inp, job)
        model = model_for(job, inp.curve, None, est)
        power = model.power_w(gpus) if model else gpus * 350.0
        elapsed = inp.now_s - started.timestamp()
        if job.id in left:
            left_s = left[job.id]
        elif est is not None:
            left_s = est.run_s - elapsed
        else:
            left_s = DEFAULT_RUNNING_S
        end = inp.now_s + max(left_s, inp.slot_s)
        on = (inp.running_types or {}).get(job.id)
        committed.append(Commitment(job.id, gpus, power, inp.now_s, end, on))
    snap = Snapshot(inp.now_s, jobs, inp.carbon)
    snap.committed = committed
    snap.total_gpus = inp.total_gpus
    snap.type_gpus = inp.type_gpus
    snap.price = inp.price
    snap.budget = inp.budget
    snap.objective = inp.objective
    snap.slot_s = inp.slot_s
    snap.expected_load = inp.expected_load
    return snap


def plan_rows(policy: Policy, snap: Snapshot, inp: PlanInputs) -> list[dict]:
    after = inp.after or {}
    running_end_s = {c.id: c.end_s for c in snap.committed}
    snap, plan = plan_with_dependencies(policy, snap, after, running_end_s)
    by_id = {j.id: j for j in inp.queued}
    holding = set(by_id) | set(running_end_s)
    rows = []
    for job in snap.jobs:
        d = plan.get(job.id) or not_before(Decision(snap.now_s), job.earliest_s)
        row = _row(job, d, by_id[job.id].name, snap, inp)
        row["after"] = sorted(a for a in after.get(job.id, ()) if a in holding) or None
        est = estimate_of(inp, by_id[job.id])
        row["estimate_s"] = est.run_s if est else None
        row["estimate_source"] = est.source if est else None
        row["estimate_note"] = est.note if est else None
        rows.append(row)
    return rows


def _row(job: QueuedJob, d: Decision, name, snap: Snapshot, inp: PlanInputs) -> dict:
    now = snap.now_s
    known = job.model is not None
    out = {
        "id": job.id,
        "name": name,
        "start": _iso(d.start_s),
        "wait_h": round((d.start_s - now) / 3600, 3),
        "gpus": d.gpus or job.gpus,
        "cap": round(d.cap, 3),
        "cap_w": round(d.cap * inp.curve.max_limit_w, 1),
        "end": _iso(d.end_s) if d.end_s else None,
        "intervals": [[_iso(a), _iso(b)] for a, b in d.intervals] if d.intervals else None,
        "forced": d.forced,
        "estimated": known,
        "energy_kwh": None,
        "carbon_kg": None,
        "cost": None,
        "now_full_power": None,
        "carbon_saving_pct": None,
    }
    if not known:
        return out
    # a policy that plans starts only (fifo, lowest-window) leaves the end to the run:
    # its duration at the width and power it asked for, full by default
    end_s = d.end_s if d.end_s is not None else d.start_s + job.duration_s
    pieces = d.intervals or ((d.start_s, end_s),)
    watts = []
    for i in range(len(pieces)):  # a policy that gave no draw: the model's at its config
        gpus, cap, power_w = d.piece_config(i)
        watts.append(power_w or job.model.power_w(gpus or job.gpus, cap))
    planned = _account(pieces, watts, inp)
    full_w = job.model.power_w(job.gpus, 1.0)
    now_run = _account(((now, now + job.duration_s),), [full_w], inp)
    out.update(planned)
    out["now_full_power"] = now_run
    if now_run["carbon_kg"]:
        saving = 1 - planned["carbon_kg"] / now_run["carbon_kg"]
        out["carbon_saving_pct"] = round(100 * saving, 1)
    return out


def _account(pieces, watts, inp: PlanInputs) -> dict:
    import numpy as np  # here: the CLI's show and submit read this module, never this

    starts, ends = np.array(pieces, dtype=float).T
    watts = np.asarray(watts, dtype=float)

    def joules_times(forecast) -> float:  # Σ watts × ∫ signal over each piece
        series = forecast.window(inp.now_s, inp.now_s, float(ends[-1]))
        return float(np.dot(watts, series.integral(starts, ends)))

    energy_j = float(np.dot(watts, ends - starts))
    grams = joules_times(inp.carbon)
    cost = None
    if inp.price is not None:
        cost = round(joules_times(inp.price) / (J_PER_KWH * 1000), 4)
    return {
        "energy_kwh": round(energy_j / J_PER_KWH, 4),
        "carbon_kg": round(grams / J_PER_KWH / 1000, 5),
        "cost": cost,
    }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()
