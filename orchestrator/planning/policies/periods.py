"""The budget periods one plan of the ``budget`` policy touches (``Periods``): the grams
each option spends in each, what is left of each after what runs and stands, what the
queued jobs may spend of it (the rest is kept for the jobs expected to arrive), and λ per
period, the price of a gram that keeps the plan within that.

For an energy budget, "grams" are watt-hours (``Budget.measure``).
"""

from __future__ import annotations

import bisect
import functools
import itertools

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.policies.problem import Problem

# Budget kept for the jobs still to arrive in a period: the GPU-seconds of the recent
# load less the queued jobs' share of it (they are the recent arrivals, planned already),
# times LOAD_HEDGE and at most ARRIVAL_HEDGE full clusters, over the rest of the period,
# at the grams per GPU-second the queued jobs reach when frugal. Arrivals come in bursts
# the recent load does not foresee, and the queue's frugal grams per GPU-second
# understate theirs: on Philly jobs 69,000-69,299 (256 GPUs, within:24h, half
# interruptible, `benchmarks/planner.py --budgets-only --jobs 300`), the worst adherence
# over its eight budget runs was 1.024 with these (as with a full cluster x 2 whatever
# the load), 1.064 with LOAD_HEDGE 4 and 1.164 with the load x 2 and no queue taken off.
LOAD_HEDGE = 8.0
ARRIVAL_HEDGE = 2.0
# A budget that renews (per day, week or month) keeps less: what the queue leaves unspent
# is lost at the period's end, and arrivals a burst brings can wait into the next period.
# On the benchmark's daily budget (Philly jobs 69,000-69,999 on DE-LU, 80 % of fifo's
# carbon per day) the reserve above exceeded what was left of most days: the queue
# waited for its deadlines (742 starts forced, worst day 1.20 × the budget, mean JCT
# 16.7 h); with these, 4.9 h, worst day 0.99, none forced (with 1 and 1 a whole-run
# budget overran by 13 %: it has no next period).
PERIODIC_LOAD_HEDGE = 2.0
PERIODIC_ARRIVAL_HEDGE = 1.0
LAMBDA_MAX = 1e9  # seconds per gram: carbon dominates completion time
LOG_LAMBDA_MIN = -6.0
BISECT_STEPS = 16  # log10 λ over 15 decades to within 0.001
BISECT_TOL = (np.log10(LAMBDA_MAX) - LOG_LAMBDA_MIN) / 2**BISECT_STEPS
WARM_SPAN = 0.125  # decades either side of the last replan's λ, doubled until it holds


class Periods:
    """The budget periods the horizon touches, the grams each option spends in each, what
    is left of each after what is committed, and the share of that the queued jobs may
    spend (``target``: the rest is kept for the jobs expected to arrive in the period).

    For an energy budget, "grams" are watt-hours (``Budget.measure``)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = p = problem
        self.state = state = p.snapshot.budget
        budget = state.budget
        self.signal = signal = budget.measure(p.carbon)
        # to the end of the last commitment too: a job running past the queue's horizon
        # spends there, and that is no longer the queue's to spend
        end = max([p.t_end, *(c.end_s for c in p.snapshot.committed)])
        cuts = [p.now, *budget.boundaries(p.now, end), end]
        self.bounds = list(itertools.pairwise(cuts))
        n = len(self.bounds)
        self.left = np.full(n, budget.grams)
        self.left[0] = state.remaining_g
        watts = p.power_w[:, :, None]
        self.grams = np.empty((n, *p.start.shape))
        # ∫ to each option's start and end once; clipped to a period, the value at its
        # bound (the same numbers as integrating from the clipped times)
        at_start, at_end = p.cumulative(signal, "start"), p.cumulative(signal, "end")
        for i, (a, b) in enumerate(self.bounds):
            at_a, at_b = signal.cumulative(a), signal.cumulative(b)
            s = np.where(p.start < a, at_a, np.where(p.start > b, at_b, at_start))
            e = np.where(p.end < a, at_a, np.where(p.end > b, at_b, at_end))
            e -= s  # watts × (e − s) / J_PER_KWH, in place (the same numbers)
            e = np.multiply(watts, e, out=e)
            e /= J_PER_KWH
            self.grams[i] = np.where(p.exists, e, 0)
            for c in p.snapshot.committed:
                s_c, e_c = np.clip(max(c.start_s, p.now), a, b), np.clip(c.end_s, a, b)
                self.left[i] -= c.power_w * float(signal.integral(s_c, e_c)) / J_PER_KWH
        jobs = p.jobs
        submitted = np.array([j.submitted_s for j in jobs])[:, None, None]
        self.jct = np.where(p.exists, p.end - submitted, np.inf)
        # the period each slot falls in, for the slot costs of jobs that may be suspended
        mids = (p.t[:-1] + p.t[1:]) / 2
        self.slot_period = np.searchsorted(cuts[1:-1], mids, side="right")
        self.slot_units = p.per_slot(signal) / J_PER_KWH  # per watt, per slot
        self._kept: tuple | None = None  # (key, cost) of ``_best``'s fixed periods
        self.base, self.arrivals = self._expected()
        self.target = self._pace()

    def _expected(self) -> tuple[np.ndarray, np.ndarray]:
        """Per period: the grams of the queued jobs' most frugal options, and what is kept
        for the jobs expected to arrive in it: the snapshot's expected load (a share of
        the GPUs) less the queued jobs' share of it (submitted within the deferral window,
        the load's), times ``LOAD_HEDGE`` and at most ``ARRIVAL_HEDGE`` full clusters,
        from now to the period's end or the end of arrivals, at the grams per GPU-second
        the queued jobs reach when frugal."""
        p, n = self.problem, len(self.bounds)
        base = self.choose(np.full(n, LAMBDA_MAX))
        snap, state = p.snapshot, self.state
        load = snap.expected_load
        arrivals = np.zeros(n)
        self.window_s = np.zeros(n)  # seconds of arrivals still to come in each period
        stop = state.arrivals_end_s
        for i, (a, _) in enumerate(self.bounds):
            end = state.budget.period_of(a)[1]
            if stop is not None:
                end = min(end, stop)
            elif not np.isfinite(end):
                end = p.now + snap.horizon_s
            self.window_s[i] = max(0.0, end - a)
        if load <= 0 or snap.total_gpus is None or not p.jobs:
            return base, arrivals
        best = self._best(np.full(n, LAMBDA_MAX))
        c, _ = np.unravel_index(best, p.start.shape[1:])
        rows = np.arange(len(p.jobs))
        gpu_s = float(np.sum(p.gpus[rows, c] * np.where(p.has[rows, c], p.run_s[rows, c], 0)))
        per_gpu_s = float(base.sum()) / gpu_s if gpu_s > 0 else 0.0
        # the queued jobs' share of the load (each at most the window, as it counts them)
        window = max(snap.max_defer_s, p.slot)
        submitted = np.array([j.submitted_s for j in p.jobs])
        run_s = np.minimum(np.where(p.has[rows, c], p.run_s[rows, c], 0.0), window)
        queued = p.gpus[rows, c] * np.where(submitted >= p.now - window, run_s, 0.0)
        arriving = max(load - float(queued.sum()) / (window * snap.total_gpus), 0.0)
        if state.budget.period == "run":
            clusters = min(LOAD_HEDGE * arriving, ARRIVAL_HEDGE)
        else:
            clusters = min(PERIODIC_LOAD_HEDGE * arriving, PERIODIC_ARRIVAL_HEDGE)
        expected = clusters * snap.total_gpus * self.window_s  # GPU-seconds
        return base, per_gpu_s * expected

    def _pace(self) -> np.ndarray:
        """What the queued jobs may spend in each period: what is left of it, less what the
        jobs expected to arrive in it need at the least, less the arrivals' share of the
        slack (what is left beyond everyone's least), shared by least need."""
        need = self.base + self.arrivals
        slack = np.maximum(self.left - need, 0.0)
        share = np.divide(self.base, need, out=np.ones_like(need), where=need > 0)
        return np.maximum(self.left - self.arrivals - (1.0 - share) * slack, 0.0)

    def spend(self, pieces, watts) -> np.ndarray:
        """Grams each period gets from running ``pieces`` ((start, end) pairs) at
        ``watts`` (one value, or one per piece)."""
        signal = self.signal
        watts = np.broadcast_to(np.asarray(watts, dtype=float), (len(pieces),))
        out = np.zeros(len(self.bounds))
        for w, (a, b) in zip(watts, pieces, strict=True):
            for i, (pa, pb) in enumerate(self.bounds):
                lo, hi = max(a, pa), min(b, pb)
                if hi > lo:
                    out[i] += w * float(signal.integral(lo, hi)) / J_PER_KWH
        return out

    def cost(self, lambdas: np.ndarray) -> np.ndarray:
        """JCT + Σ λ × grams of every option, a period at a time (not BLAS's tensordot,
        whose threads wait on a busy core: 3x slower here; sums equal to an ulp)."""
        out = self.jct.copy()
        for lam, grams in zip(lambdas.tolist(), self.grams, strict=True):
            if lam:
                out += lam * grams
        return out

    def _best(self, lambdas: np.ndarray) -> np.ndarray:
        """Each job's cheapest deadline-meeting option (flat over C × S), no capacity; the
        earliest start at full power where none meets its deadline.

        The search for λ prices one period at a time, the earlier ones' λ fixed and the
        later ones' 0: the cost of all but the last priced period is kept between calls,
        and each choice found at a λ of that period. A job whose choice is the same at the
        nearest λ below and above is the same in between (its cost is the least of lines
        in λ): only the others are evaluated."""
        p = self.problem
        n = len(p.jobs)
        priced = np.flatnonzero(lambdas)
        i = int(priced[-1]) if len(priced) else 0
        key = (i, lambdas[:i].tobytes())
        if self._kept is None or self._kept[0] != key:
            head = self.cost(np.where(np.arange(len(lambdas)) < i, lambdas, 0.0))
            self._kept = (key, np.where(p.meets, head, np.inf).reshape(n, -1), [], [])
        _, base, at, found = self._kept
        lam = float(lambdas[i])
        k = bisect.bisect_left(at, lam)
        if k < len(at) and at[k] == lam:
            return found[k].copy()
        if 0 < k < len(at):
            best = found[k - 1].copy()
            rows = np.flatnonzero(found[k - 1] != found[k])
        else:
            best, rows = np.zeros(n, dtype=np.int64), slice(None)
        if isinstance(rows, slice) or len(rows):
            grams = self.grams[i].reshape(n, -1)[rows]
            flat = np.multiply(grams, lam, out=None if isinstance(rows, slice) else grams)
            flat += base[rows]
            choice = flat.argmin(axis=1)
            forced = ~np.isfinite(flat[np.arange(len(choice)), choice])
            choice[forced] = np.ravel_multi_index((0, 0), p.start.shape[1:])
            best[rows] = choice
        at.insert(k, lam)
        found.insert(k, best.copy())
        return best

    def choose(self, lambdas: np.ndarray) -> np.ndarray:
        """Grams per period of each job's cheapest deadline-meeting option, no capacity."""
        best = self._best(lambdas)
        grams = self.grams.reshape(len(self.bounds), len(self.problem.jobs), -1)
        return grams[:, np.arange(len(best)), best].sum(axis=1)

    def keys(self) -> list[float]:
        """Each period's start (the key λ is carried between replans by)."""
        return [self.state.budget.period_of(a)[0] for a, _ in self.bounds]

    def find_lambdas(self, warm: dict[float, float] | None = None) -> np.ndarray:
        """Per period, the least λ (to ``BISECT_TOL`` in log10) whose choices keep within
        its target. ``warm``: the last replan's λ by period start, where the bisection
        starts from a narrow bracket around it (widened until it holds the answer)."""
        lambdas = np.zeros(len(self.bounds))
        warm = warm or {}
        for i, key in enumerate(self.keys()):
            if self.choose(lambdas)[i] <= self.target[i]:
                continue
            fits = functools.partial(self._fits, lambdas, i)
            lo, hi = LOG_LAMBDA_MIN, np.log10(LAMBDA_MAX)  # bisect log10 λ
            steps = BISECT_STEPS
            last = warm.get(key, 0.0)
            if last > 0:
                lo, hi = _bracket(fits, float(np.clip(np.log10(last), lo, hi)), lo, hi)
                steps = max(0, int(np.ceil(np.log2(max(hi - lo, BISECT_TOL) / BISECT_TOL))))
            for _ in range(steps):
                mid = (lo + hi) / 2
                if fits(mid):
                    hi = mid
                else:
                    lo = mid
            lambdas[i] = 10**hi
        return lambdas

    def _fits(self, lambdas: np.ndarray, i: int, log_lambda: float) -> bool:
        lambdas[i] = 10**log_lambda
        return bool(self.choose(lambdas)[i] <= self.target[i])

    def over(self, spent: np.ndarray, paced: bool = True) -> np.ndarray:
        """Periods where ``spent`` passes the queued jobs' share (``paced``) or all that
        is left of the budget."""
        limit = self.target if paced else self.left
        return spent > limit + 1e-6 * np.maximum(1.0, np.abs(limit))


def _bracket(fits, x: float, lo: float, hi: float) -> tuple[float, float]:
    """(lo, hi) in log10 λ around ``x`` with ``fits`` false at lo (or lo the least) and
    true at hi: from ``x`` ± ``WARM_SPAN``, doubling the step until it holds."""
    step = WARM_SPAN
    if fits(x):
        top = x
        while top > lo:
            below = max(top - step, lo)
            if not fits(below):
                return below, top
            top, step = below, 2 * step
        return lo, lo
    bottom = x
    while bottom < hi:
        above = min(bottom + step, hi)
        if fits(above):
            return bottom, above
        bottom, step = above, 2 * step
    return hi, hi
