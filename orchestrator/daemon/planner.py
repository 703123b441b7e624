"""The daemon's planning: the same policies and ``Scheduler`` as the simulator, fed with
the live queue, the live grid signal, the budget ledger and the cluster.

``LivePlanner.schedule(now, ...)`` returns a ``Scheduler`` holding each waiting job with
its plan (start, GPUs, power cap, intervals). The plan is made again on every event (a job
queued, ended, suspended), on every new signal and at every slot boundary, and reused
between them. When the signal is older than ``signal_max_age`` (the source keeps failing
and the cache has aged) the daemon falls back to its rule: ``run-now`` (every job is due
now, as under ``fifo``) or ``deadline-only`` (each job waits for its latest feasible start,
so a signal that comes back in time still plans it); it says so once in the log and in
``gridshift status``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from orchestrator.planning.budgets import Budget, BudgetState, expected_spend
from orchestrator.planning.dependencies import plan_with_dependencies
from orchestrator.planning.policies.base import (
    DEFAULT_CHECKPOINT_S,
    DEFAULT_MAX_DEFER_S,
    Decision,
    Plan,
    Policy,
    Snapshot,
    not_before,
    recent_load,
)
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.planning.scheduler import Scheduler
from orchestrator.planning.snapshot import PlanInputs, build_snapshot

if TYPE_CHECKING:  # the signal needs pandas: imported only by a daemon that plans with one
    from orchestrator.signals.feed import SignalFeed

log = logging.getLogger(__name__)


class LatestStart(Policy):
    """The ``deadline-only`` fallback: each job starts at its latest feasible start."""

    name = "deadline-only"

    def plan(self, snapshot: Snapshot) -> Plan:
        now, out = snapshot.now_s, {}
        for job in snapshot.jobs:
            if job.duration_s is None:
                out[job.id] = Decision(now)
                continue
            latest = job.latest_finish_s(snapshot.max_defer_s) - job.duration_s
            out[job.id] = Decision(max(now, latest), end_s=max(now, latest) + job.duration_s)
        return out


@dataclass
class LivePlanner:
    policy: Policy
    slot_s: float
    curve: object  # the cluster's PowerCurve
    feed: SignalFeed | None = None
    price: SignalFeed | None = None
    budget: Budget | None = None
    objective: str = "carbon"
    max_age_s: float = 6 * 3600.0
    fallback: str = "deadline-only"
    default_run_s: float = 4 * 3600.0  # a job with no duration, report or history
    checkpoint_s: float = DEFAULT_CHECKPOINT_S  # run time a suspension costs a job
    mode: str = "plan"  # plan | run-now | deadline-only (the fallback in force)
    mode_reason: str | None = None
    last_plan_s: float | None = None
    _key: tuple | None = None
    _left: float | None = None  # of the budget's period, at this pass (``forced_spend``)
    _plan: Plan = field(default_factory=dict)
    _earliest: dict = field(default_factory=dict)
    # Jobs waiting for a dependency (``--after``): planned ahead, from their dependencies'
    # expected ends, for ``show``; never in the scheduler (they start once those ended).
    ahead: list = field(default_factory=list)  # (QueuedJob, Decision)
    after: dict = field(default_factory=dict)  # waiting job id -> the ids it waits for
    # what keeping a server on costs a waiting job: (idle W per GPU, longest wait counted)
    # (``Snapshot.idle_w_per_gpu``); set with right-sizing (``daemon.energy.levers``)
    idle_cost: tuple[float, float | None] | None = None
    # the site power limit (``daemon --power-limit``): the plan keeps the jobs' modelled
    # draw in each slot under it, as ``plan`` does; the admission (daemon.energy.sitelimit)
    # is what makes it hold
    power_limit_w: float | None = None

    def without_caps(self) -> None:
        """Plan at full power only (this daemon cannot set power limits)."""
        self.curve = dataclasses.replace(self.curve, min_limit_w=self.curve.max_limit_w)

    def _choose(self, now: datetime) -> Policy:
        """The policy, or the fallback when the signal it needs is missing or too old."""
        if not self.policy.needs_forecast:
            return self.policy
        series = self.feed.series() if self.feed is not None else None
        age = self.feed.age_s(now) if self.feed is not None else None
        if series is not None and age is not None and age <= self.max_age_s:
            if self.mode != "plan":
                log.info("grid signal is back; planning with %s again", self.policy.name)
            self.mode, self.mode_reason = "plan", None
            return self.policy
        reason = (
            "no grid signal yet"
            if series is None or age is None
            else f"grid signal is {age / 3600:.1f} h old (limit {self.max_age_s / 3600:g} h)"
        )
        if self.feed is not None and self.feed.last_error:
            reason += f": {self.feed.last_error}"
        if self.mode != self.fallback:
            log.warning("%s; falling back to %s", reason, self.fallback)
        self.mode, self.mode_reason = self.fallback, reason
        return Fifo() if self.fallback == "run-now" else LatestStart()

    def schedule(
        self,
        now: datetime,
        queued: list,  # Job rows to plan (queued, or suspended holding GPUs)
        remaining_s: dict[int, float],
        running: list,  # (Job, GPUs, started_at) of running attempts
        total_gpus: int,
        largest_node: int,
        spent_g: float,
        estimates: dict | None = None,  # job id -> RunEstimate
        waiting: list | None = None,  # Job rows waiting for a dependency to end
        after: dict | None = None,  # job id -> ids of the jobs it waits for
        load: float = 0.0,  # recent arrivals' share of the GPUs (``expected_load``)
        widest: int | None = None,  # most GPUs one job may get (SSH servers together)
        types: tuple = (None, {}),  # GPUs per type, running jobs' types (``planner_types``)
    ) -> Scheduler:
        policy = self._choose(now)
        held = {j.id for j in waiting or ()}
        self.after = {i: list(after[i]) for i in held} if after else {}
        queued = [*queued, *(waiting or ())]
        now_s = now.timestamp()
        slot = math.floor(now_s / self.slot_s)
        known = estimates or {}
        key = (
            tuple(
                (
                    j.id,
                    round(remaining_s.get(j.id, known[j.id].run_s if j.id in known else 0.0)),
                    j.priority,
                    j.deadline,
                    j.gpus_min,
                    j.gpus_max,
                )  # ``edit`` changes these
                for j in queued
            ),
            tuple(j.id for j, _, _ in running),
            self.feed.version if self.feed is not None else 0,
            slot,
            self.mode,
            round(spent_g, 1),
            round(load, 2),
        )
        state = None
        if self.budget is not None:
            start, end = self.budget.period_of(now_s)
            state = BudgetState(self.budget, start, end, spent_g)
        inputs = self._inputs(now_s, queued, remaining_s, running, total_gpus, state)
        inputs.estimates, inputs.expected_load, inputs.widest_gpus = known, load, widest
        inputs.type_gpus, inputs.running_types = types
        snap = build_snapshot(inputs, largest_node)  # also the scheduler's views of the jobs
        snap.power_limit_w = self.power_limit_w
        if self.idle_cost is not None:
            snap.idle_w_per_gpu, snap.idle_wait_s = self.idle_cost
        self._left = self._budget_left(snap, state)
        if key != self._key:
            self._plan, self._earliest = self._make_plan(policy, snap, after or {})
            self._key, self.last_plan_s = key, now_s
        scheduler = Scheduler(policy, max_defer_s=DEFAULT_MAX_DEFER_S)
        self.ahead = []
        for view in snap.jobs:
            decision = self._plan.get(view.id) or Decision(now_s)
            if view.id in held:  # its dependencies' expected ends bound its start
                view = dataclasses.replace(view, earliest_s=self._earliest.get(view.id))
                self.ahead.append((view, not_before(decision, view.earliest_s)))
            else:
                scheduler.add_planned(view, decision)
        return scheduler

    def _inputs(self, now_s, queued, remaining_s, running, total_gpus, budget_state):
        from orchestrator.signals.feed import TapeForecaster

        series = self.feed.series() if self.feed is not None else None
        price = self.price.series() if self.price is not None else None
        return PlanInputs(
            now_s, queued, running, total_gpus, self.curve,
            TapeForecaster(series) if series is not None else None,
            TapeForecaster(price) if price is not None else None,
            budget_state, self.objective, self.slot_s, remaining_s,
            checkpoint_s=self.checkpoint_s,
        )  # fmt: skip

    @staticmethod
    def _make_plan(policy: Policy, snap: Snapshot, after: dict) -> tuple[Plan, dict]:
        """The plan, and each waiting job's earliest start (its dependencies' ends)."""
        if not snap.jobs:
            return {}, {}
        if snap.price is None and snap.objective != "carbon":
            snap.objective = "carbon"  # the price signal is not in yet
        if snap.forecast is None and policy.needs_forecast:
            policy = Fifo()  # every job due now (a waiting one: at its dependencies' end)
        if after:
            ends = {c.id: c.end_s for c in snap.committed}
            snap, plan = plan_with_dependencies(policy, snap, after, ends)
            return plan, {j.id: j.earliest_s for j in snap.jobs if j.earliest_s is not None}
        return policy.plan(snap), {}

    def forced_spend(self, view, decision: Decision, now_s: float) -> tuple[float, float] | None:
        """Called for every start: what it is expected to spend in the budget's period is
        taken off what is left of it (``_left``, after what ran and what runs), so later
        starts of this pass find that much less. Returns (g CO2e, Wh) that a start its
        deadline forced is expected to spend in the period, when that is more than what
        was left, for ``show`` and ``budget``; None otherwise (not forced, no budget, or
        room for it)."""
        budget, left = self.budget, self._left
        if budget is None or left is None or self.mode != "plan":
            return None
        series = self.feed.series() if self.feed is not None else None
        if series is None:
            return None
        gpus, cap = decision.gpus or view.gpus, decision.cap
        watts = view.model.power_w(gpus, cap) if view.model is not None else gpus * 350.0
        run_s = view.duration_s or self.default_run_s
        end = budget.period_of(now_s)[1]
        g, wh = expected_spend(decision, watts, series, now_s, run_s, end)
        used = wh if budget.kind == "energy" else g
        self._left = left - used  # later starts of this pass find that much less
        if not decision.forced or used <= left + 1e-9 * max(1.0, abs(left)):
            return None
        return g, wh

    def _budget_left(self, snap: Snapshot, state: BudgetState | None) -> float | None:
        """What is left of the period after what ran and what runs to its end (in the
        budget's unit), by the forecast; None without a budget or a signal."""
        series = self.feed.series() if self.feed is not None else None
        if state is None or series is None:
            return None
        end, left = state.period_end_s, state.remaining_g
        for c in snap.committed:
            g, wh = expected_spend(Decision(c.start_s, end_s=c.end_s), c.power_w, series,
                                   snap.now_s, 0.0, end)  # fmt: skip
            left -= wh if state.budget.kind == "energy" else g
        return left

    def budget_window(self, now: datetime) -> tuple[datetime, datetime] | None:
        return None if self.budget is None else period_window(self.budget, now)


def period_window(budget: Budget, now: datetime) -> tuple[datetime, datetime]:
    """The budget's period holding ``now``, as the accounting's UTC days can be asked."""
    start, end = budget.period_of(now.timestamp())
    return (
        datetime.fromtimestamp(max(start, 0.0), UTC),
        datetime.fromtimestamp(min(end, 4102444800.0), UTC),
    )


def expected_load(
    submitted: list[tuple], first, known: dict, default_run_s: float, now_s: float,
    total_gpus: int, largest: int, window_s: float = DEFAULT_MAX_DEFER_S,
) -> float:  # fmt: skip
    """``Snapshot.expected_load`` from the queue (``store.submitted_since``: the jobs
    submitted over the last ``window_s``), by ``recent_load`` as in ``simulate``: each
    job at its width for its run-time estimate (``known``), else what it ran (started to
    finished), else its ``--duration``, else the lab's default, and at most ``window_s``.
    A job that ended without ever starting (cancelled or failed while queued) asked for
    nothing that was run: it is not counted."""
    if first is None or not submitted:
        return 0.0
    demand = 0.0
    for job_id, gpus, duration_s, started, finished in submitted:
        if started is None and finished is not None:
            continue
        if job_id in known:
            run_s = known[job_id].run_s
        elif started is not None and finished is not None:
            run_s = max(0.0, (finished - started).total_seconds())
        else:
            run_s = duration_s or default_run_s
        demand += min(gpus, largest) * min(run_s, window_s)
    return recent_load(demand, now_s, first.timestamp(), window_s, total_gpus)


def build_live(settings, nodes) -> tuple[LivePlanner | None, str | None]:
    """The planner the settings ask for (``settings.daemon``), and its policy's name.
    Without a grid signal and with no policy named, ``fifo`` without a planner (None)."""
    from orchestrator.errors import SpecError
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.base import check_objective
    from orchestrator.signals.sources import open_chain

    cfg = settings.daemon
    grid = cfg.grid or settings.grid.source
    name = cfg.policy or ("budget" if grid else "fifo")
    policy = resolve_policy(name)
    if getattr(policy, "clairvoyant", False):
        raise SpecError(f"{policy.name} needs every future job: it runs only in simulate")
    if policy.needs_forecast and not grid:
        raise SpecError(
            f"policy {policy.name} plans with the grid signal: give --grid (e.g. uk, csv:PATH) "
            "or set daemon.grid / grid.source"
        )
    objective = check_objective(cfg.objective, bool(cfg.price))
    slot_s = cfg.seconds("slot")
    if not 1.0 <= slot_s <= 3600.0:
        raise SpecError(f"--slot {cfg.slot}: a planning slot is 1s to 1h")
    budget = Budget.parse(cfg.budget) if cfg.budget else None
    if not grid and budget is None and name == "fifo":
        return None, name
    from orchestrator.signals.feed import SignalFeed

    horizon_s = 48 * 3600.0
    lookback_s = max(3600.0, 4 * slot_s)
    feed = (
        SignalFeed(open_chain(settings, grid), horizon_s=horizon_s, lookback_s=lookback_s)
        if grid
        else None
    )
    price = None
    if cfg.price:
        chain = open_chain(settings, [cfg.price])
        price = SignalFeed(chain, horizon_s=horizon_s, lookback_s=lookback_s, what="price")
    model = next((g.model for n in nodes for g in n.gpus if g.model), None)
    planner = LivePlanner(
        policy=policy,
        slot_s=slot_s,
        curve=curve_for(model),
        feed=feed,
        price=price,
        budget=budget,
        objective=objective,
        max_age_s=cfg.seconds("signal_max_age"),
        fallback=cfg.fallback,
        default_run_s=cfg.seconds("default_duration"),
        checkpoint_s=cfg.seconds("checkpoint_cost"),
        power_limit_w=cfg.power_limit_w,
    )
    return planner, name
