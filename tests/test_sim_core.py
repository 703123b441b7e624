"""The simulator's parts: event loop, simulated executor, step series, the baseline
policies (against brute force), the shared scheduler, deadline rules, traces."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from executors.base import LaunchSpec
from executors.simulated import SimulatedExecutor, Workload
from grid.forecasters import SeasonalNaiveSteps, StepForecaster, step_forecaster
from grid.steps import StepSeries
from orchestrator.errors import SpecError
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import Decision, QueuedJob, Snapshot
from orchestrator.planning.policies.baselines import Fifo, lowest_slots, lowest_window_start
from orchestrator.planning.scheduler import Scheduler
from orchestrator.sim.deadlines import DeadlineRule
from orchestrator.sim.events import EventLoop
from orchestrator.sim.traces import read_trace, shift_onto


def ts(text: str) -> float:
    return pd.Timestamp(text, tz="UTC").timestamp()


# -- event loop ---------------------------------------------------------------------------
def test_event_loop_runs_in_time_then_priority_then_order_and_skips_cancelled():
    loop, seen = EventLoop(0.0), []
    loop.schedule(5, lambda: seen.append("b"))
    loop.schedule(5, lambda: seen.append("a"), priority=0)
    loop.schedule(1, lambda: seen.append("first"))
    dead = loop.schedule(3, lambda: seen.append("cancelled"))
    loop.schedule(5, lambda: seen.append("c"))
    loop.cancel(dead)
    ticks = []
    loop.run(after=ticks.append)
    assert seen == ["first", "a", "b", "c"]
    assert ticks == [1, 5]  # one tick per distinct time; the cancelled time never ticks
    assert loop.now == 5


def test_event_loop_never_schedules_into_the_past_and_stops_at_until():
    loop = EventLoop(10.0)
    event = loop.schedule(2)
    assert event.at == 10.0
    loop.schedule(50)
    loop.run(until=20)
    assert loop.now == 20 and loop.peek() == 50


# -- simulated executor --------------------------------------------------------------------
def _executor():
    loop = EventLoop(0.0)
    return loop, SimulatedExecutor(loop)


def _launch(ex, attempt, rate=0.01, power=100.0, done=0.0, gpus=(0,)):
    curve = lambda f: f  # noqa: E731  (speed and draw proportional to the cap)
    ex.prepare(
        attempt,
        Workload(work=1.0, done=done, rate=lambda f: rate * curve(f), power_w=lambda f: power * f),
    )
    spec = LaunchSpec(attempt, attempt, ["sim"], "", {}, list(gpus), "", "")
    return ex.launch(spec)


def test_simulated_job_completes_when_its_work_is_done():
    loop, ex = _executor()
    handle = _launch(ex, 1)
    loop.run()
    result = ex.poll(handle)
    assert result.exit_code == 0 and result.ended_at == datetime.fromtimestamp(100, UTC)
    assert result.energy_j == pytest.approx(100 * 100)
    assert ex.progress(handle) == (1.0, 1.0)


def test_pause_resume_and_power_cap_move_the_end_and_the_energy():
    loop, ex = _executor()
    handle = _launch(ex, 1)
    loop.schedule(30, lambda: ex.signal(handle, signal.SIGSTOP))
    loop.schedule(50, lambda: ex.signal(handle, signal.SIGCONT))
    loop.schedule(60, lambda: ex.set_power_cap(handle, 0.5))  # half speed, half power
    loop.run()
    # 30 s done before the pause, 10 s after; the rest (0.6 of the work) at half speed
    assert ex.poll(handle).ended_at.timestamp() == pytest.approx(60 + 60 / 0.5)
    assert ex.poll(handle).energy_j == pytest.approx(100 * 40 + 50 * 120)
    assert sum(b - a for a, b in zip(ex.seg_start, ex.seg_end, strict=True)) == pytest.approx(160)


def test_sigterm_checkpoints_and_keeps_progress_for_the_next_attempt():
    loop, ex = _executor()
    handle = _launch(ex, 1)
    loop.schedule(25, lambda: ex.signal(handle, signal.SIGTERM))
    loop.run()
    result = ex.poll(handle)
    assert result.detail == "checkpointed" and result.exit_code == 0
    assert ex.progress(handle)[0] == pytest.approx(0.25)
    assert [h.attempt_id for h in ex.drain_ended()] == [1]
    resumed = _launch(ex, 2, done=0.25)
    loop.run()
    assert ex.poll(resumed).ended_at.timestamp() == pytest.approx(25 + 75)


def test_launch_without_a_workload_is_refused():
    from executors.errors import LaunchError

    _, ex = _executor()
    with pytest.raises(LaunchError):
        ex.launch(LaunchSpec(1, 9, ["sim"], "", {}, [], "", ""))


# -- step series and forecasts ------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1000), min_size=1, max_size=30),
    st.floats(-50, 4000),
    st.floats(0, 4000),
)
def test_step_integral_matches_a_fine_sum(values, t0, span):
    series = StepSeries(0.0, 100.0, np.array(values))
    t1 = t0 + span
    grid = np.linspace(t0, t1, 20001)
    mids = (grid[:-1] + grid[1:]) / 2
    brute = float(np.sum(series.value_at(mids)) * (t1 - t0) / 20000)
    assert float(series.integral(t0, t1)) == pytest.approx(brute, rel=1e-2, abs=1.0 + span)


def test_extended_repeats_the_last_week():
    week = np.arange(7 * 24, dtype=float)
    series = StepSeries(0.0, 3600.0, np.concatenate((np.zeros(24), week)))
    longer = series.extended(series.end_s + 48 * 3600)
    assert list(longer.values[-48:]) == list(week[:48])


def test_seasonal_naive_uses_only_what_was_known():
    values = np.arange(96, dtype=float)  # 4 days of hours
    series = StepSeries(0.0, 3600.0, values)
    fc = SeasonalNaiveSteps(series, 86400).window(48 * 3600.0, 48 * 3600.0, 96 * 3600.0)
    got = fc.value_at(np.arange(48, 96) * 3600.0)
    assert list(got) == [v - 24 * (1 + (v - 48) // 24) for v in values[48:]]
    assert step_forecaster("noise:0.1", series, 1).window(0, 0, 1).values.std() > 0
    with pytest.raises(Exception, match="unknown forecast"):
        step_forecaster("crystal-ball", series)


# -- policies ------------------------------------------------------------------------------
def _forecast(values, step=1800.0):
    return StepForecaster(StepSeries(0.0, step, np.asarray(values, dtype=float)))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=8, max_size=60),
    st.integers(1, 8),
    st.integers(0, 20),
    st.floats(0, 1800),
)
@example([63, 0, 0, 0, 0, 0, 457, 63], 8, 1, 0.01)  # two starts equal up to rounding
def test_lowest_window_is_the_brute_force_optimum(values, run_slots, slack_slots, offset):
    fc = _forecast(values)
    now, run = offset, run_slots * 1800.0
    latest = now + slack_slots * 1800.0
    start = lowest_window_start(fc, now, latest, run)
    candidates = [now] + [b for b in np.arange(1, 200) * 1800.0 if now < b <= latest]
    costs = [float(fc.actual.integral(c, c + run)) for c in candidates]
    assert now <= start <= latest
    assert float(fc.actual.integral(start, start + run)) == pytest.approx(min(costs))
    best = min(costs)  # earliest among equals, equal up to rounding
    tied = [c for c, v in zip(candidates, costs, strict=True) if v <= best + 1e-9 * max(1, best)]
    assert start == tied[0]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=8, max_size=60),
    st.floats(0.2, 6),
    st.integers(1, 20),
    st.floats(0, 1800),
)
@example([0, 1, 0, 0, 0, 0, 0, 0], 1.0, 2, 1799.9999999999998)  # a 2e-13 s sliver of slot 0
def test_lowest_slots_take_the_cheapest_time_inside_the_window(values, run_h, slack, offset):
    fc = _forecast(values)
    now, run = offset, run_h * 3600
    finish = now + run + slack * 1800.0
    intervals = lowest_slots(fc, now, finish, run)
    assert sum(b - a for a, b in intervals) == pytest.approx(run)
    assert intervals[0][0] >= now and intervals[-1][1] <= finish + 1e-6
    assert all(a < b for a, b in intervals)
    assert all(intervals[k][1] < intervals[k + 1][0] for k in range(len(intervals) - 1))
    used = max(fc.actual.value_at((a + b) / 2) for a, b in intervals)
    starts, ends, vals = fc.actual.slots(now, finish)
    unused = [
        v
        for s, e, v in zip(starts, ends, vals, strict=True)
        if not any(a < (s + e) / 2 < b for a, b in intervals) and e - s > 1e-6
    ]
    assert all(u >= used - 1e-9 for u in unused) or not unused


def test_a_job_that_must_start_now_starts_now_and_fifo_always_does():
    fc = _forecast([100, 1, 1, 1])
    late = QueuedJob(1, 1, 0.0, duration_s=3600, deadline_s=3600.0)
    snap = Snapshot(0.0, [late], fc)
    assert resolve_policy("lowest-window").plan(snap)[1] == Decision(0.0)
    free = QueuedJob(2, 1, 0.0, duration_s=1800, deadline_s=7200.0)
    assert resolve_policy("lowest-window").plan(Snapshot(0.0, [free], fc))[2].start_s == 1800
    assert Fifo().plan(Snapshot(5.0, [free], fc))[2] == Decision(5.0)
    with pytest.raises(SpecError, match="known: budget, budget-fifo, fifo, lowest-slots"):
        resolve_policy("greenest")


# -- the shared scheduler -------------------------------------------------------------------
def test_scheduler_is_strict_in_queue_order_and_wakes_for_planned_starts():
    class Later(Fifo):
        def plan(self, snapshot):
            return {j.id: Decision(100.0 if j.id == 3 else snapshot.now_s) for j in snapshot.jobs}

    sched = Scheduler(Later())
    sched.add([QueuedJob(1, 8, 1.0), QueuedJob(2, 1, 2.0), QueuedJob(3, 1, 0.5)])
    sched.add([QueuedJob(4, 1, 3.0, priority=5)])
    sched.plan(0.0)
    free = {"gpus": 4}

    def allocate(job, _decision):
        if job.gpus > free["gpus"]:
            return None
        free["gpus"] -= job.gpus
        return job.gpus

    started = sched.launchable(0.0, allocate)
    assert [j.id for j, _, _ in started] == [4]  # priority first; then 1 (8 GPUs) blocks 2
    assert sched.blocked().id == 1
    assert sched.next_start_s() == 100.0
    free["gpus"] = 16
    assert [j.id for j, _, _ in sched.launchable(100.0, allocate)] == [3, 1, 2]
    sched.withdraw(2)
    assert len(sched) == 0


# -- deadline rules -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "finish", "deadline"),
    [
        ("next-workday", "2020-01-06 12:00", "2020-01-06 12:00"),
        ("next-workday", "2020-01-06 17:00", "2020-01-06 17:00"),
        ("next-workday", "2020-01-06 17:30", "2020-01-07 09:00"),
        ("next-workday", "2020-01-07 06:00", "2020-01-07 09:00"),
        ("next-workday", "2020-01-10 18:00", "2020-01-13 09:00"),  # Friday evening
        ("next-workday", "2020-01-11 10:00", "2020-01-13 09:00"),
        ("next-workday:08:00-18:00", "2020-01-06 17:30", "2020-01-06 17:30"),
        ("semi-weekly", "2020-01-06 08:00", "2020-01-06 09:00"),
        ("semi-weekly", "2020-01-06 09:30", "2020-01-09 09:00"),
        ("semi-weekly", "2020-01-09 10:00", "2020-01-13 09:00"),
        ("semi-weekly:wed", "2020-01-09 10:00", "2020-01-15 09:00"),
        ("within:24h", "2020-01-06 12:00", "2020-01-07 12:00"),
    ],
)
def test_deadline_rules(rule, finish, deadline):
    got = DeadlineRule(rule).deadlines(np.array([ts(finish) - 3600]), np.array([3600.0]))
    assert got[0] == ts(deadline)


def test_deadline_rules_read_clock_times_in_the_scenario_zone():
    # Friday 18:30 in Berlin (CET) → Monday 09:00 CEST, after the switch to summer time
    got = DeadlineRule("next-workday").deadlines(
        np.array([ts("2023-03-24 17:30")]), np.zeros(1), "Europe/Berlin"
    )
    assert got[0] == ts("2023-03-27 07:00")
    assert np.isnan(DeadlineRule("none").deadlines(np.zeros(1), np.ones(1))[0])


@pytest.mark.parametrize("bad", ["weekly", "within", "within:soon", "semi-weekly:funday"])
def test_bad_deadline_rules_are_refused(bad):
    with pytest.raises(SpecError):
        DeadlineRule(bad)


# -- traces ----------------------------------------------------------------------------------
def test_philly_trace_is_read_sorted_and_moved_by_whole_weeks(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-03 06:13:03,2951.0,8,23608.0,b\n"
    )
    jobs = read_trace(path)
    assert list(jobs.gpus) == [8, 1] and list(jobs.duration_s) == [2951.0, 66.0]
    moved = shift_onto(jobs, ts("2023-01-01"), ts("2024-01-01"))
    for before, after in zip(jobs.submit_s, moved.submit_s, strict=True):
        a = datetime.fromtimestamp(before, UTC)
        b = datetime.fromtimestamp(after, UTC)
        assert b.year == 2023 and (a.weekday(), a.time()) == (b.weekday(), b.time())
        assert abs((b.replace(year=2017) - a).days) <= 4


def test_tiresias_and_spec_traces(tmp_path):
    tiresias = tmp_path / "t.csv"
    tiresias.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,1,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n"
    )
    jobs = shift_onto(read_trace(tiresias), ts("2023-05-01"), ts("2023-06-01"))
    assert list(jobs.submit_s) == [ts("2023-05-01"), ts("2023-05-01") + 30]
    assert jobs.names == ("vgg19", "vgg11")
    specs = tmp_path / "jobs.jsonl"
    rows = [
        {"submit": "2023-05-01T10:00:00", "duration": "2h", "gpus": "2-4", "within": "6h"},
        {"submit": "2023-05-01T09:00:00", "duration": 600, "interruptible": True},
    ]
    specs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    jobs = read_trace(specs)
    assert list(jobs.gpus) == [1, 4] and list(jobs.interruptible) == [1, -1]
    assert jobs.deadline_s[1] == ts("2023-05-01T16:00:00")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a,b\n1,2\n", "unknown trace format"),
        ("timestamp,duration,num_gpus\n2017-10-09 07:01:55,-5,1\n", "no positive duration"),
        ('{"submit": "2023-01-01", "duration": "soon"}\n', "invalid duration"),
        ('{"submit": "2023-01-01", "duration": 5, "colour": "red"}\n', "unknown field"),
    ],
)
def test_bad_traces_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / ("t.jsonl" if content.startswith("{") else "t.csv")
    path.write_text(content)
    with pytest.raises(SpecError, match=message):
        read_trace(path)


def test_a_binary_jsonl_trace_is_one_clear_error(tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b"\xbb\xff\x00garbage")
    with pytest.raises(SpecError, match="not a text file"):
        read_trace(path)
