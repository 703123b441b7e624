"""Metrics of a what-if run, from the jobs' times and the executor's power segments.

Carbon is the integral of power × intensity over every stretch a job ran (not one value
at its start); cost likewise with the price signal. Energy is the jobs' facility energy
(GPUs at their modelled draw, the host's share, × PUE).
"""

from __future__ import annotations

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.sim.inputs import SimInputs
from orchestrator.sim.result import RunResult


def metrics(inputs: SimInputs, run: RunResult) -> dict:
    jobs = inputs.jobs
    t0, t1, p = run.seg_start_s, run.seg_end_s, run.seg_power_w
    energy_j = float(np.sum(p * (t1 - t0)))
    carbon_g = float(np.sum(p * inputs.carbon.integral(t0, t1))) / J_PER_KWH
    cost = None
    if inputs.price is not None:
        cost = float(np.sum(p * inputs.price.integral(t0, t1))) / (J_PER_KWH * 1000)
    jct_h = (run.finish_s - jobs.submit_s) / 3600
    wait_h = (run.first_start_s - jobs.submit_s) / 3600
    has_deadline = ~np.isnan(inputs.deadline_s)
    misses = int(np.sum(run.finish_s[has_deadline] > inputs.deadline_s[has_deadline] + 1.0))
    first = float(jobs.submit_s.min())
    makespan_s = float(run.finish_s.max()) - first
    busy = float(np.sum(run.seg_gpus * (t1 - t0)))
    beyond = np.clip(t1, inputs.carbon_end_s, None) - np.clip(t0, inputs.carbon_end_s, None)
    out = {
        "carbon_kg": round(carbon_g / 1000, 3),
        "energy_kwh": round(energy_j / J_PER_KWH, 3),
        "cost": None if cost is None else round(cost, 2),
        "avg_jct_h": round(float(jct_h.mean()), 3),
        "p50_jct_h": round(float(np.median(jct_h)), 3),
        "p95_jct_h": round(float(np.percentile(jct_h, 95)), 3),
        "avg_wait_h": round(float(wait_h.mean()), 3),
        "deadline_misses": misses,
        "makespan_h": round(makespan_s / 3600, 3),
        "gpu_util": round(busy / (inputs.total_gpus * makespan_s), 4) if makespan_s else 0.0,
        "jobs": len(jobs),
        "fragmentation": round(run.fragmentation, 4),
        "suspensions": run.suspensions,
        "guard_suspensions": run.guard_suspensions,
        "job_hours_beyond_signal": round(float(np.sum(beyond)) / 3600, 1),
        "forecast": run.forecast,
        "forced_starts": run.forced,
        "budget": None,  # with a budget: how each period fared
        # oracle: what its one solve reported (not its seconds: the output is the same
        # on every run and machine)
        "solver": {k: v for k, v in (run.solver or {}).items() if k != "solve_s"} or None,
    }
    if run.ledger is not None:
        over = run.ledger.over_g()
        out["budget"] = {
            "per_period_kg": round(run.ledger.budget.grams / 1000, 3),
            "period": run.ledger.budget.period,
            "periods": len(run.ledger.spent_g),
            "periods_over": len(over),
            "over_kg": round(sum(over.values()) / 1000, 3),
            "max_period_kg": round(max(run.ledger.spent_g.values(), default=0) / 1000, 3),
            "forced_starts": sum(run.ledger.forced.values()),
        }
    return out


def power_timeline(inputs: SimInputs, run: RunResult, step_s: float | None = None):
    """Mean cluster power (W) per interval of ``step_s`` (default: the signal's step),
    as (interval starts, watts)."""
    step = step_s or inputs.carbon.step_s
    start = float(inputs.jobs.submit_s.min())
    end = float(run.finish_s.max())
    edges = start + np.arange(int(np.ceil((end - start) / step)) + 1) * step
    # Energy up to each edge: sum over segments of p × overlap([t0, t1), (-inf, edge)).
    t0, t1, p = run.seg_start_s, run.seg_end_s, run.seg_power_w
    times = np.concatenate((t0, t1))
    slopes = np.concatenate((p, -p))
    order = np.argsort(times, kind="stable")
    times, slopes = times[order], slopes[order]
    level = np.cumsum(slopes)  # power after each change
    energy_at_change = np.concatenate(([0.0], np.cumsum(level[:-1] * np.diff(times))))
    k = np.searchsorted(times, edges, side="right") - 1
    k_clip = np.clip(k, 0, len(times) - 1)
    energy = np.where(
        k >= 0, energy_at_change[k_clip] + level[k_clip] * (edges - times[k_clip]), 0.0
    )
    return edges[:-1], np.diff(energy) / step
