"""``budget``: the default planner, a fast heuristic in the spirit of GreenFlow; and
``budget-fifo``, what a lab does by hand.

``budget`` plans every queued job together on the slot grid of ``Problem``. Jobs are placed
one by one (``placement_order``: those that must start now first) into the capacity left
by running jobs and by the jobs placed before them (on a cluster of several GPU types, a
job too wide for the smaller types only where the larger ones have room: ``tiers``),
keeping room in later slots for the load expected to arrive; each takes its cheapest
option that meets its latest finish:

- with no budget, the cheapest in the objective (carbon, cost or a mix): it waits for low
  slots, runs at the power cap where a joule buys the most work, and for a job that may be
  suspended, runs only in the lowest slots before its deadline;
- with a budget, the option with the least completion time + λ × grams, where λ (seconds
  of completion time a gram is worth) is the smallest that keeps the plan within what the
  queue may spend of each budget period (``Periods.target``: what is left, less what the
  jobs expected to arrive need). λ is found by bisection on the jobs' choices without
  capacity, then checked (and raised) with it. Where the plan still goes over, the plan
  without the budget is taken if it spends no more over all the periods it touches and,
  in the period now, no more than is left (or than the budgeted plan). A low λ widens
  and uncaps jobs to finish sooner; a high one shrinks, caps and defers them into
  low-carbon slots or the next period. That is GreenFlow's rule of spending the budget
  where it buys the most completion time per gram.

A job that no option lets meet its deadline starts as early as capacity allows at full
speed, whatever the carbon: its decision is marked ``forced``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.policies.base import Decision, Plan, Policy, Snapshot
from orchestrator.planning.policies.cheapest import cheapest_pieces
from orchestrator.planning.policies.periods import LAMBDA_MAX, Periods
from orchestrator.planning.policies.problem import Problem, full_power


class BudgetPlanner(Policy):
    name = "budget"
    needs_forecast = True
    replans_all = True
    replan_every_s = 900.0

    def __init__(self) -> None:
        # λ per budget period (by its start) found by the last replan: the next starts
        # its search there (a warm start: the same λ to the bisection's tolerance)
        self.lambdas: dict[float, float] = {}

    def plan(self, snapshot: Snapshot) -> Plan:
        if not snapshot.jobs:
            return {}
        return heuristic(Problem(snapshot), self.lambdas).plan


def heuristic(problem: Problem, carried: dict[float, float] | None = None) -> Result:
    """The plan (and each job's chosen option) of the ``budget`` heuristic. ``carried``:
    λ by period start from the last replan, updated with this one's (None: from scratch)."""
    if problem.snapshot.budget is None:
        return greedy(problem, problem.obj_cost)
    periods = Periods(problem)
    lambdas = periods.find_lambdas(carried)
    if carried is not None:
        carried.clear()
        carried.update(zip(periods.keys(), lambdas.tolist(), strict=True))
    result = greedy(problem, periods.cost(lambdas), periods, lambdas)
    for _ in range(6):  # capacity moved jobs: raise λ where a period went over
        over = periods.over(result.carbon_by_period)
        if not over.any() or np.all(lambdas[over] >= LAMBDA_MAX):
            break
        lambdas = np.where(over, np.maximum(lambdas * 4, 1e-3), lambdas)
        lambdas = np.minimum(lambdas, LAMBDA_MAX)
        result = greedy(problem, periods.cost(lambdas), periods, lambdas)
    if periods.over(result.carbon_by_period).any():
        # still over: the plan without the budget, if it spends no more over all the
        # periods it touches (a budget never makes the queue spend more than no budget)
        # and, in the period now, within what is left or no more than the budgeted plan
        # (later periods are replanned before they come)
        free = greedy(problem, problem.obj_cost, periods)
        spent, alt = result.carbon_by_period, free.carbon_by_period
        total = spent.sum()
        kept = not periods.over(alt, paced=False)[0] or alt[0] <= spent[0] * (1 + 1e-9)
        if alt.sum() <= total + 1e-6 * max(1.0, total) and kept:
            result = free
    result.periods = periods
    _mark_budget_breaks(problem, periods, result)
    return result


def _mark_budget_breaks(problem: Problem, periods: Periods, result: Result) -> None:
    """Where a period still goes over, mark the jobs that spend in it although they have
    to (no option meeting their deadline spends nothing there): the plan's report of a
    deadline that broke the budget."""
    over = np.flatnonzero(periods.over(result.carbon_by_period, paced=False))
    if not len(over):
        return
    for j, (c, s, intervals, forced) in result.choice.items():
        if forced or s is None:
            continue
        for i in over:
            if periods.grams[i, j, c, s] <= 0:
                continue
            avoidable = np.where(problem.meets[j], periods.grams[i, j], np.inf).min() <= 0
            if not avoidable:
                job_id = problem.jobs[j].id
                result.plan[job_id] = replace(result.plan[job_id], forced=True)
                result.choice[j] = (c, s, intervals, True)
                break


class Result:
    def __init__(self, n_periods: int) -> None:
        self.plan: Plan = {}
        self.carbon_by_period = np.zeros(n_periods)
        # per job (by position): (config, start index or None, intervals, forced)
        self.choice: dict[int, tuple[int, int | None, tuple, bool]] = {}
        self.periods: Periods | None = None


def greedy(
    problem: Problem,
    cost: np.ndarray,
    periods: Periods | None = None,
    lambdas: np.ndarray | None = None,
) -> Result:
    """Place the jobs in ``placement_order``, each at its cheapest option that fits. A
    job that finds no room to meet its deadline bumps jobs with more slack that were
    placed before it (at most four times each) and they are placed again after it.

    ``periods``: add up each period's grams of the plan; ``lambdas``: the budget's prices
    (None: the objective's, and its placement order, as with no budget)."""
    p = problem
    result = Result(len(periods.bounds) if periods else 0)
    free_g, free_w = p.free_gpus.copy(), p.free_w.copy()
    room = free_g - p.reserved  # what the queue may plan on, leaving room for arrivals
    tiers = p.free_tiers.copy()  # by GPU type, on a cluster of several (``tiers``)
    jobs = p.jobs
    order = placement_order(p, shortest_first=lambdas is not None)
    todo = deque(order)
    placed: dict[int, tuple] = {}  # job -> (config, intervals)
    bumps: dict[int, int] = {}
    slack = p.latest - np.nanmin(np.where(p.has, p.run_s, np.nan), axis=1)
    while todo:
        j = todo.popleft()
        fits = p.fits(j, p.room_for(j, room, tiers), free_w)
        options = np.where(fits & p.meets[j], cost[j], np.inf)
        c, s, best = _cheapest(options, p.end[j])
        intervals = None
        if jobs[j].interruptible:
            alt = cheapest_pieces(p, j, p.room_for(j, room, tiers), free_w, periods, lambdas,
                                  best)  # fmt: skip
            if alt is not None and alt[2] < best - 1e-9 * max(1.0, abs(best)):
                c, intervals, best = alt[0], alt[1], alt[2]
        victims: list[int] = []
        if not np.isfinite(best):
            # room taken by plans of jobs with more slack: bump them, if that makes room
            own = p.room_for(j, p.free_gpus, p.free_tiers)
            alone = np.where(p.fits(j, own, p.free_w) & p.meets[j], cost[j], np.inf)
            c, s, best = _cheapest(alone, p.end[j])
            if np.isfinite(best):
                cfg = p.configs[j][c]
                span = (float(p.start[j, c, s]), float(p.end[j, c, s]))
                victims = _bump(p, j, cfg, span, placed, bumps, slack, free_g, free_w, room,
                                tiers)  # fmt: skip
                if victims is None:
                    best, victims = np.inf, []
        forced = not np.isfinite(best)
        if forced:  # the deadline guard: the earliest start that fits, full speed
            c, s = 0, -1
            start = _earliest_fit(p, j, p.configs[j][0], p.room_for(j, free_g, tiers), free_w)
            intervals = ((start, start + p.configs[j][0].run_s),)
        cfg = p.configs[j][c]
        split = intervals is not None and not forced
        if intervals is None:
            start = float(p.start[j, c, s])
            intervals = ((start, start + cfg.run_s),)
        p.reserve(free_g, free_w, cfg.gpus, cfg.power_w, intervals, tiers)
        p.reserve(room, None, cfg.gpus, 0.0, intervals)
        placed[j] = (cfg, intervals)
        result.choice[j] = (c, None if split else s, intervals, forced)
        todo.extendleft(reversed(victims))
    for j, (c, s, intervals, forced) in result.choice.items():
        cfg = p.configs[j][c]
        split = s is None
        on_grid = s is not None and s >= 0
        result.plan[jobs[j].id] = Decision(
            intervals[0][0],
            intervals if split else None,
            gpus=cfg.gpus,
            cap=cfg.cap,
            end_s=intervals[-1][1],
            power_w=cfg.power_w,
            forced=forced,
        )
        if periods is None:
            continue
        if on_grid:
            result.carbon_by_period += periods.grams[:, j, c, s]
        else:
            result.carbon_by_period += periods.spend(intervals, cfg.power_w)
    return result


def _earliest_fit(p: Problem, j: int, cfg, free_g, free_w) -> float:
    """The first start (now, or a slot boundary) from which ``cfg`` finds its GPUs and
    watts in every slot of the horizon it covers; the horizon's end if none. A job that
    draws more than the whole site limit needs all of it (it runs alone, the limit's
    admission capping it): else no slot ever fits and each replan defers it again."""
    limit_w = p.snapshot.power_limit_w
    need_w = cfg.power_w if limit_w is None else min(cfg.power_w, float(limit_w))
    bad = (free_g < cfg.gpus - 1e-9) | (free_w < need_w - 1e-6)
    cum = np.concatenate(([0], np.cumsum(bad)))
    m = max(1, int(np.ceil(cfg.run_s / p.slot - 1e-9)))
    k = np.arange(int(p.rk[j]), p.K)
    ok = (cum[np.minimum(k + m, p.K)] - cum[k]) == 0
    if not ok.any():
        return float(p.t[-1])
    first = int(k[np.argmax(ok)])
    return float(max(p.t[first], p.release[j]))


def _bump(p, j, cfg, span, placed, bumps, slack, free_g, free_w, room, tiers) -> list[int] | None:
    """Take placed jobs with more slack than job j off the plan until j's option fits.
    Returns them, or None (and nothing changes) when that cannot make room."""
    a, b = p.slot_range(*span)

    def short() -> bool:
        g = p.room_for(j, free_g, tiers)
        return bool((g[a:b] < cfg.gpus - 1e-9).any() or (free_w[a:b] < cfg.power_w - 1e-6).any())

    candidates = []
    for v, (_, pieces) in placed.items():
        if bumps.get(v, 0) >= 4 or slack[v] < slack[j]:
            continue
        if any(p.slot_range(x, y)[0] < b and p.slot_range(x, y)[1] > a for x, y in pieces):
            candidates.append(v)
    candidates.sort(key=lambda v: -slack[v])
    taken: list[tuple] = []
    for v in candidates:
        if not short():
            break
        vcfg, pieces = placed.pop(v)
        p.reserve(free_g, free_w, -vcfg.gpus, -vcfg.power_w, pieces, tiers)
        p.reserve(room, None, -vcfg.gpus, 0.0, pieces)
        taken.append((v, vcfg, pieces))
    if short():
        for v, vcfg, pieces in taken:  # undo
            placed[v] = (vcfg, pieces)
            p.reserve(free_g, free_w, vcfg.gpus, vcfg.power_w, pieces, tiers)
            p.reserve(room, None, vcfg.gpus, 0.0, pieces)
        return None
    for v, _, _ in taken:
        bumps[v] = bumps.get(v, 0) + 1
    return [v for v, _, _ in taken]


def placement_order(p: Problem, shortest_first: bool = False) -> list[int]:
    """Jobs that must start within two slots first (by latest start). Then, minimising
    the objective, the ones hard to fit (in one piece, then the biggest in GPU-seconds)
    and the rest; under a budget, where the aim is completion time, the smallest first."""
    jobs = p.jobs
    fastest = np.nanmin(np.where(p.has, p.run_s, np.nan), axis=1)
    latest_start = p.latest - fastest
    urgent = latest_start <= p.now + 2 * p.slot
    size = np.array([j.gpus * (j.duration_s or 0.0) for j in jobs])

    def key(j: int):
        if urgent[j]:
            return (0, latest_start[j], 0.0)
        if shortest_first:
            return (1, size[j], jobs[j].submitted_s)
        return (1 + int(jobs[j].interruptible), -size[j], jobs[j].submitted_s)

    return sorted(range(len(jobs)), key=key)


def _cheapest(options: np.ndarray, ends: np.ndarray) -> tuple[int, int, float]:
    """The cheapest option (C, S); among near-ties, the earliest end."""
    low = options.min()
    if not np.isfinite(low):
        return 0, 0, np.inf
    near = options <= low + 1e-9 * max(1.0, abs(low))
    c, s = divmod(int(np.where(near, ends, np.inf).argmin()), options.shape[1])
    return c, s, float(options[c, s])


class BudgetFifo(Policy):
    """FIFO at full power that stops starting jobs while the next one would take the
    period's spending (what has run, what is running, and that job, to the period's end,
    by the forecast) over the budget, and resumes when the period turns. A job whose
    deadline cannot wait any longer starts anyway (``forced``)."""

    name = "budget-fifo"
    needs_forecast = True
    replans_all = True

    def plan(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now_s
        state = snapshot.budget
        if state is None:
            return {job.id: Decision(job.release_s(now)) for job in snapshot.jobs}
        end = state.period_end_s
        until = end if np.isfinite(end) else now + snapshot.horizon_s
        carbon = state.budget.measure(snapshot.forecast.window(now, now, until))

        def grams(power_w: float, a: float, b: float) -> float:
            return power_w * float(carbon.integral(a, max(a, min(b, end)))) / J_PER_KWH

        spend = state.spent_g + sum(
            grams(c.power_w, max(now, c.start_s), c.end_s) for c in snapshot.committed
        )
        plan: Plan = {}
        paused = False
        queue = sorted(snapshot.jobs, key=lambda j: (-j.priority, j.submitted_s, j.id))
        for job in queue:
            cfg = full_power(job)
            g = grams(cfg.power_w, now, now + cfg.run_s)
            latest = job.latest_finish_s(snapshot.max_defer_s) - cfg.run_s
            if job.release_s(now) > now:  # waits for a dependency: planned at its end
                plan[job.id] = Decision(job.release_s(now), power_w=cfg.power_w)
                continue
            if not paused and spend + g <= state.budget.grams:
                spend += g
                plan[job.id] = Decision(now, end_s=now + cfg.run_s, power_w=cfg.power_w)
                continue
            paused = True
            start = min(end, max(now, latest))
            plan[job.id] = Decision(start, power_w=cfg.power_w, forced=latest <= now)
        return plan
