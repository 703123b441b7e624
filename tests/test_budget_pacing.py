"""The budget's reserve for arrivals, the recent load and the forced-start grams, as a
user of the daemon meets them (issue 21, the review of "budgets kept online")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from grid.forecasters import StepForecaster
from grid.steps import StepSeries
from orchestrator.daemon.planner import LivePlanner
from orchestrator.planning.budgets import Budget, Ledger, expected_spend
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import QueuedJob, Snapshot
from orchestrator.planning.policies.periods import Periods
from orchestrator.planning.policies.problem import Problem
from orchestrator.queue.models import Job

T0 = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)  # a Monday, 06:00 UTC: the day ends at +18 h
NOW_S = T0.timestamp()


def _job(i: int, **fields) -> Job:
    base = dict(
        id=i, state="queued", user="alice", uid=1000, command=["python", "train.py"],
        workdir="/", gpus_min=4, gpus_max=4, submitted_at=T0 - timedelta(minutes=5),
        duration_s=2 * 3600.0, deadline=T0 + timedelta(hours=20),
    )  # fmt: skip
    return Job(**(base | fields))


def _feed():
    values = np.full(3 * 96, 400.0)
    values[24 + 48 : 24 + 58] = 100.0  # low only from +12 h to +14.5 h
    series = StepSeries(NOW_S - 6 * 3600, 900.0, values)
    feed = SimpleNamespace(series=lambda: series, age_s=lambda now: 0.0, version=1, last_error=None)
    return feed, series


def _planned_g(budget: Budget | None, load: float) -> float:
    """What four 4-GPU 2 h jobs on 16 GPUs are planned to spend, over all periods."""
    feed, series = _feed()
    jobs = [_job(i) for i in range(1, 5)]
    planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for(None), feed=feed,
                          budget=budget)  # fmt: skip
    planner.schedule(T0, jobs, {}, [], 16, 8, 0.0, load=load)
    plans = [planner._plan[j.id] for j in jobs]
    return sum(expected_spend(d, d.power_w, series, NOW_S, 0.0)[0] for d in plans)


def test_a_budget_never_plans_more_carbon_than_no_budget_for_a_lone_batch():
    """The queue's own jobs make the recent load (4 x 4 GPUs x 2 h in 24 h on 16 GPUs):
    they are not counted again as arrivals, so the reserve does not push them into the
    next day at 400 g/kWh (2.26 kg before) and a 2 kg/day budget plans about what no
    budget does (the low window at +12 h: 1.03 kg)."""
    load = 4 * 4 * 7200.0 / (24 * 3600.0 * 16)
    free = _planned_g(None, load)
    assert free < 1100.0
    assert _planned_g(Budget.parse("2kg/day"), load) <= free * 1.01


def _periods(load: float, n_jobs: int = 4, budget: str = "50kg/day") -> Periods:
    curve = curve_for("a40")
    jobs = [
        QueuedJob(
            i,
            2,
            NOW_S,
            duration_s=3600.0,
            deadline_s=NOW_S + 13 * 3600,
            model=JobModel(3600.0, 2, curve),
        )
        for i in range(n_jobs)
    ]
    series = StepSeries(NOW_S, 3600.0, np.full(48, 300.0))
    snap = Snapshot(NOW_S, jobs, StepForecaster(series), total_gpus=64)
    snap.budget = Ledger(Budget.parse(budget)).state(NOW_S)
    snap.expected_load = load
    return Periods(Problem(snap))


def test_the_arrivals_reserve_scales_with_the_expected_load():
    """What is kept for arrivals grows with the load (a small load keeps a small share of
    the two full clusters kept before whatever the load), and the queued jobs, which are
    the recent arrivals, are taken off the load first."""
    small, more, busy = (_periods(x, 1).arrivals[0] for x in (0.01, 0.05, 1.0))
    assert 0 < small < more < busy
    # a daily budget: x 2, of at most 1 cluster, less the queued job (2 GPUs, about 1 h,
    # of 24 h x 64)
    assert small == pytest.approx(busy * 2 * (0.01 - 2 / 24 / 64) / 1, rel=0.05)
    # a whole-run budget: x 8, of at most 2 clusters
    small, busy = (_periods(x, 1, "50kg").arrivals[0] for x in (0.01, 1.0))
    assert small == pytest.approx(busy * 8 * (0.01 - 2 / 24 / 64) / 2, rel=0.05)
    # four queued 2-GPU 1 h jobs are 8 GPU-hours of the load's 24 h x 64 GPUs
    assert _periods(0.05, 4).arrivals[0] < _periods(0.05, 1).arrivals[0]
    assert _periods(8 / 24 / 64, 4).arrivals[0] == 0.0


def test_a_daily_budget_keeps_the_queue_a_share_when_the_cluster_is_busy():
    """On a busy cluster (recent load 1.0) a daily budget of 100 kg, at 06:00 with 13 h
    of the horizon's day to come, kept two full clusters' frugal draw for arrivals (about
    130 kg): the queue could spend nothing and waited for its deadlines (on the
    benchmark's DE-LU day: 742 starts forced). A budget that renews keeps one cluster's
    (65 kg): the queue gets a share of the rest."""
    day = _periods(1.0, 4, "100kg/day")
    assert day.arrivals[0] < day.left[0] and day.target[0] > 0
    assert day.target[0] >= day.base[0]  # its most frugal plan, at least


def test_jobs_that_never_ran_add_no_load_and_a_job_adds_at_most_the_window(tmp_path):
    """Three 8-GPU ``--duration 365d`` jobs submitted and cancelled at once made the
    recent load 547.6 (and moved other users' plans through the GPU reserve): a job that
    ended without starting counts nothing, and a long one at most the 24 h window."""
    from orchestrator.daemon.planner import expected_load
    from orchestrator.queue.db import Database
    from orchestrator.queue.store import submitted_since

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    at = T0 - timedelta(hours=2)
    with db.write() as session:
        session.add_all([_job(i) for i in range(1, 5)])
        for k in range(3):  # cancelled before they started
            session.add(_job(100 + k, user="bob", state="cancelled", gpus_min=8, gpus_max=8,
                             duration_s=365 * 86400.0, deadline=None, submitted_at=at,
                             finished_at=at))  # fmt: skip
    with db.read() as session:
        submitted, _ = submitted_since(session, T0 - timedelta(days=1))
    assert len(submitted) == 7
    day = 24 * 3600.0
    mature = T0 - timedelta(days=30)  # a daemon in use for a month: the 24 h window
    load = expected_load(submitted, mature, {}, 4 * 3600.0, NOW_S, 16, 8)
    assert load == pytest.approx(4 * 4 * 7200.0 / (day * 16))
    with db.write() as session:  # a year-long job, running: at most the window's worth
        session.add(_job(200, state="running", gpus_min=8, gpus_max=8, submitted_at=at,
                         started_at=at, duration_s=365 * 86400.0))  # fmt: skip
    with db.read() as session:
        submitted, _ = submitted_since(session, T0 - timedelta(days=1))
    load = expected_load(submitted, mature, {}, 4 * 3600.0, NOW_S, 16, 8)
    assert load == pytest.approx((4 * 4 * 7200.0 + 8 * day) / (day * 16))


def _forcing_planner(left_g: float) -> LivePlanner:
    series = StepSeries(NOW_S - 86400, 900.0, np.full(96 * 5, 400.0))
    feed = SimpleNamespace(series=lambda: series, age_s=lambda now: 0.0, version=1, last_error=None)
    planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for(None), feed=feed,
                          budget=Budget.parse("10kg/day"))  # fmt: skip
    planner._left = left_g
    return planner


def test_a_forced_start_books_what_it_spends_in_the_period_not_the_whole_run():
    """A 48 h job on 4 GPUs (1.4 kW) its deadline forces at 23:00 with nothing left of
    today: 0.56 kg falls in today, not the run's 26.9 kg."""
    from orchestrator.planning.policies.base import Decision

    at = datetime(2026, 3, 2, 23, 0, tzinfo=UTC).timestamp()
    planner = _forcing_planner(0.0)
    view = SimpleNamespace(gpus=4, model=None, duration_s=48 * 3600.0)
    g, wh = planner.forced_spend(view, Decision(at, end_s=at + 48 * 3600, forced=True), at)
    assert (g, wh) == pytest.approx((1400.0 * 0.4, 1400.0))


def test_every_start_of_a_pass_takes_its_spending_off_what_is_left():
    """An unforced start spends 0.56 kg of the 0.8 kg left this hour: a forced start
    after it (another 0.56 kg) goes beyond the budget and is named."""
    from orchestrator.planning.policies.base import Decision

    at = datetime(2026, 3, 2, 23, 0, tzinfo=UTC).timestamp()
    planner = _forcing_planner(800.0)
    view = SimpleNamespace(gpus=4, model=None, duration_s=3600.0)
    assert planner.forced_spend(view, Decision(at, end_s=at + 3600), at) is None
    spend = planner.forced_spend(view, Decision(at, end_s=at + 3600, forced=True), at)
    assert spend == pytest.approx((560.0, 1400.0))


def test_a_second_forced_resume_adds_to_the_attempts_forced_grams(tmp_path):
    from orchestrator.queue.attempts import note_forced
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        session.add(_job(1, state="running"))
    with db.write() as session:
        session.add(Attempt(job_id=1, number=1, state="running", node="n", run_dir="/"))
    for grams in (300.0, 200.0):  # forced start, then a forced resume (--suspend stop)
        with db.write() as session:
            note_forced(session, 1, grams, grams * 2.5)
    with db.read() as session:
        att = session.get(Attempt, 1)
        assert (att.forced_g, att.forced_wh) == pytest.approx((500.0, 1250.0))


def test_the_simulators_recent_load_counts_a_job_at_most_for_the_window():
    """``simulate`` counts the recent load as the daemon does: a 30-day job adds at most
    its GPUs for the deferral window."""
    from orchestrator.sim.engine import SimDaemon
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.runner import make_forecaster
    from orchestrator.sim.scenario import Scenario
    from tests.conftest import ROOT

    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": "synthetic:count=5&days=1"},
            "grid": {"source": "synthetic:days=3"},
            "cluster": {"gpus": 8, "gpu": "a40"},
        }
    )
    inputs = prepare(scenario, ROOT)
    inputs.jobs.duration_s[0] = 30 * 86400.0
    sim = SimDaemon(inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0))
    added = np.diff(sim._gpu_s_cum)
    assert added[0] == pytest.approx(inputs.jobs.gpus[0] * inputs.max_defer_s)
    assert added[1:] == pytest.approx(inputs.jobs.gpus[1:] * inputs.jobs.duration_s[1:])
