"""Plans on the signal's own grid: slots start on UTC boundaries of the slot (so on a
signal's intervals), not at the moment the planner runs; pieces of a job that may be
suspended are each worth the checkpoint and restart they cost."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grid.forecasters import StepForecaster
from grid.steps import StepSeries
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import QueuedJob, Snapshot
from orchestrator.planning.policies.pieces import MIN_PIECE_S, piece_intervals, settle

Q = 900.0  # a 15-minute signal and slot
A40 = curve_for("a40")
DAY0 = datetime(2023, 3, 6, tzinfo=UTC).timestamp()
T1015 = DAY0 + 10 * 3600 + 15 * 60


def forecast(values) -> StepForecaster:
    return StepForecaster(StepSeries(DAY0, Q, np.asarray(values, dtype=float)))


def job(run_s: float, interruptible: bool = False, **kw) -> QueuedJob:
    return QueuedJob(
        1, 1, DAY0, duration_s=run_s, deadline_s=DAY0 + 20 * 3600, interruptible=interruptible,
        model=JobModel(run_s, 1, A40), **kw,
    )  # fmt: skip


def plan(j: QueuedJob, values, now_s: float):
    snap = Snapshot(now_s, [j], forecast(values), total_gpus=8, slot_s=Q)
    d = resolve_policy("budget").plan(snap)[1]
    return d.intervals or ((d.start_s, d.end_s),)


def test_a_start_never_lands_in_the_high_slot_just_before_a_low_one():
    # high until 10:15, low to 11:00, high after; the planner runs at 10:14:46
    values = np.full(96, 500.0)
    values[41:44] = 100.0
    now = T1015 - 14
    for interruptible in (False, True):
        pieces = plan(job(45 * 60, interruptible), values, now)
        assert pieces[0][0] == T1015, (interruptible, pieces[0][0] - T1015)
        assert all(a >= T1015 for a, _ in pieces)


def test_no_piece_is_shorter_than_its_checkpoint():
    # the three 100s take 45 of the 50 minutes (more at a lower cap); the rest in the lone
    # 101 slot would be a piece shorter than the checkpoint (15 min): it goes to the low
    # run's edge instead
    values = np.full(96, 900.0)
    values[1], values[4:7] = 101.0, 100.0
    pieces = plan(job(50 * 60, True, checkpoint_s=900.0), values, DAY0)
    assert all(b - a >= 900.0 - 1e-6 for a, b in pieces), pieces
    assert all(a >= DAY0 + 3 * Q for a, _ in pieces), pieces  # the lone slot is not used


def test_a_split_that_saves_less_than_a_restart_is_not_made():
    # two low half hours with a slightly higher quarter between: suspending for it saves
    # 15 min × 5 g/kWh, a restart costs 10 min at 100 g/kWh
    values = np.full(96, 900.0)
    values[0:2], values[2], values[3:5] = 100.0, 105.0, 100.0
    pieces = plan(job(3600.0, True, checkpoint_s=600.0), values, DAY0)
    assert len(pieces) == 1, pieces
    # where the saving is worth it (the gap is high), it still splits, the restart's
    # 10 min taken after the second low half hour
    values[2], values[5] = 900.0, 300.0
    assert len(plan(job(3600.0, True, checkpoint_s=600.0), values, DAY0)) == 2


class _Chain:
    """A 15-minute signal: high until 10:15, low to 11:00, high after."""

    spec = "test"
    errors: tuple[str, ...] = ()

    def forecast(self, issued_at, horizon):
        import pandas as pd

        from grid.signal import CARBON, Signal, SignalMeta

        index = pd.date_range(datetime.fromtimestamp(DAY0, UTC), periods=192, freq="15min")
        values = np.full(192, 500.0)
        values[41:44] = 100.0
        frame = pd.DataFrame({CARBON: values}, index=index)
        return Signal(frame, SignalMeta("test", "x", CARBON, "g/kWh", int(Q)))

    def history(self, start, end):
        return self.forecast(start, end - start)


def test_the_daemons_planner_starts_on_the_signals_interval_and_carries_the_setting():
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.queue.models import Job
    from orchestrator.settings import DaemonSettings
    from orchestrator.signals.feed import SignalFeed

    now = datetime.fromtimestamp(T1015 - 14, UTC)  # the daemon passes 14 s before 10:15
    feed = SignalFeed(_Chain(), horizon_s=86400, lookback_s=3600)
    assert feed.refresh(now)
    planner = LivePlanner(resolve_policy("budget"), Q, A40, feed=feed)
    job = Job(id=1, state="queued", user="a", uid=1000, command=["x"], workdir="/",
              gpus_min=1, gpus_max=1, submitted_at=now, duration_s=2700.0,
              deadline=datetime.fromtimestamp(DAY0 + 86400, UTC))  # fmt: skip
    scheduler = planner.schedule(now, [job], {}, [], 8, 8, 0.0)
    assert scheduler.decision_of(1).start_s == T1015
    # the lab's checkpoint cost reaches the jobs the policy plans
    assert DaemonSettings().seconds("checkpoint_cost") == 300.0
    planner.checkpoint_s = DaemonSettings(checkpoint_cost="10m").seconds("checkpoint_cost")
    planned = planner.schedule(now, [job], {}, [], 8, 8, 0.0).planned()
    assert planned[0][0].checkpoint_s == 600.0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(st.floats(50, 500), st.just(np.inf)), min_size=3, max_size=40),
    st.floats(1, 900),
    st.floats(0.01, 1),
    st.sampled_from([0.0, 300.0, 600.0, 1800.0]),
)
def test_settled_pieces_cover_the_run_and_its_restarts_and_none_is_short(
    prices, first_s, share, checkpoint_s
):
    price = np.asarray(prices)
    lengths = np.full(len(price), Q)
    lengths[0] = first_s  # the first slot, partly past
    starts = np.concatenate(([0.0], first_s + Q * np.arange(len(price) - 1)))
    room = float(lengths[np.isfinite(price)].sum())
    assume(room > 60)
    run_s = max(60.0, share * room)
    order = np.argsort(price, kind="stable")
    mask = np.zeros(len(price), dtype=bool)
    mask[order[: int(np.searchsorted(np.cumsum(lengths[order]), run_s - 1e-6)) + 1]] = True
    min_piece_s = max(checkpoint_s, MIN_PIECE_S)
    settled = settle(price, lengths, mask, run_s, min_piece_s, checkpoint_s)
    if settled is None:
        return  # the planner keeps the job in one piece
    mask, cost = settled
    assert np.isfinite(cost) and np.isfinite(price[mask]).all()
    pieces = piece_intervals(price, lengths, starts, mask, run_s, min_piece_s, checkpoint_s)
    # each restart loses a checkpoint's worth of run time, which the pieces hold too
    assert sum(b - a for a, b in pieces) == pytest.approx(run_s + (len(pieces) - 1) * checkpoint_s)
    if len(pieces) > 1:
        assert min(b - a for a, b in pieces) >= min(min_piece_s, run_s) - 1e-6


def test_a_piece_that_can_start_now_is_not_trimmed_at_its_start():
    # the first slot (partly past) is the dearest of the run; trimming its start would
    # move the start a few seconds later on every replan, so the surplus comes off the end
    price = np.array([300.0, 100.0, 100.0, 900.0])
    lengths = np.array([600.0, Q, Q, Q])
    starts = np.array([0.0, 600.0, 1500.0, 2400.0])
    mask = np.array([True, True, True, False])
    mask, _ = settle(price, lengths, mask, 2370.0, 1800.0, 300.0)
    assert piece_intervals(price, lengths, starts, mask, 2370.0, 1800.0, 300.0) == ((0.0, 2370.0),)


def test_pieces_hold_their_restarts_and_end_by_the_deadline():
    # a 2 h job, restarts costing 30 min, due in 3 h; low at both ends: two 1 h pieces
    # would leave the restart's 30 min past the deadline
    values = np.full(96, 900.0)
    values[0:4], values[8:12] = 100.0, 100.0
    j = dataclasses.replace(job(7200.0, True, checkpoint_s=1800.0), deadline_s=DAY0 + 3 * 3600)
    pieces = plan(j, values, DAY0)
    run_s = 7200.0 if len(pieces) == 1 else sum(b - a for a, b in pieces) - 1800.0
    assert run_s >= 7200.0 - 1e-6, pieces  # the job's work (at a cap, more) and the restart
    assert pieces[-1][1] <= DAY0 + 3 * 3600 + 1e-6, pieces


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([100.0, 300.0, 500.0, 900.0]), min_size=40, max_size=120),
    st.sampled_from([600.0, 3600.0, 7200.0, 20000.0]),
    st.sampled_from([1.0, 300.0, 1800.0, 7200.0]),
    st.floats(0, Q),
    st.floats(1.0, 4.0),
)
def test_planned_pieces_end_by_the_deadline_restarts_included(values, run_s, ck, late_s, slack):
    now = DAY0 + late_s
    j = QueuedJob(1, 1, DAY0, duration_s=run_s, deadline_s=now + run_s * slack,
                  interruptible=True, model=JobModel(run_s, 1, A40), checkpoint_s=ck)  # fmt: skip
    pieces = plan(j, values, now)
    if len(pieces) > 1:
        assert sum(b - a for a, b in pieces) >= run_s + (len(pieces) - 1) * ck - 1e-6, pieces
    assert pieces[-1][1] <= j.deadline_s + 1e-6, pieces
