"""Budgets kept online (issue 21): energy budgets, the plan a budget may never make
worse than no budget, the overruns named in the what-if JSON, and adherence over a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grid.forecasters import StepForecaster
from grid.steps import StepSeries
from orchestrator.errors import SpecError
from orchestrator.planning.budgets import Budget, Ledger
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import QueuedJob, Snapshot

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_006_400.0  # a UTC midnight


def test_energy_budget_parses_and_is_charged_in_watt_hours():
    b = Budget.parse("500kWh/day")
    assert (b.grams, b.period, b.kind, b.unit) == (500_000.0, "day", "energy", "kWh")
    assert str(b) == "500kWh/day"
    assert Budget.parse("2MWh").kind == "energy" and Budget.parse("2MWh").period == "run"
    assert Budget.parse("20kg/day").kind == "carbon"
    with pytest.raises(SpecError, match="500kWh/day"):
        Budget.parse("5 joules")
    carbon = StepSeries(T0, 3600.0, np.array([100.0, 500.0, 300.0]))
    ledger = Ledger(b)
    # 1 kW for 2 h: 2 kWh whatever the carbon
    assert ledger.record(T0, T0 + 7200, 1000.0, carbon) == pytest.approx(2000.0)
    carbon_ledger = Ledger(Budget.parse("1kg"))
    assert carbon_ledger.record(T0, T0 + 7200, 1000.0, carbon) == pytest.approx(600.0)


def _jobs(n: int) -> list[QueuedJob]:
    curve = curve_for("a40")
    out = []
    for i in range(n):
        run = 3600.0 * (1 + i % 3)
        out.append(
            QueuedJob(
                i,
                2,
                T0,
                duration_s=run,
                deadline_s=T0 + run + 12 * 3600,
                interruptible=i % 2 == 0,
                model=JobModel(run, 2, curve),
            )
        )
    return out


def _snapshot(jobs, budget: str | None) -> Snapshot:
    hours = np.array([400.0] * 6 + [100.0] * 6 + [400.0] * 12 + [100.0] * 24)
    snap = Snapshot(T0, jobs, StepForecaster(StepSeries(T0, 3600.0, hours)), total_gpus=8)
    if budget is not None:
        snap.budget = Ledger(Budget.parse(budget)).state(T0)
    return snap


def _plan_g(plan, jobs, snap) -> float:
    series = snap.forecast.window(T0, T0, T0 + 48 * 3600)
    total = 0.0
    for job in jobs:
        d = plan[job.id]
        for i, (a, b) in enumerate(d.intervals or ((d.start_s, d.end_s),)):
            total += d.piece_config(i)[2] * float(series.integral(a, b)) / 3.6e6
    return total


def test_a_budget_below_the_frugal_need_plans_as_no_budget():
    """A budget the queue cannot keep (less than its least carbon) leaves the plan the
    budget-free one: a budget never makes the queue spend more than no budget."""
    jobs = _jobs(10)
    policy = resolve_policy("budget")
    free = policy.plan(_snapshot(jobs, None))
    tight = policy.plan(_snapshot(jobs, "1g"))
    assert {j: (d.start_s, d.intervals, d.gpus, d.cap) for j, d in tight.items()} == {
        j: (d.start_s, d.intervals, d.gpus, d.cap) for j, d in free.items()
    }
    assert _plan_g(tight, jobs, _snapshot(jobs, None)) <= _plan_g(free, jobs, _snapshot(jobs, None))


def test_lambda_is_carried_between_replans(monkeypatch):
    """The budget planner starts the search for λ from the last replan's (by period
    start): the same plan and λ to the bisection's tolerance, in fewer evaluations."""
    from orchestrator.planning.policies import periods

    calls = []
    choose = periods.Periods.choose
    monkeypatch.setattr(periods.Periods, "choose", lambda s, x: calls.append(1) or choose(s, x))
    jobs, policy = _jobs(10), resolve_policy("budget")
    cold = policy.plan(_snapshot(jobs, "2kg/day"))
    (key, first), cold_calls = next(iter(policy.lambdas.items())), len(calls)
    assert key == T0 and first > 0, "the budget is priced"
    calls.clear()
    assert policy.plan(_snapshot(jobs, "2kg/day")) == cold
    assert abs(np.log10(policy.lambdas[T0] / first)) <= periods.BISECT_TOL
    assert len(calls) < cold_calls - 2
    fresh = resolve_policy("budget")  # a new planner starts from scratch
    assert fresh.plan(_snapshot(jobs, "2kg/day")) == cold and fresh.lambdas[T0] == first


def _spec(policy: str, budget: str | None, grid: str) -> dict:
    return {
        "name": "adherence",
        "policies": [policy],
        "budget": budget,
        "seed": 1,
        "jobs": {
            "source": "synthetic:count=100&days=3",
            "deadline_rule": "within:24h",
            "interruptible": 0.5,
        },
        "grid": {"source": grid},
        "cluster": {"gpus": 64, "gpu": "a40"},
    }


def _run(policy: str, budget: str | None, grid: str, per: str | None = None) -> dict:
    """The what-if JSON of one run; with ``per`` (day, week), also its most expensive
    period's carbon (``max_period_kg``), as a ledger of that period would count it."""
    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario

    out = simulate(Scenario.model_validate(_spec(policy, budget, grid)), ROOT)
    result = dict(out.results[policy])
    if per is not None:
        run, ledger = out.runs[policy], Ledger(Budget.parse(f"1kg/{per}"))
        for a, b, w in zip(run.seg_start_s, run.seg_end_s, run.seg_power_w, strict=True):
            ledger.record(float(a), float(b), float(w), out.inputs.carbon)
        result["max_period_kg"] = max(ledger.spent_g.values()) / 1000
    return result


def test_the_what_if_json_names_forced_jobs_and_the_overrun():
    grid = "synthetic:mean=300&days=10"
    result = _run("budget", "1kg", grid)
    block = result["budget"]
    assert block["kind"] == "carbon" and block["unit"] == "kg"
    assert block["budget_overrun_kg"] == pytest.approx(block["spent_kg"] - 1.0, abs=1e-3)
    assert block["forced_jobs"], "a 1 kg budget cannot be kept: the starts it forced are named"
    assert all({"job", "start_s", "kg"} <= set(f) for f in block["forced_jobs"])
    assert block["forced_kg"] == pytest.approx(sum(f["kg"] for f in block["forced_jobs"]), abs=0.01)
    # a budget the queue cannot keep spends what no budget would (not more)
    free = _run("budget", None, grid)
    assert result["carbon_kg"] <= free["carbon_kg"] * 1.01


def test_an_energy_budget_runs_in_the_simulator():
    result = _run("budget", "1kWh", "synthetic:mean=300&days=10")
    block = result["budget"]
    assert block["kind"] == "energy" and block["unit"] == "kWh"
    assert block["spent_kg"] == pytest.approx(result["energy_kwh"], rel=1e-3)


GRIDS = [
    "synthetic:mean=300&days=14",  # a solar dip, weekly swing, mild noise
    "synthetic:mean=200&days=14&solar=0.1&noise=0.3&seed=3",  # wind-like: mostly noise
]


@pytest.mark.parametrize("grid", GRIDS)
def test_budget_adherence_between_no_budget_and_fifo(grid):
    """Whole-run, daily and weekly carbon budgets and an energy budget, each between what
    the policy spends with no budget and what fifo spends: what goes over the budget is
    at most 2 % plus the starts a deadline forced, each named; and a budget never makes
    the policy spend more than with no budget, beyond those forced starts."""
    fifo, free = _run("fifo", None, grid, "day"), _run("budget", None, grid, "day")
    mid = (free["carbon_kg"] + fifo["carbon_kg"]) / 2
    low = free["carbon_kg"] + 0.25 * (fifo["carbon_kg"] - free["carbon_kg"])
    day = (free["max_period_kg"] + fifo["max_period_kg"]) / 2  # between their worst days
    energy = (free["energy_kwh"] + fifo["energy_kwh"]) / 2
    budgets = [f"{low:.3f}kg", f"{mid:.3f}kg", f"{day:.3f}kg/day", f"{mid:.3f}kg/week"]
    for text in [*budgets, f"{energy:.3f}kWh"]:
        result = _run("budget", text, grid)
        b = result["budget"]
        allowed = 0.02 * b["per_period_kg"] * b["periods"] + b["forced_kg"]
        assert b["budget_overrun_kg"] <= allowed + 1e-3, (text, b)
        if b["forced_jobs"]:  # named, with what each was expected to spend
            assert all(f["kg"] >= 0 for f in b["forced_jobs"])
        if b["kind"] == "carbon":
            assert (
                result["carbon_kg"] - b["forced_kg"]
                <= max(free["carbon_kg"], b["per_period_kg"] * b["periods"]) * 1.02
            ), (text, b)
        else:
            assert result["energy_kwh"] == pytest.approx(b["spent_kg"], rel=1e-3)


def test_an_energy_budget_is_added_up_from_the_daemons_usage_in_kwh(tmp_path):
    """The daemon's ledger (per-day usage rows) adds up an energy budget in Wh, not grams:
    ``budget`` and ``status`` show it in kWh."""
    from datetime import UTC, datetime

    from orchestrator.accounting.meter import spent_g
    from orchestrator.accounting.reports import budget_periods
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Usage

    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    db.ensure_schema()
    day = datetime(2026, 11, 23, tzinfo=UTC)
    with db.write() as session:  # 2 kWh, 800 g on the day
        session.add(Usage(attempt_id=1, day=day, job_id=1, energy_j=7.2e6, carbon_g=800.0))
    now = datetime(2026, 11, 23, 12, tzinfo=UTC)
    with db.read() as session:
        data = budget_periods(session, Budget.parse("5kWh/day"), now, 3)
        assert spent_g(session, day, now, "energy") == pytest.approx(2000.0)
        assert spent_g(session, day, now) == pytest.approx(800.0)
    assert data["unit"] == "kWh" and data["budget"] == "5kWh/day"
    assert data["spent_g"] == pytest.approx(2000.0)  # Wh
    assert data["remaining_g"] == pytest.approx(3000.0)
    db.dispose()
