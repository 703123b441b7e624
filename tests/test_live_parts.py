"""The daemon's carbon-aware parts on their own: fake GPU limits, power caps, accounting
from a power log, the signal fallback (cron's rules: tests/test_cron.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from executors.gpu.fake import FakeGpuControl
from orchestrator.accounting.meter import Accountant
from orchestrator.nodes.powercaps import PowerCaps

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_fake_gpu_limits_persist_across_processes_and_cap_the_energy(tmp_path):
    clock = [1000.0]
    state = tmp_path / "gpus.json"
    daemon = FakeGpuControl(2, power_w=200, clock=lambda: clock[0], state_path=state)
    monitor = FakeGpuControl(2, power_w=200, clock=lambda: clock[0], state_path=state)
    start = monitor.energy_j(0)
    daemon.set_power_limit_w(0, 150)
    clock[0] += 10
    assert monitor.power_limit_w(0) == 150 and monitor.power_limit_w(1) == 300
    assert monitor.energy_j(0) - start == pytest.approx(1500)  # 150 W, not 200 W
    daemon.set_power_limit_w(0, 300)
    clock[0] += 10
    assert monitor.energy_j(0) - start == pytest.approx(1500 + 2000)
    with pytest.raises(Exception, match="outside"):
        daemon.set_power_limit_w(1, 20)


def test_power_caps_apply_restore_and_reconcile(tmp_path):
    ctl = FakeGpuControl(4, power_w=200, state_path=tmp_path / "g.json")
    caps = PowerCaps(ctl, 4)
    assert caps.enabled
    assert caps.apply([0, 1], 0.5) == 150
    assert caps.apply([2], 0.1) == 100, "clamped to the board's minimum"
    caps.reconcile({1: 0.5})  # a daemon restarted while job on GPU 1 runs
    assert [ctl.power_limit_w(i) for i in range(4)] == [300, 150, 300, 300]
    caps.reconcile({})
    assert all(ctl.power_limit_w(i) == 300 for i in range(4))
    off = PowerCaps(ctl, 4, wanted=False)
    assert not off.enabled and "turned off" in off.reason
    assert off.apply([0], 0.5) is None and ctl.power_limit_w(0) == 300


def test_accounting_integrates_power_times_intensity_and_is_recomputed_not_added(tmp_path):
    from executors.runfiles import POWER

    run = tmp_path / "attempt-1"
    run.mkdir()
    midnight = datetime(2026, 3, 2, tzinfo=UTC).timestamp()
    t = midnight - 60  # a minute before midnight to a minute after, 100 W throughout
    (run / POWER).write_text(f"{t} 0\n{t + 60} 6000\n{t + 120} 12000\n")
    (run / "job.json").write_text('{"started_at": "2026-03-01T23:59:00+00:00"}')

    def carbon(a: float, b: float) -> float:  # 200 g/kWh before midnight, 400 after
        before = max(0.0, min(b, midnight) - a)
        return 200 * before + 400 * (b - a - before)

    att = SimpleNamespace(id=1, gpu_ids=[0], run_dir=str(run), started_at=None, cap=None)
    acc = Accountant(carbon, lambda a, b: None, lambda a: 0.0)
    totals = acc.measure(att, t + 120)
    assert totals.energy_j == pytest.approx(12000) and not totals.modelled
    assert totals.carbon_g == pytest.approx((6000 * 200 + 6000 * 400) / 3.6e6)
    assert totals.cost is None, "no price signal: no cost"
    again = acc.measure(att, t + 130)
    assert again.energy_j == pytest.approx(12000), "the same samples are not counted twice"
    days = sorted(acc._meters[1].days)
    assert days == [midnight - 86400, midnight], "split at UTC midnight"
    fresh = Accountant(carbon, lambda a, b: None, lambda a: 0.0).measure(att, t + 200)
    assert fresh.carbon_g == pytest.approx(totals.carbon_g), "a restarted daemon agrees"


def test_modelled_energy_where_there_is_no_counter(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"started_at": T0.isoformat()}))
    att = SimpleNamespace(id=2, gpu_ids=[0, 1], run_dir=str(tmp_path), started_at=T0, cap=None)
    acc = Accountant(lambda a, b: 300.0 * (b - a), lambda a, b: None, lambda a: 500.0)
    totals = acc.measure(att, T0.timestamp() + 36, end_s=T0.timestamp() + 36)
    assert totals.modelled and totals.energy_j == pytest.approx(500 * 36)
    assert totals.carbon_g == pytest.approx(500 * 36 * 300 / 3.6e6)


class _Chain:
    spec = "test"
    errors: tuple[str, ...] = ()

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def forecast(self, issued_at, horizon):
        from grid.errors import GridDataError
        from grid.sources.synthetic import Synthetic

        if self.fail:
            raise GridDataError("provider down")
        start = (issued_at - timedelta(days=1)).date().isoformat()
        return Synthetic("s", {"start": start, "days": "3"}).history(None, None)

    def history(self, start, end):
        return self.forecast(start, end - start)


def test_the_planner_falls_back_when_the_signal_is_too_old():
    from orchestrator.daemon.planner import LatestStart, LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.baselines import Fifo
    from orchestrator.signals.feed import SignalFeed

    feed = SignalFeed(_Chain(), horizon_s=86400, lookback_s=3600)
    planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for(None), feed=feed,
                          max_age_s=3600.0)  # fmt: skip
    assert isinstance(planner._choose(T0), LatestStart), "no signal yet"
    assert feed.refresh(T0) and planner._choose(T0).name == "budget"
    assert planner.mode == "plan"
    feed.chain.fail = True
    assert not feed.refresh(T0 + timedelta(hours=2)) and "provider down" in feed.last_error
    assert isinstance(planner._choose(T0 + timedelta(hours=2)), LatestStart)
    assert planner.mode == "deadline-only" and "2.0 h old" in planner.mode_reason
    planner.fallback = "run-now"
    assert isinstance(planner._choose(T0 + timedelta(hours=2)), Fifo)
    feed.chain.fail = False
    assert feed.refresh(T0 + timedelta(hours=3))
    assert planner._choose(T0 + timedelta(hours=3)).name == "budget"


def test_the_report_saving_counts_running_and_never_run_jobs(tmp_path):
    """A job still running (energy accounted, run unfinished) and a job that never drew
    energy do not make the whole report's saving unknown."""
    import numpy as np

    from grid.steps import StepSeries
    from orchestrator.accounting.reports import report
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job

    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()

    def job(state: str, energy_j: float | None, carbon_g: float | None) -> Job:
        return Job(
            state=state, user="alice", uid=1000, command=["x"], workdir="/", gpus_min=1,
            gpus_max=1, submitted_at=t0, energy_j=energy_j, carbon_g=carbon_g, cost=0.0,
        )  # fmt: skip

    with db.write() as s:
        done, running, idle = job("completed", 3.6e6, 100.0), job("running", 3.6e6, 50.0), None
        idle = job("cancelled", 0.0, 0.0)
        s.add_all([done, running, idle])
        s.flush()
        hour = timedelta(hours=1)
        s.add(Attempt(job_id=done.id, number=1, state="completed", node="local", run_dir="/x",
                      started_at=t0, finished_at=t0 + hour))  # fmt: skip
        s.add(Attempt(job_id=running.id, number=1, state="running", node="local", run_dir="/y",
                      started_at=t0, accounted_until=t0 + hour))  # fmt: skip
    carbon = StepSeries(t0.timestamp(), 3600.0, np.array([400.0, 400.0]))
    with db.read() as s:
        out = report(s, None, carbon=carbon)
    total = out["total"]
    assert total["jobs"] == 3
    assert total["carbon_at_submission_kg"] == pytest.approx(0.8)  # 2 kWh at 400 g/kWh
    assert total["saving_pct"] == pytest.approx(100 * (1 - 150 / 800), abs=0.1)


def test_stopping_while_a_pass_books_its_early_successor_does_not_deadlock(monkeypatch):
    """A SIGTERM landing while a pass books the next one (``add_job``) hung the daemon:
    ``shutdown(wait=True)`` held the job store lock the pass needed."""
    import threading
    from datetime import UTC, datetime

    from apscheduler.job import Job

    from orchestrator.daemon.loop import run_passes

    wake = threading.Event()
    booking = threading.Event()
    original = Job.__init__

    def slow_init(self, *args, **kwargs):
        if threading.current_thread().name != "MainThread":
            booking.set()
            wake.set()  # stopped just now, while this pass books its successor
            threading.Event().wait(0.5)
        original(self, *args, **kwargs)

    class Served:
        interval_s = 10.0
        lease = None
        dispatcher = None

        class clock:
            @staticmethod
            def now():
                return datetime.now(UTC)

        def tick(self, now):
            monkeypatch.setattr(Job, "__init__", slow_init)
            return 0.01  # something is due before the next interval: book a pass

        def stop(self, *_):
            wake.set()

        def stand_by(self):
            wake.set()

    runner = threading.Thread(target=run_passes, args=(Served(), wake, False), daemon=True)
    runner.start()
    runner.join(10)
    assert booking.is_set(), "the pass booked its successor"
    assert not runner.is_alive(), "stopping hung"


def test_the_plan_note_compares_the_planned_run_with_one_started_now():
    """The note read "waiting for lower carbon ... at 400 g/kWh (now 400)": one value at
    the start against one now, although the run's whole window is what was chosen."""
    from grid.steps import StepSeries
    from orchestrator.daemon.guard import _why, window_means
    from orchestrator.planning.policies.base import Decision

    # hourly: 400 now and for two hours, then 100 for three hours, then 400 again
    series = StepSeries(0.0, 3600.0, [400, 400, 100, 100, 100, 400, 400, 400])
    planner = SimpleNamespace(mode="plan", policy=SimpleNamespace(name="budget"))
    feed = SimpleNamespace(series=lambda: series)
    now = datetime.fromtimestamp(0, UTC)
    later = Decision(start_s=3600.0, end_s=3600.0 * 5)  # 400, 100, 100, 100
    assert window_means(series, later, 0.0) == (175.0, 250.0)
    note = _why(planner, feed, SimpleNamespace(id=1), later, now, None)
    assert note == (
        "waiting for lower carbon: starts 01:00:00 UTC; 175 g/kWh over its run (now: 250)"
    )
    flat = Decision(start_s=3600.0 * 5, end_s=3600.0 * 6)  # 400 later as now: not lower carbon
    note = _why(planner, feed, SimpleNamespace(id=1), flat, now, None)
    assert note == "planned for 05:00:00 UTC by budget (400 g/kWh over its run)"
    pieces = Decision(start_s=7200.0, intervals=((7200.0, 10800.0), (14400.0, 18000.0)))
    assert window_means(series, pieces, 0.0) == (100.0, 400.0)


def test_a_fault_found_not_raised_is_logged_once_until_the_entity_is_well(caplog):
    from orchestrator.daemon.contain import Faults

    faults = Faults()
    for _ in range(3):
        faults.report("job 7", "job 7: plan: the stored job cannot be believed")
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    with faults.contained("job 7", "job 7: plan"):
        pass  # well again: said once, and a later fault is logged anew
    faults.report("job 7", "job 7: plan: again")
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2
