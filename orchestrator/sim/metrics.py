"""Metrics of a what-if run, from the jobs' times and the executor's power segments.

Carbon is the integral of power × intensity over every stretch a job ran (not one value
at its start); cost likewise with the price signal. Energy is the jobs' facility energy
(GPUs at their modelled draw, the host's share, × PUE).
"""

from __future__ import annotations

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH, Ledger
from orchestrator.sim.hardware.power import idle_metrics
from orchestrator.sim.inputs import SimInputs
from orchestrator.sim.result import RunResult
from orchestrator.sim.sitelimit import site_peak_w


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
    peak = site_peak_w(run)
    out = {
        "carbon_kg": round(carbon_g / 1000, 3),
        "energy_kwh": round(energy_j / J_PER_KWH, 3),
        "peak_power_kw": round(peak / 1000, 3),  # jobs + idle (sim.sitelimit)
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
    out.update(idle_metrics(inputs, run.idle))
    if inputs.power_limit_w is not None:  # a job too wide for the limit even alone
        out["limit_exceeded"] = peak > inputs.power_limit_w * (1 + 1e-9) + 1e-6
    if inputs.scenario.jobs.share > 0:  # co-location: what it did (sim.hardware.colocation)
        out["pairs"] = len(run.pairs or ())
        out["colocation_moves"] = run.moves
        out["splits"] = run.splits
    if run.ledger is not None:
        out["budget"] = budget_block(run.ledger)
    return out


def budget_block(ledger: Ledger) -> dict:
    """How each period of the budget fared. Amounts in the budget's unit (kg, or kWh for
    an energy budget: ``unit``); ``budget_overrun_kg``: the amount spent beyond the budget
    over all periods; ``forced_jobs``: the starts a deadline forced against it, each with
    what it was expected to spend (counted in the period it started in, ``by_period``)."""
    over = ledger.over_g()
    budget = ledger.budget
    forced_g: dict[float, float] = {}
    for f in ledger.forced_jobs:
        start = budget.period_of(f.start_s)[0]
        forced_g[start] = forced_g.get(start, 0.0) + f.grams
    return {
        "budget": str(budget),
        "kind": budget.kind,
        "unit": budget.unit,
        "per_period_kg": round(budget.grams / 1000, 3),
        "period": budget.period,
        "periods": len(ledger.spent_g),
        "periods_over": len(over),
        "over_kg": round(sum(over.values()) / 1000, 3),
        "budget_overrun_kg": round(sum(over.values()) / 1000, 3),
        "spent_kg": round(sum(ledger.spent_g.values()) / 1000, 3),
        "max_period_kg": round(max(ledger.spent_g.values(), default=0) / 1000, 3),
        "forced_starts": sum(ledger.forced.values()),
        "forced_jobs": [
            {"job": f.job_id, "start_s": round(f.start_s, 1), "kg": round(f.grams / 1000, 3)}
            for f in ledger.forced_jobs
        ],
        "forced_kg": round(sum(f.grams for f in ledger.forced_jobs) / 1000, 3),
        "by_period": [  # start (epoch s; null for a whole-run budget), spent, forced
            {
                "start_s": p if np.isfinite(p) else None,
                "kg": round(g / 1000, 3),
                "forced_kg": round(forced_g.get(p, 0.0) / 1000, 3),
            }
            for p, g in sorted(ledger.spent_g.items())
        ],
    }


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
