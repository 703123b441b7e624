"""Budgets kept online in the daemon and ``plan`` (issue 21): a start a deadline forces
beyond the budget is named, with its grams, in ``show`` and ``budget``; the daemon's
planner keeps part of the period's budget for the jobs expected to arrive."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

INTENSITY = 500.0  # g/kWh, flat: any run spends


def _flat_trace(path: Path, t0: int) -> None:
    lines = ["time,carbon_g_per_kwh"]
    lines += [
        f"{datetime.fromtimestamp(t0 + i, UTC).isoformat()},{INTENSITY}" for i in range(-120, 900)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.backends("sqlite")  # the daemon's planning, not the store's backend
def test_a_start_forced_beyond_the_budget_is_named_with_its_grams(cli, tmp_path):
    trace = tmp_path / "flat.csv"
    _flat_trace(trace, int(time.time()))
    cli.daemon(
        "--grid", f"csv:{trace}", "--slot", "1s", "--interval", "0.2", "--budget", "1g/day"
    )  # killed after
    # about 0.1 g: within the budget, not forced
    free = cli.submit("--now", "--duration", "2s", "--gpus", "1", "--", "sleep", "0.2")
    cli.wait_state(free, {"completed"}, timeout=30)
    # about 2.5 g, and its deadline lets it wait at most a second or two: forced
    forced = cli.submit("--duration", "60s", "--within", "62s", "--gpus", "1", "--", "sleep", "0.2")
    shown = cli.wait_state(forced, {"completed"}, timeout=30)
    assert shown["forced_g"] > 1.0 and shown["forced_kwh"] > 0
    assert shown["runs"][0]["forced_g"] == shown["forced_g"]
    assert cli.json("show", str(free))["forced_g"] is None
    budget = cli.json("budget", "--budget", "1g/day")
    (named,) = budget["forced"]
    assert named["job"] == forced and named["g"] == pytest.approx(shown["forced_g"], rel=1e-3)
    assert budget["forced_g"] == named["g"] and budget["periods"][-1]["forced_g"] == named["g"]
    energy = cli.json("budget", "--budget", "1kWh/day")  # the same start, in Wh
    assert energy["forced"][0]["g"] == pytest.approx(1e3 * shown["forced_kwh"], rel=1e-3)
    text = cli.run("budget", "--budget", "1g/day").stdout
    assert f"forced job {forced}" in text and f"job {free} " not in text
    assert "forced by its deadline" in cli.run("show", str(forced)).stdout


T0 = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)  # a Monday, 06:00 UTC


def _job(i: int, **fields):
    from orchestrator.queue.models import Job

    base = dict(
        id=i, state="queued", user="u", uid=1, command=["python", "train.py"], workdir="/",
        gpus_min=4, gpus_max=4, submitted_at=T0 - timedelta(minutes=5), duration_s=4 * 3600.0,
        deadline=T0 + timedelta(hours=30),
    )  # fmt: skip
    return Job(**(base | fields))


def test_the_daemons_planner_keeps_budget_for_the_jobs_expected_to_arrive(tmp_path):
    """Ten jobs of 4 GPUs for 2 h submitted over the last 6 h on 16 GPUs: the daemon reads
    that load from the queue (as simulate does from its trace) and its plan spends less of
    today's budget on the two queued jobs than a plan that expects no arrivals, which
    spends the day's budget on them at once."""
    import numpy as np

    from grid.steps import StepSeries
    from orchestrator.daemon.planner import LivePlanner, expected_load
    from orchestrator.planning.budgets import Budget, expected_spend
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.queue.db import Database
    from orchestrator.queue.store import submitted_since

    now_s = T0.timestamp()
    values = np.where(np.arange(3 * 96) % 96 < 40, 300.0, 200.0)  # g/kWh, 15-min steps
    series = StepSeries(now_s - 6 * 3600, 900.0, values)
    feed = SimpleNamespace(series=lambda: series, age_s=lambda now: 0.0, version=1, last_error=None)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    queued = [_job(1), _job(2)]
    with db.write() as session:
        for i in range(10):  # ran 2 h each
            at = T0 - timedelta(hours=6) + timedelta(minutes=30 * i)
            session.add(_job(10 + i, state="completed", submitted_at=at, started_at=at,
                             finished_at=at + timedelta(hours=2), duration_s=None))  # fmt: skip
        session.add_all([_job(1), _job(2)])
    with db.read() as session:
        submitted, first = submitted_since(session, T0 - timedelta(days=1))
    assert len(submitted) == 12 and first == T0 - timedelta(hours=6)
    load = expected_load(submitted, first, {}, 4 * 3600.0, now_s, 16, 8)
    assert load == pytest.approx((10 * 4 * 7200 + 2 * 4 * 4 * 3600) / (6 * 3600 * 16))

    def today_g(arrivals: float, budget: Budget | None = Budget(3000.0, "day")) -> float:
        # 3 kg/day; the two jobs at once: about 2.1 kg
        planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for(None), feed=feed,
                              budget=budget)  # fmt: skip
        planner.schedule(T0, queued, {}, [], 16, 8, 0.0, load=arrivals)
        end = Budget(3000.0, "day").period_of(now_s)[1]
        plans = [planner._plan[j.id] for j in queued]
        return sum(expected_spend(d, d.power_w, series, now_s, 0.0, end)[0] for d in plans)

    unpaced = today_g(0.0)
    assert unpaced > 2000.0, "no arrivals expected: both start now, at full power"
    paced = today_g(load)
    assert paced < 0.6 * unpaced, "part of today's budget kept for arrivals"
    # the arrivals' reserve leaves no room today: the plan without the budget (both at
    # 200 g/kWh from +4 h) spends less over the two days than deferring them, and is kept
    assert paced == pytest.approx(today_g(load, None))


def test_budget_lists_the_forced_starts_of_its_period_on_each_backend(db_url):
    """The store's side of ``budget``: forced starts read back from the attempts, by
    period, in g or in Wh (SQLite and PostgreSQL)."""
    from orchestrator.accounting.reports import budget_periods
    from orchestrator.daemon.ops.accounts import forced_starts
    from orchestrator.planning.budgets import Budget
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Usage

    db = Database(db_url)
    db.ensure_schema()
    yesterday = T0 - timedelta(days=1)
    with db.write() as session:
        for i, (at, forced) in enumerate([(yesterday, 700.0), (T0, 2500.0), (T0, None)], 1):
            session.add(_job(i, state="completed", submitted_at=at))
            session.flush()
            session.add(Attempt(job_id=i, number=1, state="exited", node="n", gpu_ids=[0],
                                run_dir="/x", started_at=at, forced_g=forced,
                                forced_wh=None if forced is None else forced / 2))  # fmt: skip
            session.add(Usage(attempt_id=i, day=at, job_id=i, carbon_g=1000.0, energy_j=3.6e6))
    with db.read() as session:
        for text, scale in (("1kg/day", 1.0), ("1kWh/day", 0.5)):
            budget = Budget.parse(text)
            data = budget_periods(session, budget, T0 + timedelta(hours=1), 7)
            got = forced_starts(session, budget, data)
            assert [(f["job"], f["g"]) for f in got["forced"]] == [(2, 2500.0 * scale)]
            assert got["forced_g"] == 2500.0 * scale
            assert [p["forced_g"] for p in got["periods"]] == [700.0 * scale, 2500.0 * scale]
    db.dispose()


@pytest.mark.backends("sqlite")  # the plan reads the queue's accounts; not about the store
def test_plan_reads_what_the_period_has_spent(cli):
    """``plan --budget`` paces what is left of the period after what the accounts say was
    spent (it assumed nothing): a job that must start now is forced once it is spent."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    grid = f"synthetic:start={day}&days=3"
    cli.submit("--gpus", "1", "--duration", "15m", "--within", "20m", "--", "true")

    def forced() -> bool:
        (row,) = cli.json("plan", "--grid", grid, "--budget", "1kg/day")["jobs"]
        return row["forced"]

    assert not forced(), "about 0.03 kg of a 1 kg budget"
    from sqlalchemy import create_engine, text

    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    engine = create_engine(cli.db_url)
    with engine.begin() as conn:  # 1 t spent today and tomorrow (a test run at midnight)
        for days in (0, 1):
            conn.execute(
                text("INSERT INTO usage (attempt_id, day, job_id, energy_j, carbon_g, cost)"
                     " VALUES (:a, :d, 1, 3.6e9, 1e6, NULL)"),
                {"a": 100 + days, "d": (today + timedelta(days=days)).replace(tzinfo=None)},
            )  # fmt: skip
    engine.dispose()
    assert forced(), "the period's 1 kg is spent: its deadline forces the start"
