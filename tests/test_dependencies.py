"""Dependencies (``submit --after``) in every plan: a dependant starts no earlier than its
dependency's expected end, in ``plan`` and in ``simulate``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from tests.conftest import E2E

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICIES = ["fifo", "lowest-window", "lowest-slots", "budget", "budget-fifo"]


def _job(i: int, hours: float, interruptible: bool = False):
    from orchestrator.queue.models import Job

    return Job(id=i, state="queued", user="u", uid=1, command=["x"], workdir="/", gpus_min=1,
               gpus_max=1, submitted_at=T0, duration_s=hours * 3600.0,
               interruptible=interruptible)  # fmt: skip


def _rows(policy: str, queued, running, after) -> dict:
    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.planning.budgets import Budget, BudgetState
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.snapshot import PlanInputs, build_snapshot, plan_rows

    now_s = T0.timestamp() + 3600.0
    values = np.array([300.0] * 4 + [100.0] * 8 + [300.0] * 60)  # low from 3 h to 11 h
    carbon = StepForecaster(StepSeries(now_s, 3600.0, values))
    budget = Budget.parse("100kg/day")
    state = BudgetState(budget, *budget.period_of(now_s), 0.0)
    inputs = PlanInputs(now_s, queued, running, 8, curve_for(None), carbon, budget=state,
                        slot_s=900.0, after=after)  # fmt: skip
    rows = plan_rows(resolve_policy(policy), build_snapshot(inputs, 8), inputs)
    return {r["id"]: r for r in rows}


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.parametrize("policy", POLICIES)
def test_plan_starts_the_dependant_of_a_running_job_after_its_expected_end(policy):
    running = _job(1, 6.0)
    running.state = "running"
    dependant = _job(2, 1.0)
    # started at T0, 6 h long: expected to end at T0 + 6 h; the plan is made at T0 + 1 h
    rows = _rows(policy, [dependant], [(running, 1, T0)], {2: [1]})
    end_s = (T0 + timedelta(hours=6)).timestamp()
    assert _t(rows[2]["start"]) >= end_s - 1, rows[2]
    assert rows[2]["after"] == [1]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_chain_of_queued_jobs_is_planned_in_dependency_order(policy):
    a, b, c = _job(1, 2.0), _job(2, 3.0, interruptible=True), _job(3, 1.0)
    rows = _rows(policy, [c, b, a], [], {2: [1], 3: [2]})

    def end(r):
        return _t(r["intervals"][-1][1]) if r["intervals"] else _t(r["start"]) + r["estimate_s"]

    assert _t(rows[2]["start"]) >= end(rows[1]) - 1, (rows[1], rows[2])
    assert _t(rows[3]["start"]) >= end(rows[2]) - 1, (rows[2], rows[3])
    assert rows[1]["after"] is None and rows[3]["after"] == [2]


@pytest.mark.parametrize("policy", ["lowest-window", "budget"])
def test_a_chain_deeper_than_the_replanning_rounds_still_keeps_its_order(policy):
    jobs = [_job(i, 1.0 + 0.5 * (i % 2), interruptible=i % 3 == 0) for i in range(1, 8)]
    rows = _rows(policy, jobs[::-1], [], {i: [i - 1] for i in range(2, 8)})
    for i in range(2, 8):
        prev = rows[i - 1]
        end = (
            _t(prev["intervals"][-1][1])
            if prev["intervals"]
            else _t(prev["start"]) + (prev["estimate_s"])
        )
        assert _t(rows[i]["start"]) >= end - 1, (i, prev, rows[i])


def test_a_dependency_that_has_ended_holds_nothing_back():
    rows = _rows("fifo", [_job(2, 1.0)], [], {2: [1]})  # job 1 is neither queued nor running
    assert rows[2]["wait_h"] == 0 and rows[2]["after"] is None


@pytest.mark.backends("sqlite")  # plan reads the queue's dependencies
def test_gridshift_plan_reads_after_from_the_queue(cli):
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    cli.submit("--duration", "3h", "--now", "--", "true")
    cli.submit("--duration", "1h", "--now", "--after", "1", "--", "true")
    grid = f"synthetic:start={day}&days=3"
    rows = {r["id"]: r for r in cli.json("plan", "--grid", grid, "--policy", "fifo")["jobs"]}
    assert rows[2]["after"] == [1]
    assert _t(rows[2]["start"]) >= _t(rows[1]["start"]) + 3 * 3600 - 1
    assert "job 2: after job 1" in cli.run("plan", "--grid", grid).stdout


def _trace(path, rows) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_simulate_starts_a_dependant_only_after_its_dependencies_ended(tmp_path):
    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario
    from tests.conftest import ROOT

    rows = [
        {"submit": 0, "duration": "6h", "gpus": 2, "within": "30h"},
        {"submit": 0, "duration": "1h", "after": 1},
        {"submit": 600, "duration": "2h", "after": [2], "interruptible": True},
        {"submit": 600, "duration": "1h", "after": [1, 3]},
        {"submit": 600, "duration": "1h"},
    ]
    policies = ["fifo", "lowest-window", "lowest-slots", "budget", "optimal"]
    scenario = Scenario.model_validate(
        {
            "policies": policies,
            "jobs": {"source": _trace(tmp_path / "jobs.jsonl", rows)},
            "grid": {"source": "synthetic:days=4"},
            "cluster": {"gpus": 8},
        }
    )
    outcome = simulate(scenario, ROOT)
    waits = outcome.inputs.jobs.after
    assert waits[1] == (0,) and waits[3] == (0, 2)
    for name in policies:
        run = outcome.runs[name]
        assert not np.isnan(run.finish_s).any()
        for i, deps in enumerate(waits):
            for d in deps:
                assert run.first_start_s[i] >= run.finish_s[d] - 1e-6, (name, i, d)
    fifo = outcome.runs["fifo"]
    assert fifo.first_start_s[4] == fifo.first_start_s[0] + 600, "a job without after: not held"
    assert fifo.first_start_s[1] == pytest.approx(fifo.finish_s[0])


@pytest.mark.backends("sqlite")  # simulate touches no queue
@pytest.mark.parametrize(
    ("after", "message"),
    [
        ({1: 9}, "after 9: no job 9 in the trace"),
        ({1: 2}, "a job cannot wait for itself"),
        ({0: 2, 1: 1}, "a job waits only for earlier rows"),  # a cycle: 1 -> 2 -> 1
        ({0: 3}, "a job waits only for earlier rows"),
        ({1: "one"}, "is no row number"),
    ],
)
def test_simulate_rejects_a_bad_after_in_one_line(cli, tmp_path, after, message):
    rows = [{"submit": 60 * i, "duration": "1h"} for i in range(3)]
    for i, value in after.items():
        rows[i]["after"] = value
    trace = _trace(tmp_path / "jobs.jsonl", rows)
    proc = cli.run("simulate", "--jobs", trace, "--grid", "synthetic:days=2", check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_simulate_leaves_out_the_dependants_of_a_job_it_leaves_out(tmp_path):
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.scenario import Scenario
    from tests.conftest import ROOT

    rows = [
        {"submit": 0, "duration": "1h", "gpus": 16},  # wider than the cluster
        {"submit": 0, "duration": "1h", "after": 1},
        {"submit": 0, "duration": "1h", "after": "2"},
        {"submit": 0, "duration": "1h"},
    ]
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": _trace(tmp_path / "jobs.jsonl", rows)},
            "grid": {"source": "synthetic:days=2"},
            "cluster": {"gpus": 8},
        }
    )
    inputs = prepare(scenario, ROOT)
    assert len(inputs.jobs) == 1 and inputs.jobs.after is None
    assert "2 jobs waiting for those too" in inputs.notes


@pytest.mark.parametrize("policy", ["budget", "lowest-window", "fifo"])
def test_the_daemon_plans_a_waiting_dependant_ahead_but_never_schedules_it(policy):
    """A job waiting for a running 6-hour job is planned for after that job's expected
    end (for ``show``), and stays out of the scheduler: it starts once its dependency has
    completed, as before."""
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.signals.feed import SignalFeed
    from tests.test_live_parts import _Chain

    now = T0 + timedelta(hours=1)
    feed = SignalFeed(_Chain(), horizon_s=2 * 86400, lookback_s=3600)
    assert feed.refresh(now)
    planner = LivePlanner(resolve_policy(policy), 900.0, curve_for(None), feed=feed)
    running, free, waiting, chained = _job(1, 6.0), _job(2, 1.0), _job(3, 1.0), _job(4, 1.0)
    running.state = "running"
    scheduler = planner.schedule(
        now, [free], {}, [(running, 1, T0)], 8, 8, 0.0, None, [waiting, chained],
        {3: [1], 4: [3]},
    )  # fmt: skip
    assert [view.id for view, _ in scheduler.planned()] == [2]
    ahead = {view.id: d for view, d in planner.ahead}
    assert set(ahead) == {3, 4} and planner.after == {3: [1], 4: [3]}
    assert ahead[3].start_s >= (T0 + timedelta(hours=6)).timestamp() - 1
    assert ahead[4].start_s >= ahead[3].start_s + 3600 - 1


@E2E
@pytest.mark.backends("sqlite")  # the daemon's plan, not the store
def test_the_live_daemon_shows_a_dependant_planned_after_its_running_dependency(cli, tmp_path):
    import signal as signals
    import time

    from tests.helpers.waiting import wait_for

    t0 = int(time.time()) // 60 * 60
    rows = [f"{datetime.fromtimestamp(t0 + 60 * i, UTC).isoformat()},300" for i in range(-5, 300)]
    trace = tmp_path / "flat.csv"
    trace.write_text("time,carbon_g_per_kwh\n" + "\n".join(rows) + "\n")
    a = cli.submit("--now", "--duration", "1h", "--", "sleep", "60")
    b = cli.submit("--now", "--duration", "10m", "--after", str(a), "--", "true")
    daemon = cli.daemon("--grid", f"csv:{trace}", "--slot", "1m", "--interval", "0.2")
    started = cli.wait_state(a, {"running"})

    def planned():
        shown = cli.json("show", str(b))
        return shown if (shown["plan_note"] or "").startswith("after job") else None

    shown = wait_for(planned, 30, "the dependant's plan")
    assert shown["state"] == "queued"
    assert shown["plan_note"].startswith(f"after job {a}: planned for ")
    assert _t(shown["planned_start"]) >= _t(started["started_at"]) + 3600 - 2
    cli.run("cancel", str(a))
    cli.wait_state(b, {"failed"})  # its dependency was cancelled: as before
    daemon.send_signal(signals.SIGTERM)
    assert daemon.wait(timeout=20) == 0


def test_simulate_plans_a_held_dependant_ahead_so_others_leave_it_room(tmp_path):
    """One GPU; low carbon only from 02:00 to 04:00. Job 2 waits for job 1 and must end
    by 04:00; job 3 is free until tomorrow. Planned ahead from job 1's planned end (as the
    daemon plans a waiting job), job 2 keeps its place in the low window and meets its
    deadline; held out of the plan until job 1 ended, it found the window taken by jobs 1
    and 3 and ended after 04:00."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario
    from tests.conftest import ROOT

    t0 = datetime(2023, 3, 1, tzinfo=UTC)
    lines = ["time,carbon_g_per_kwh"] + [
        f"{(t0 + timedelta(hours=h)).isoformat()},{100.0 if 2 <= h < 4 else 500.0}"
        for h in range(72)
    ]
    grid = tmp_path / "grid.csv"
    grid.write_text("\n".join(lines) + "\n")
    at = t0.isoformat()
    rows = [
        {"submit": at, "duration": "1h", "within": "24h"},
        {"submit": at, "duration": "1h", "within": "4h", "after": 1},
        {"submit": at, "duration": "1h", "within": "24h"},
    ]
    scenario = Scenario.model_validate(
        {
            "policies": ["budget"],
            "jobs": {"source": _trace(tmp_path / "jobs.jsonl", rows)},
            "grid": {"source": f"csv:{grid}"},
            "cluster": {"gpus": 1, "gpus_per_node": 1},
        }
    )
    run = simulate(scenario, ROOT).runs["budget"]
    assert run.first_start_s[1] >= run.finish_s[0] - 1e-6, "still only after job 1 ended"
    assert run.finish_s[1] <= t0.timestamp() + 4 * 3600 + 1e-6, "its deadline met"
