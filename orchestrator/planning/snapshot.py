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

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.policies.base import Commitment, Decision, Policy, QueuedJob, Snapshot

DEFAULT_RUNNING_S = 3600.0  # a running job without an estimate holds its GPUs this long


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


def model_for(job, curve, duration_s: float | None = None):
    from orchestrator.planning.perfmodel import JobModel

    duration_s = duration_s or job.duration_s
    if not duration_s or job.gpus_max < 1:  # no duration, or no GPU: nothing to model
        return None
    return JobModel(duration_s, job.gpus_max, curve)


def build_snapshot(inp: PlanInputs, largest_node: int) -> Snapshot:
    jobs = []
    left = inp.remaining_s or {}
    for job in inp.queued:
        width = min(job.gpus_max, largest_node)
        duration = left.get(job.id, job.duration_s)
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
                model=model_for(job, inp.curve, duration),
            )
        )
    committed = []
    for job, gpus, started in inp.running:
        model = model_for(job, inp.curve)
        power = model.power_w(gpus) if model else gpus * 350.0
        elapsed = inp.now_s - started.timestamp()
        total = left.get(job.id, job.duration_s)
        left_s = (total - elapsed) if total else DEFAULT_RUNNING_S
        end = inp.now_s + max(left_s, inp.slot_s)
        committed.append(Commitment(job.id, gpus, power, inp.now_s, end))
    snap = Snapshot(inp.now_s, jobs, inp.carbon)
    snap.committed = committed
    snap.total_gpus = inp.total_gpus
    snap.price = inp.price
    snap.budget = inp.budget
    snap.objective = inp.objective
    snap.slot_s = inp.slot_s
    return snap


def plan_rows(policy: Policy, snap: Snapshot, inp: PlanInputs) -> list[dict]:
    plan = policy.plan(snap) if snap.jobs else {}
    names = {j.id: j.name for j in inp.queued}
    rows = []
    for job in snap.jobs:
        d = plan.get(job.id) or Decision(snap.now_s)
        rows.append(_row(job, d, names.get(job.id), snap, inp))
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
    pieces = d.intervals or ((d.start_s, d.end_s),)
    watts = [d.piece_config(i)[2] or 0.0 for i in range(len(pieces))]
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
