"""The cheapest pieces of a job that may be suspended, for the ``budget`` planner.

Without a budget a piece's price is the objective of its slots, and the pieces start from
the job's cheapest slots. With one, the price is λ × grams and the job also pays its
completion time (the end of its last piece): the pieces start from the cheapest slots up
to the end that minimises both (``_timed_cover``), and only slots that can end the job
sooner than its best run in one piece are looked at. Either way ``pieces.settle`` then
makes every piece worth its checkpoint.
"""

from __future__ import annotations

import numpy as np

from orchestrator.planning.policies.pieces import min_piece_s, piece_intervals, settle
from orchestrator.planning.policies.problem import Problem


def cheapest_pieces(p: Problem, j: int, free_g, free_w, periods, lambdas, bound=np.inf):
    """For a job that may be suspended: the cheapest set of whole slots before its latest
    finish, over its configurations. Returns (config, intervals, cost) or None (also when
    none can cost less than ``bound``, the job's best run in one piece).

    Each configuration's pieces are settled (``pieces.settle``) in the order of a floor
    under their cost: the cost of the slots settling starts from (settling can only make
    it dearer) and, with a budget, the least completion time pieces ending in each slot
    can have. Those whose floor is above the best found (or ``bound``) are not settled."""
    job = p.jobs[j]
    if "last_slot" not in p.memo:  # (once per problem, for every job)
        p.memo["last_slot"] = np.minimum(p.slot_of(p.latest), p.K).tolist()
    first, last = int(p.rk[j]), p.memo["last_slot"][j]
    timed = lambdas is not None
    if timed and np.isfinite(bound):
        # with a budget (prices ≥ 0) pieces ending after the bound's time cost more
        last = min(last, first + int(np.searchsorted(p.t[first:last], job.submitted_s + bound)))
    if last - first < 2:
        return None
    edges_a = np.maximum(p.t[first:last], p.release[j])
    lengths = p.t[first + 1 : last + 1] - edges_a
    if timed:
        per_s = _slot_prices(p, periods, lambdas)[first:last]
    else:
        per_s = p.slot_obj[first:last] / p.slot
    # what the caller takes in place of its best run in one piece must cost less by this
    beats = bound - 1e-9 * max(1.0, abs(bound)) if np.isfinite(bound) else np.inf
    if timed and (per_s >= 0).all():
        # at the lowest price of the window, and the earliest end, the run and a restart
        need_s = p.run_s[j] + job.checkpoint_s
        least = need_s * (float(per_s.min()) * p.power_w[j] + 1.0) + edges_a[0] - job.submitted_s
        if least.min() >= beats:
            return None
        free = free_g[first:last], free_w[first:last]
        # the same job, prices, room and bound as in an earlier greedy pass of this
        # plan (λ raised only in other periods, the room the same so far): its answer
        key = (j, bound, per_s.tobytes(), free[0].tobytes(), free[1].tobytes())
        if key in p.memo:
            return p.memo[key]
        options = _timed_options(p, j, *free, per_s, edges_a, lengths, beats)
        p.memo[key] = best = _settled(p, j, options, bound, beats, lengths, edges_a, timed)
        return best
    else:
        options = []
        for c, cfg in enumerate(p.configs[j]):
            ok = free_g[first:last] >= cfg.gpus - 1e-9
            ok &= free_w[first:last] >= cfg.power_w - 1e-6
            if lengths[ok].sum() < cfg.run_s - 1e-6:
                continue
            price = np.where(ok, per_s * cfg.power_w, np.inf)
            floor, mask = _cover(price, lengths, cfg.run_s)
            options.append((floor, c, cfg, price, mask))
    return _settled(p, j, options, bound, beats, lengths, edges_a, timed)


def _slot_prices(p: Problem, periods, lambdas: np.ndarray) -> np.ndarray:
    """Per second and watt in each slot of the horizon at the budget's prices ``lambdas``
    (kept for the greedy pass at those prices)."""
    key = ("prices", lambdas.tobytes())
    if key not in p.memo:
        p.memo[key] = lambdas[periods.slot_period] * periods.slot_units / p.slot
    return p.memo[key]


def _settled(p: Problem, j: int, options, bound, beats, lengths, edges_a, timed):
    """The cheapest of ``options`` once settled, in the order of their floors, skipping
    those whose floor is above the best found (or ``bound``)."""
    job = p.jobs[j]
    shortest_s = min_piece_s(job.checkpoint_s, p.slot)
    options.sort(key=lambda o: (o[0], o[1]))
    best = None
    for floor, c, cfg, price, mask in options:
        limit = bound if best is None else min(bound, best[2])
        if (np.isfinite(limit) and floor > limit + 1e-6 * max(1.0, abs(limit))) or floor >= beats:
            break
        settled = settle(price, lengths, mask, cfg.run_s, shortest_s, job.checkpoint_s)
        if settled is None:
            continue
        mask, cost = settled
        if timed and np.count_nonzero(mask[1:] & ~mask[:-1]) + mask[0] < 2:
            continue  # with a budget, pieces are two or more
        intervals = piece_intervals(
            price, lengths, edges_a, mask, cfg.run_s, shortest_s, job.checkpoint_s
        )
        if timed:  # + completion time: the end of the last piece
            cost += intervals[-1][1] - job.submitted_s
        if best is None or (cost, c) < (best[2], best[0]):
            best = (c, intervals, cost)
    return best


def _cover(price: np.ndarray, lengths: np.ndarray, run_s: float) -> tuple[float, np.ndarray]:
    """The cheapest slots covering ``run_s``, and their cost with no checkpoint (-inf
    where a price is negative: a restart could pay)."""
    order = np.argsort(price, kind="stable")
    taken = np.cumsum(lengths[order])
    count = int(np.searchsorted(taken, run_s - 1e-6)) + 1
    chosen = order[:count]
    mask = np.zeros(len(lengths), dtype=bool)
    mask[chosen] = True
    if not (price[chosen] >= 0).all():
        return -np.inf, mask
    floor = float(np.dot(price[chosen], lengths[chosen]))
    floor -= float(price[chosen[-1]]) * (float(taken[count - 1]) - run_s)
    return floor, mask


def _timed_options(
    p: Problem, j: int, free_g, free_w, per_s, edges_a, lengths, beats, one_run: bool = False
) -> list:
    """With a budget (prices ≥ 0): (floor, config, its config, price, slots to start from)
    of the configurations whose pieces may cost less than ``beats``.

    Pieces (two or more: one is a run in one piece, which the planner prices itself)
    need the run and a restart. Those whose last slot is e end at or after its start and
    that run time after the first's, and pay at least the cheapest cover of it by the
    slots up to e; the floor is the least of that over e, and the pieces start from the
    cheapest slots covering the run up to that e. (First, more cheaply, the cover by any
    slots and the earliest end; then, for the configurations that leaves, the closer one
    over e, all at once.) Slots that are one run are left out (``one_run``: kept): they
    settle into one piece."""
    job, n = p.jobs[j], len(edges_a)
    cfgs = p.configs[j]
    gpus, watts = p.gpus[j, : len(cfgs), None], p.power_w[j, : len(cfgs), None]
    run = p.run_s[j, : len(cfgs)]
    need = run + job.checkpoint_s
    ok = free_g[None, :] >= gpus - 1e-9
    if p.watt_limited:  # (with no power limit, every slot has the watts)
        ok &= free_w[None, :] >= watts - 1e-6
    # the slots by price (the same order for every configuration: its watts scale the
    # prices); a slot where a configuration does not fit gives it no time
    order = np.argsort(per_s, kind="stable")
    secs = np.where(ok[:, order], lengths[order][None, :], 0.0)
    per = per_s[order][None, :] * watts
    before = np.cumsum(secs, axis=1) - secs
    cover = (np.minimum(np.maximum(need[:, None] - before, 0.0), secs) * per).sum(axis=1)
    covered = before[:, -1] + secs[:, -1]
    cheap = cover + float(edges_a[0]) + need - job.submitted_s
    keep = np.flatnonzero((covered >= need - 1e-6) & (cheap < beats))
    if not len(keep):
        return []
    secs, per, need = secs[keep], per[keep], need[keep]
    # the last slots worth a look: from the first that ends enough time for the run and
    # a restart to the last that starts early enough (cover by any slots + its start)
    lo = int(np.searchsorted(np.cumsum(lengths), need.min() - 1e-6))
    hi = n - 1
    if np.isfinite(beats):
        until = beats + job.submitted_s - float(cover[keep].min())
        hi = min(hi, int(np.searchsorted(edges_a, until)) - 1)
    if hi < lo:
        return []
    last = np.arange(lo, hi + 1)
    usable = order[None, :] <= last[:, None]  # [e, k]: slot ≤ e
    secs_e = np.where(usable[None, :, :], secs[:, None, :], 0.0)
    before_e = np.cumsum(secs_e, axis=2)
    before_e -= secs_e
    enough = before_e[:, :, -1] + secs_e[:, :, -1] >= need[:, None] - 1e-6
    left = np.subtract(need[:, None, None], before_e)  # (in place from here: less memory)
    np.maximum(left, 0.0, out=left)
    np.minimum(left, secs_e, out=left)
    left *= per[:, None, :]
    cover_e = left.sum(axis=2)
    total = np.where(enough, cover_e, np.inf)
    total += np.maximum(edges_a[last][None, :], float(edges_a[0]) + need[:, None])
    e = np.argmin(total, axis=1)
    rows = np.arange(len(keep))
    floors = total[rows, e] - job.submitted_s
    take = (run[keep][:, None] - before_e[rows, e] > 0) & (secs_e[rows, e] > 0)
    out = []
    for r, c in enumerate(keep.tolist()):
        if floors[r] >= beats:
            continue
        mask = np.zeros(n, dtype=bool)
        mask[order[take[r]]] = True
        if not one_run and np.count_nonzero(mask[1:] != mask[:-1]) + mask[0] + mask[-1] <= 2:
            continue  # one run of slots: settling keeps it one piece
        price = np.where(ok[c], per_s * watts[c], np.inf)
        out.append((float(floors[r]), c, cfgs[c], price, mask))
    return out
