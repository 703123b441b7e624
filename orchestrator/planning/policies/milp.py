"""``optimal`` and ``oracle``: the planning problem as a mixed-integer programme, solved by
HiGHS.

Variables, on ``Problem``'s slot grid:

- a job that runs in one piece: a binary per (configuration, start) that meets its latest
  finish; exactly one is chosen;
- a job that may be suspended (when the objective is carbon, cost or a mix): a binary per
  configuration and, per slot before its latest finish, the seconds it runs in that slot;
  the seconds add up to its run time in the chosen configuration.

Constraints: per slot, the GPUs (and, with a site limit, the watts) of what runs stay
within what is free; with a budget, the grams in each period stay within what is left of
it (a penalised slack keeps the programme feasible when deadlines force more; the plan
reports it). Objective: with no budget, the objective's total (carbon by default); with
one, the sum of completion times (jobs run in one piece then).

``optimal`` looks ``horizon_s`` ahead (48 h) with the forecast and replans hourly, warm
started from ``budget``'s plan, stopping at ``time_limit_s`` with the best plan found. It
returns ``budget``'s plan where that scores better (the solver stopped early, or its grid
is coarser than the heuristic's start at "now"), so it is never worse on the objective.

``oracle`` is ``optimal`` with perfect foresight over the whole run: the simulator hands
it every job of the trace, with its arrival, and the actual signal, once.

A plan cut off by the wall clock depends on how fast the machine is. With ``node_limit``
set (the simulator's default) the solve is deterministic: HiGHS (one thread) stops after
that many branch-and-bound nodes, the same on every machine; ``time_limit_s`` is then only
a safety net, and a solve it cuts short is thrown away for ``budget``'s plan, so what a
what-if prints never depends on the machine's speed, only (in that rare case) whether the
net was reached.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from orchestrator.planning.policies.base import Decision, Plan, Policy, Snapshot
from orchestrator.planning.policies.budget import Result, heuristic
from orchestrator.planning.policies.highs import quiet_highs
from orchestrator.planning.policies.problem import MAX_CONFIGS, Problem

PENALTY_PER_G = 1e7  # completion seconds per gram over a budget: only when forced
PENALTY_LATE = 1e12  # a start that breaks a deadline: only where none can be kept


class Optimal(Policy):
    name = "optimal"
    needs_forecast = True
    replans_all = True
    replan_every_s = 3600.0
    clairvoyant = False
    time_limit_s = 30.0
    # Branch-and-bound nodes per solve; None: stop on ``time_limit_s`` alone (the daemon's).
    node_limit: int | None = None
    max_configs = MAX_CONFIGS
    # Hourly slots (grid signals are hourly): on 15-minute slots, 1,000 jobs over 48 h are
    # 500,000 columns whose root LP HiGHS does not finish in 30 s; hourly, it proves the
    # optimum in under 10 s. budget's plan on the finer grid is kept where it is better.
    min_slot_s = 3600.0

    def __init__(self, time_limit_s: float | None = None, node_limit: int | None = None) -> None:
        if time_limit_s is not None:
            self.time_limit_s = time_limit_s
        if node_limit is not None:
            self.node_limit = node_limit
        self.last: dict = {}  # what the last solve reported (status, gap, seconds)

    def horizon_s(self, snapshot: Snapshot) -> float | None:
        return snapshot.horizon_s

    def plan(self, snapshot: Snapshot) -> Plan:
        if not snapshot.jobs:
            return {}
        fine = None
        if self.min_slot_s and snapshot.slot_s < self.min_slot_s:
            fine = heuristic(Problem(snapshot))  # budget's plan on the finer grid
            snapshot = replace(snapshot, slot_s=self.min_slot_s)
        began = time.perf_counter()
        problem = Problem(snapshot, self.max_configs, self.horizon_s(snapshot))
        warm = heuristic(problem)
        model = Model(problem, warm)
        if self.node_limit is None:
            # The limit is for the whole replan: what building the programme took is spent,
            # and HiGHS overruns its limit by up to a few seconds on big programmes.
            left = 0.85 * self.time_limit_s - (time.perf_counter() - began)
            solved = model.solve(max(left, 0.5))
        else:  # deterministic: a node limit; the wall clock only as a safety net
            solved = model.solve(self.time_limit_s, self.node_limit)
            if model.report.get("status") == "Time limit reached":
                solved = None  # speed-dependent: budget's plan instead, on every machine
                model.report = {"status": "Time limit reached", "fallback": "budget"}
        self.last = model.report
        if solved is None:
            solved = warm.plan
        candidates = [(score(problem, solved), self.name, solved)]
        candidates.append((score(problem, warm.plan), "budget", warm.plan))
        if fine is not None:
            candidates.append((score(problem, fine.plan), "budget", fine.plan))
        best, kept, plan = min(candidates, key=lambda c: c[0])
        self.last["kept"] = kept
        self.last["planned_objective"] = round(best[2], 3)  # grams, for the carbon objective
        return plan


class Oracle(Optimal):
    name = "oracle"
    clairvoyant = True
    replan_every_s = float("inf")
    time_limit_s = 300.0

    def horizon_s(self, snapshot: Snapshot) -> float | None:
        return None  # the whole run


def score(problem: Problem, plan: Plan) -> tuple[int, float, float]:
    """How a plan fares by the problem's forecast, worst first: (jobs that miss their
    latest finish, grams over the budget, objective). The objective is the total of the
    objective signal with no budget, else the sum of completion times. ``optimal`` and
    ``budget`` are compared on it, as a tuple: deadlines come first."""
    snap = problem.snapshot
    over, total, late = 0.0, 0.0, 0
    periods = None
    if snap.budget is not None:
        from orchestrator.planning.policies.periods import Periods

        periods = Periods(problem)
        spent = np.zeros(len(periods.bounds))
    for job in problem.jobs:
        d = plan[job.id]
        pieces = d.intervals or ((d.start_s, d.end_s),)
        watts = [d.piece_config(i)[2] or 0.0 for i in range(len(pieces))]
        late += int(pieces[-1][1] > job.latest_finish_s(snap.max_defer_s) + 1e-6)
        if periods is None:
            total += sum(
                w * float(problem.obj.integral(a, b))
                for w, (a, b) in zip(watts, pieces, strict=True)
            )
            continue
        total += pieces[-1][1] - job.submitted_s
        spent += periods.spend(pieces, watts)
    if periods is not None:
        over = float(np.clip(spent - periods.left, 0, None).sum())
        over = 0.0 if over < 1e-6 * max(1.0, float(np.abs(periods.left).sum())) else over
    return late, over, total


class _Builder:
    """Columns and rows of a sparse programme, assembled column-wise for HiGHS."""

    def __init__(self, fixed_rows: int) -> None:
        self.n_rows, self.n_cols = fixed_rows, 0
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []
        self.cost: list[np.ndarray] = []
        self.ub: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def row(self, lo: float, hi: float) -> int:
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        self.n_rows += 1
        return self.n_rows - 1

    def columns(self, cost, ub, integer: bool) -> np.ndarray:
        cost = np.asarray(cost, dtype=float)
        n = len(cost)
        self.cost.append(cost)
        self.ub.append(np.broadcast_to(np.asarray(ub, dtype=float), (n,)))
        self.integer.append(np.full(n, integer))
        self.n_cols += n
        return self.n_cols - n + np.arange(n)

    def add(self, cols, rows, values) -> None:
        cols = np.asarray(cols)
        self.entries.append(
            (cols, np.broadcast_to(rows, cols.shape), np.broadcast_to(values, cols.shape))
        )


class Model:
    def __init__(self, problem: Problem, warm: Result) -> None:
        self.p = p = problem
        self.warm = warm
        self.report: dict = {}
        self.periods = periods = warm.periods
        self.free_g, self.free_w = p.free_gpus.copy(), p.free_w.copy()
        self.fixed: dict[int, tuple] = {}
        for j, (c, _s, intervals, forced) in warm.choice.items():
            # The heuristic found no room for it to meet its deadline. If an option could,
            # the programme looks for room (its forced start stays a penalised choice);
            # if none could even on an empty cluster, the guard's decision stands.
            if forced and not p.meets[j].any():
                cfg = p.configs[j][c]
                p.reserve(self.free_g, self.free_w, cfg.gpus, cfg.power_w, intervals)
                self.fixed[j] = warm.choice[j]
        self.watts = bool(np.isfinite(self.free_w).any())
        self.n_per = len(periods.bounds) if periods is not None else 0
        self.budget_row = p.K * (2 if self.watts else 1)
        b = self.b = _Builder(self.budget_row + self.n_per)
        self.blocks: list[tuple] = []  # how to read each job's columns back
        for j, job in enumerate(p.jobs):
            if j in self.fixed:
                continue
            one = b.row(1.0, 1.0)
            if job.interruptible and periods is None:
                self._slots_block(j, one)
            else:
                self._starts_block(j, one)
        if periods is not None:
            slack = b.columns(np.full(self.n_per, PENALTY_PER_G), np.inf, False)
            b.add(slack, self.budget_row + np.arange(self.n_per), -1.0)

    def _starts_block(self, j: int, one: int) -> None:
        """A job in one piece: a binary per (configuration, start) meeting its deadline."""
        p, b = self.p, self.b
        cs, ss = np.nonzero(p.meets[j])
        if self.periods is not None:
            cost = p.end[j, cs, ss] - p.jobs[j].submitted_s
        else:
            cost = p.obj_cost[j, cs, ss]
        cols = b.columns(cost, 1.0, True)
        self.blocks.append(("start", j, cols, cs, ss))
        b.add(cols, one, 1.0)
        c_w, _, intervals, forced = self.warm.choice[j]
        if forced:  # its forced start, at a price that any deadline-keeping plan beats
            self._late_column(j, one, p.configs[j][c_w], intervals)
        k0 = p.k[j, cs, ss]
        m = np.ceil((p.end[j, cs, ss] - (p.origin + k0 * p.slot)) / p.slot - 1e-9)
        m = np.clip(np.maximum(m, 1).astype(np.int64), 0, np.maximum(p.K - k0, 0))
        col_rep = np.repeat(cols, m)
        slot_rows = np.repeat(k0, m) + np.arange(m.sum()) - np.repeat(np.cumsum(m) - m, m)
        b.add(col_rep, slot_rows, np.repeat(p.gpus[j, cs].astype(float), m))
        if self.watts:
            b.add(col_rep, slot_rows + p.K, np.repeat(p.power_w[j, cs], m))
        for i in range(self.n_per):
            grams = self.periods.grams[i, j, cs, ss]
            nz = grams > 0
            b.add(cols[nz], self.budget_row + i, grams[nz])

    def _late_column(self, j: int, one: int, cfg, intervals) -> None:
        p, b = self.p, self.b
        ((a_s, e_s),) = intervals
        if self.periods is not None:
            cost = e_s - p.jobs[j].submitted_s
        else:
            cost = cfg.power_w * float(p.obj.integral(a_s, e_s))
        col = b.columns([cost + PENALTY_LATE], 1.0, True)
        self.blocks.append(("late", j, col))
        b.add(col, one, 1.0)
        lo, hi = p.slot_range(a_s, e_s)
        rows = np.arange(lo, hi)
        b.add(np.repeat(col, len(rows)), rows, float(cfg.gpus))
        if self.watts:
            b.add(np.repeat(col, len(rows)), rows + p.K, cfg.power_w)
        if self.periods is not None:
            grams = self.periods.spend(intervals, cfg.power_w)
            nz = np.flatnonzero(grams)
            b.add(np.repeat(col, len(nz)), self.budget_row + nz, grams[nz])

    def _slots_block(self, j: int, one: int) -> None:
        """A job that may be suspended: the seconds it runs in each slot before its
        latest finish in each configuration (a linear block): the work adds up to the job,
        and a slot holds at most its length of the job's time."""
        p, b = self.p, self.b
        first = int(p.rk[j])
        last = min(int(p.slot_of(p.latest[j])), p.K)
        slots = np.arange(first, max(last, first))
        if not len(slots):
            return
        lengths = p.t[slots + 1] - np.maximum(p.t[slots], p.release[j])
        time_rows = np.array([b.row(-np.inf, float(n)) for n in lengths])
        share = 1.0 / np.maximum(lengths, 1e-9)
        per_config = []
        for cfg in p.configs[j]:
            secs = b.columns(cfg.power_w * p.slot_obj[slots] / p.slot, lengths, False)
            per_config.append(secs)
            b.add(secs, one, 1.0 / cfg.run_s)
            b.add(secs, time_rows, 1.0)
            b.add(secs, slots, cfg.gpus * share)
            if self.watts:
                b.add(secs, slots + p.K, cfg.power_w * share)
        self.blocks.append(("slots", j, per_config, slots, lengths))

    # -- solve ----------------------------------------------------------------------------
    def solve(self, time_limit_s: float, node_limit: int | None = None) -> Plan | None:
        import highspy

        b = self.b
        if b.n_cols == 0:
            return None
        assembling = time.perf_counter()
        cols = np.concatenate([e[0] for e in b.entries]).astype(np.int64)
        rows = np.concatenate([e[1] for e in b.entries]).astype(np.int64)
        vals = np.concatenate([e[2] for e in b.entries]).astype(float)
        order = np.argsort(cols, kind="stable")
        cols, rows, vals = cols[order], rows[order], vals[order]
        inf = highspy.kHighsInf
        lo = [np.full(self.budget_row, -inf)]
        hi = [np.maximum(self.free_g, 0.0)]
        if self.watts:
            hi.append(np.where(np.isfinite(self.free_w), np.maximum(self.free_w, 0.0), inf))
        if self.n_per:
            lo.append(np.full(self.n_per, -inf))
            hi.append(np.maximum(self.periods.target, 0.0))
        lo.append(np.asarray(b.row_lo))
        hi.append(np.asarray(b.row_hi))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = b.n_cols, b.n_rows
        lp.col_cost_ = np.concatenate(b.cost)
        lp.col_lower_ = np.zeros(b.n_cols)
        lp.col_upper_ = np.where(np.isfinite(ub := np.concatenate(b.ub)), ub, inf)
        lp.row_lower_ = np.concatenate(lo)
        lp.row_upper_ = np.where(np.isfinite(h := np.concatenate(hi)), h, inf)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(b.n_cols + 1)).astype(np.int32)
        lp.a_matrix_.index_ = rows.astype(np.int32)
        lp.a_matrix_.value_ = vals
        integer = np.concatenate(b.integer)
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
            for i in integer
        ]
        h = quiet_highs()
        spent = time.perf_counter() - assembling
        h.setOptionValue("time_limit", max(0.5, float(time_limit_s) - spent))
        h.setOptionValue("mip_rel_gap", 1e-4)
        h.setOptionValue("threads", 1)
        if node_limit is not None:
            h.setOptionValue("mip_max_nodes", int(node_limit))
        h.passModel(lp)
        start = self._warm_start()
        if start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = start
            h.setSolution(sol)
        began = time.perf_counter()
        h.run()
        info = h.getInfo()
        self.report = {
            "status": h.modelStatusToString(h.getModelStatus()),
            "gap": float(info.mip_gap),
            "nodes": int(info.mip_node_count),
            "solve_s": round(time.perf_counter() - began, 3),
            "columns": b.n_cols,
            "rows": b.n_rows,
        }
        if info.primal_solution_status != 2:  # no feasible solution
            return None
        return self._read(np.asarray(h.getSolution().col_value))

    def _warm_start(self) -> list[float] | None:
        """The heuristic's plan as a starting solution, where it maps onto the columns."""
        p = self.p
        x = np.zeros(self.b.n_cols)
        for block in self.blocks:
            j = block[1]
            c_w, s_w, intervals, _ = self.warm.choice[j]
            if block[0] == "late":
                x[block[2][0]] = 1.0
            elif block[0] == "start":
                if self.warm.choice[j][3]:
                    continue  # forced: its late column holds it
                _, _, cols, cs, ss = block
                hit = np.flatnonzero((cs == c_w) & (ss == (s_w if s_w is not None else -1)))
                if s_w is None or not len(hit):
                    return None
                x[cols[hit[0]]] = 1.0
            else:
                _, _, per_config, slots, _ = block
                secs = per_config[c_w]
                for a, e in intervals:
                    for i, k in enumerate(slots):
                        lo, hi = max(a, p.t[k]), min(e, p.t[k + 1])
                        if hi > lo:
                            x[secs[i]] += hi - lo
        if self.n_per:
            x[-self.n_per :] = np.clip(self.warm.carbon_by_period - self.periods.target, 0, None)
        return x.tolist()

    def _read(self, x: np.ndarray) -> Plan:
        p = self.p
        plan: Plan = dict(self.warm.plan)
        for block in self.blocks:
            j = block[1]
            job = p.jobs[j]
            if block[0] == "late":
                continue  # the warm (forced) decision, already in the plan
            if block[0] == "start":
                _, _, cols, cs, ss = block
                if not len(cols) or x[cols].max() < 0.5:
                    continue  # its late column was chosen
                i = int(np.argmax(x[cols]))
                c, s = int(cs[i]), int(ss[i])
                cfg = p.configs[j][c]
                start = float(p.start[j, c, s])
                plan[job.id] = Decision(
                    start, None, None, cfg.gpus, cfg.cap, start + cfg.run_s, cfg.power_w
                )
                continue
            _, _, per_config, slots, lengths = block
            configs = p.configs[j]
            pieces: list[list] = []  # [start, end, config]
            for i, k in enumerate(slots):
                a = float(p.t[k + 1] - lengths[i])
                for c, secs in enumerate(per_config):
                    run = float(x[secs[i]])
                    if run <= 1e-3:
                        continue
                    if pieces and pieces[-1][2] == c and abs(pieces[-1][1] - a) < 1e-6:
                        pieces[-1][1] = a + run
                    else:
                        pieces.append([a, a + run, c])
                    a += run
            if not pieces:
                continue
            intervals = tuple((a, e) for a, e, _ in pieces)
            used = [configs[c] for _, _, c in pieces]
            one = len({(u.gpus, u.cap) for u in used}) == 1
            plan[job.id] = Decision(
                intervals[0][0],
                intervals,
                None if one else tuple((u.gpus, u.cap, u.power_w) for u in used),
                used[0].gpus,
                used[0].cap,
                intervals[-1][1],
                used[0].power_w,
            )
        return plan
