"""The ``budget`` planner's shortcuts (issue 23: a replan of 1,000 jobs in 0.25 s) change
no answer: the floors that skip the pieces of a job that may be suspended are floors,
skipping changes no choice, and the grams per period are the integrals they stand for."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.forecasters import StepForecaster
from grid.steps import StepSeries
from orchestrator.planning.budgets import J_PER_KWH, Budget, Ledger
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies import cheapest
from orchestrator.planning.policies.base import QueuedJob, Snapshot
from orchestrator.planning.policies.periods import Periods
from orchestrator.planning.policies.pieces import min_piece_s, piece_intervals, runs, settle
from orchestrator.planning.policies.problem import Problem

T0 = 1_700_006_400.0  # a UTC midnight
SLOT = 900.0


def _problem(hours: list[float], runs_h: list[float], now_s: float = T0 + 500.0) -> Problem:
    curve = curve_for("a40")
    jobs = [
        QueuedJob(
            i,
            1 + i % 2,
            now_s,
            duration_s=3600.0 * h,
            deadline_s=now_s + 3600.0 * h + 10 * 3600,
            interruptible=True,
            model=JobModel(3600.0 * h, 1 + i % 2, curve),
            min_gpus=1,
            max_gpus=4,
        )
        for i, h in enumerate(runs_h)
    ]
    carbon = StepSeries(T0, 3600.0, np.array(hours * 4))
    snap = Snapshot(now_s, jobs, StepForecaster(carbon), total_gpus=4, slot_s=SLOT)
    snap.budget = Ledger(Budget.parse("1kg/day")).state(now_s)
    return Problem(snap)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hours=st.lists(st.floats(20, 600), min_size=24, max_size=24),
    run_h=st.floats(0.3, 3.0),
    lam=st.floats(1e-3, 50.0),
    seed=st.integers(0, 2**16),
)
def test_the_timed_floor_is_under_every_pieces_cost(hours, run_h, lam, seed):
    """With a budget, the floor ``_timed_options`` skips a configuration by is at most the
    price + end of any two or more pieces ``settle`` makes from any cover of the run."""
    p = _problem(hours, [run_h])
    periods = Periods(p)
    lambdas = np.full(len(periods.bounds), lam)
    first, last = int(p.rk[0]), min(int(p.slot_of(p.latest[0])), p.K)
    edges_a = np.maximum(p.t[first:last], p.release[0])
    lengths = p.t[first + 1 : last + 1] - edges_a
    per_s = lambdas[periods.slot_period[first:last]] * periods.slot_units[first:last] / p.slot
    free_g, free_w = p.free_gpus[first:last], p.free_w[first:last]
    args = (p, 0, free_g, free_w, per_s, edges_a, lengths, np.inf)
    options = cheapest._timed_options(*args, one_run=True)
    floors = {c: floor for floor, c, *_ in options}
    job, rng = p.jobs[0], np.random.default_rng(seed)
    shortest = min_piece_s(job.checkpoint_s, p.slot)
    for c, cfg in enumerate(p.configs[0]):
        price = per_s * cfg.power_w
        for _ in range(10):  # slots covering the run in a random order (what settle is
            # given: a cover with less than a slot to spare)
            order = rng.permutation(len(lengths))
            count = int(np.searchsorted(np.cumsum(lengths[order]), cfg.run_s - 1e-6)) + 1
            if count > len(lengths):
                continue
            mask = np.zeros(len(lengths), dtype=bool)
            mask[order[:count]] = True
            settled = settle(price, lengths, mask, cfg.run_s, shortest, job.checkpoint_s)
            if settled is None or len(runs(settled[0])) < 2:
                continue
            pieces = piece_intervals(
                price, lengths, edges_a, settled[0], cfg.run_s, shortest, job.checkpoint_s
            )
            cost = settled[1] + pieces[-1][1] - job.submitted_s
            assert c in floors and floors[c] <= cost + 1e-6 * max(1.0, cost)


def test_skipping_by_the_floors_changes_no_choice(monkeypatch):
    """Every job's pieces with the floors skipping as they do and with none skipped
    (each configuration settled): the same choice, or none that beats the bound."""
    p = _problem([300, 120, 80, 400, 500, 90] * 4, [0.4, 1.0, 1.6, 2.5, 0.8, 3.0])
    periods = Periods(p)
    full = cheapest._timed_options

    def unskipped(*a):  # every configuration, at no floor
        return [(-np.inf, *o[1:]) for o in full(*a[:-1], np.inf)]

    for lam in (0.01, 0.5, 5.0):
        lambdas = np.full(len(periods.bounds), lam)
        cost = periods.cost(lambdas)
        for j in range(len(p.jobs)):
            bound = float(np.where(p.meets[j], cost[j], np.inf).min())
            args = (p, j, p.free_gpus, p.free_w, periods, lambdas)
            fast = cheapest.cheapest_pieces(*args, bound)
            assert cheapest.cheapest_pieces(*args, bound) == fast  # kept for the next pass
            with monkeypatch.context() as m:
                m.setattr(cheapest, "_timed_options", unskipped)
                p.memo.clear()
                slow = cheapest.cheapest_pieces(*args, bound)
            beats = bound - 1e-9 * max(1.0, bound)
            if slow is not None and slow[2] < beats:
                assert fast is not None and fast[:2] == slow[:2] and fast[2] == slow[2]
            else:
                assert fast is None or fast[2] >= beats


def test_grams_per_period_are_the_integrals_over_each_period():
    p = _problem([300, 120, 80, 400, 500, 90] * 4, [0.4, 1.0, 2.5, 6.0], now_s=T0 + 80_000.0)
    periods = Periods(p)
    assert len(periods.bounds) >= 2
    watts = p.power_w[:, :, None]
    for i, (a, b) in enumerate(periods.bounds):
        s, e = np.clip(p.start, a, b), np.clip(p.end, a, b)
        direct = np.where(p.exists, watts * periods.signal.integral(s, e) / J_PER_KWH, 0)
        assert np.array_equal(periods.grams[i], direct)


def test_choices_kept_between_lambdas_are_the_ones_found_afresh():
    """λ's search evaluates only the jobs whose choice differs at the nearest λ below and
    above: every choice is the one a fresh evaluation of all jobs finds."""
    p = _problem([300, 120, 80, 400, 500, 90] * 4, [0.4, 1.0, 2.5, 6.0, 0.7, 1.3] * 3)
    periods = Periods(p)
    rng = np.random.default_rng(3)
    for log_lam in rng.uniform(-6, 9, 40):
        lambdas = np.zeros(len(periods.bounds))
        lambdas[0] = 10**log_lam
        kept = periods._best(lambdas)
        fresh = Periods(p)._best(lambdas)
        assert np.array_equal(kept, fresh)


def test_with_a_budget_the_pieces_are_two_or_more():
    """A run in one piece is the planner's own search (at every slot boundary): with a
    budget the pieces' search offers two or more pieces, or nothing."""
    p = _problem([300, 120, 80, 400, 500, 90] * 4, [0.4, 1.0, 1.6, 2.5, 0.8, 3.0])
    periods = Periods(p)
    found = 0
    for lam in (0.01, 0.5, 5.0):
        lambdas = np.full(len(periods.bounds), lam)
        for j in range(len(p.jobs)):
            best = cheapest.cheapest_pieces(p, j, p.free_gpus, p.free_w, periods, lambdas)
            assert best is None or len(best[1]) >= 2
            found += best is not None
    assert found
