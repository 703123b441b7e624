"""What a policy sees and what it decides. Pure data: no clock, database or network.

A ``Snapshot`` holds the time, the jobs to plan (their requested width or width range,
expected run time at full power, deadline, whether they may be suspended, and their
performance model), what already holds GPUs (running jobs, plans that stand), the cluster's
size, the forecasts of the carbon and price signals, the objective, the carbon budget's
state and the site's power limit. A policy answers with a ``Plan``: for each job, when it
should start, on how many GPUs, at what power cap and, for a job that may be suspended,
the intervals it should run in. Times are epoch seconds (UTC).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from orchestrator.errors import SpecError

DEFAULT_MAX_DEFER_S = 24 * 3600.0  # how long a job without a deadline may be deferred
# run time a suspension costs a job (checkpoint, restart, warm-up): a few minutes of a real
# model's; a piece is planned only where the carbon it saves is worth more
DEFAULT_CHECKPOINT_S = 300.0


def check_objective(text: str, has_price: bool) -> str:
    """``carbon``, ``cost`` or ``mix:W`` (W: carbon's weight, 0-1), normalised; one clear
    SpecError otherwise, or when it needs a price signal that is not there."""
    objective = text.strip().lower()
    kind, _, weight = objective.partition(":")
    if kind not in ("carbon", "cost", "mix"):
        raise SpecError(f"unknown objective {text!r}; use carbon, cost or mix:W")
    if kind == "mix":
        try:
            ok = 0.0 <= float(weight or 0.5) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise SpecError(f"objective {text!r}: W is the carbon weight, 0-1")
    if kind != "carbon" and not has_price:
        raise SpecError(f"objective {text!r} needs a price signal (--price)")
    return objective


@dataclass(slots=True)
class QueuedJob:
    id: int
    gpus: int
    submitted_s: float
    priority: int = 0
    duration_s: float | None = None  # remaining run time at full width and full power
    deadline_s: float | None = None  # when it must have finished
    interruptible: bool = False
    min_gpus: int | None = None  # a width range (``--gpus 2-8``); None: exactly ``gpus``
    max_gpus: int | None = None
    model: object | None = (
        None  # an orchestrator.planning.perfmodel.JobModel (None: full power only)
    )
    checkpoint_s: float = DEFAULT_CHECKPOINT_S  # run time lost to a suspension and restart
    # Not before this (its dependencies' expected end, ``submit --after``); None: no bound.
    earliest_s: float | None = None
    # Its run time is a promise (--duration, its history); False: a guess (the lab's
    # default): backfill then takes it as unknown (``backfill.hold_until_s``).
    run_known: bool = True
    # The GPU type it asked for (``submit --gpu-type``, canonical); None: any. Backfill
    # reserves GPUs of that type for it, and lets others use the rest.
    gpu_type: str | None = None

    def release_s(self, now_s: float) -> float:
        """When it may start at the earliest: now, its arrival or its dependencies' end."""
        after = self.earliest_s if self.earliest_s is not None else now_s
        return max(now_s, self.submitted_s, after)

    def latest_finish_s(self, max_defer_s: float) -> float:
        """Its deadline, or for a job without one: its submission + the maximum deferral +
        its (remaining) run: deferral counts from submission (or from its dependencies' end,
        if later), however often it is replanned."""
        if self.deadline_s is not None:
            return self.deadline_s
        since = max(self.submitted_s, self.earliest_s or self.submitted_s)
        return since + max_defer_s + (self.duration_s or 0.0)


@dataclass(frozen=True, slots=True)
class Decision:
    start_s: float
    # For a job that may be suspended: the intervals it runs in (it is suspended between
    # them). None: it runs from ``start_s`` to its end.
    intervals: tuple[tuple[float, float], ...] | None = None
    # Per interval, when they differ: (GPUs, cap, watts) of each (``optimal`` may run a
    # job's pieces at different caps). None: ``gpus``/``cap``/``power_w`` throughout.
    configs: tuple[tuple[int, float, float], ...] | None = None
    gpus: int | None = None  # None: the job's requested width
    cap: float = 1.0  # power-cap fraction of the GPU's maximum limit
    end_s: float | None = None  # expected end (None: not estimated)
    power_w: float | None = None  # expected facility draw while it runs
    # Started when its deadline required, although the budget or objective said wait.
    forced: bool = False

    def piece_config(self, i: int) -> tuple[int | None, float, float | None]:
        """(GPUs, cap, watts) of interval ``i``."""
        if self.configs is not None:
            return self.configs[i]
        return self.gpus, self.cap, self.power_w


def not_before(decision: Decision, earliest_s: float | None) -> Decision:
    """``decision`` moved later as a whole so that it starts no earlier than
    ``earliest_s`` (a policy that ignored a dependency); unchanged otherwise."""
    if earliest_s is None or decision.start_s >= earliest_s - 1e-6:
        return decision
    shift = earliest_s - decision.start_s
    intervals = decision.intervals
    if intervals is not None:
        intervals = tuple((a + shift, b + shift) for a, b in intervals)
    end = decision.end_s + shift if decision.end_s is not None else None
    return replace(decision, start_s=earliest_s, intervals=intervals, end_s=end)


@dataclass(frozen=True, slots=True)
class Commitment:
    """GPUs and power already spoken for: a running job, or a plan that stands."""

    id: int
    gpus: int
    power_w: float
    start_s: float
    end_s: float
    gpu_type: str | None = None  # the type its GPUs are of (None: not known, or several)


Plan = dict[int, Decision]


@dataclass
class Snapshot:
    now_s: float
    jobs: list[QueuedJob]
    forecast: object | None = None  # a grid.forecasters.StepForecaster
    max_defer_s: float = DEFAULT_MAX_DEFER_S
    extra: dict = field(default_factory=dict)
    committed: list[Commitment] = field(default_factory=list)
    total_gpus: int | None = None  # None: capacity is not the policy's concern
    # GPUs per type on a cluster of several (``policies.tiers``); None: one type
    type_gpus: dict[str | None, int] | None = None
    price: object | None = None  # a StepForecaster of the price signal (per MWh)
    objective: str = "carbon"  # carbon | cost | mix:W (W: the carbon weight, 0-1)
    budget: object | None = None  # an orchestrator.planning.budgets.BudgetState
    power_limit_w: float | None = None  # the site's limit on the jobs' total draw
    slot_s: float = 900.0  # planning slot
    horizon_s: float = 48 * 3600.0  # how far ahead a rolling-horizon planner looks
    # Share of the cluster's GPU time that jobs not yet submitted are expected to need
    # (recent arrivals): a planner leaves room for them in later slots.
    expected_load: float = 0.0
    # What keeping a server on costs a job that waits (``planning.devices.idlecost``): the
    # idle draw per GPU (W, with the host's share and PUE) a planner adds over a job's wait
    # to the start it compares, for at most idle_wait_s (None: the whole wait). None: not
    # counted.
    idle_w_per_gpu: float | None = None
    idle_wait_s: float | None = None


MIN_LOAD_SPAN_S = 3600.0  # recent load over at least an hour (a young queue: not a spike)


def recent_load(
    demand_gpu_s: float, now_s: float, first_submit_s: float | None, window_s: float, gpus: int
) -> float:
    """``Snapshot.expected_load``, the same in ``simulate``, ``plan`` and the daemon: the
    GPU-seconds the jobs submitted over the last ``window_s`` asked for, as a share of the
    cluster's over that window (or since the first submission, at least an hour)."""
    if first_submit_s is None or gpus <= 0:
        return 0.0
    span = min(window_s, max(now_s - first_submit_s, MIN_LOAD_SPAN_S))
    return float(demand_gpu_s / (span * gpus))


class Policy(ABC):
    name: str = "abstract"
    needs_forecast: bool = False
    # True: plan() is given every queued job on each pass (a joint planner). False: only
    # jobs without a plan yet; a plan stands until the job starts or is suspended.
    replans_all: bool = False
    # True: plan() reads the cluster's state in the snapshot (running jobs and standing
    # plans as commitments, capacity, load, budget, price, limits). False (the baselines):
    # only the jobs, the time and the forecast, so the scheduler skips building the rest.
    reads_cluster: bool = True

    @abstractmethod
    def plan(self, snapshot: Snapshot) -> Plan: ...

    # A joint planner replans everything at most this often (simulated or wall seconds);
    # in between, only new jobs are planned, around the plans that stand.
    replan_every_s: float = 0.0
