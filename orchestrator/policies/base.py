"""What a policy sees and what it decides. Pure data: no clock, database or network.

A ``Snapshot`` holds the time, the jobs to plan (their requested width, expected run time
at full power, deadline and whether they may be suspended), and a forecast of the carbon
signal. A policy answers with a ``Plan``: for each job, when it should start and, for a job
that may be suspended, the intervals it should run in. Times are epoch seconds (UTC).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from orchestrator.errors import SpecError

DEFAULT_MAX_DEFER_S = 24 * 3600.0  # how long a job without a deadline may be deferred


@dataclass(slots=True)
class QueuedJob:
    id: int
    gpus: int
    submitted_s: float
    priority: int = 0
    duration_s: float | None = None  # remaining run time at full width and full power
    deadline_s: float | None = None  # when it must have finished
    interruptible: bool = False

    def latest_finish_s(self, now_s: float, max_defer_s: float) -> float:
        """Its deadline, or for a job without one: now + the maximum deferral + its run."""
        if self.deadline_s is not None:
            return self.deadline_s
        return now_s + max_defer_s + (self.duration_s or 0.0)


@dataclass(frozen=True, slots=True)
class Decision:
    start_s: float
    # For a job that may be suspended: the intervals it runs in (it is suspended between
    # them). None: it runs from ``start_s`` to its end.
    intervals: tuple[tuple[float, float], ...] | None = None


Plan = dict[int, Decision]


@dataclass
class Snapshot:
    now_s: float
    jobs: list[QueuedJob]
    forecast: object | None = None  # a grid.forecasters.StepForecaster
    max_defer_s: float = DEFAULT_MAX_DEFER_S
    extra: dict = field(default_factory=dict)


class Policy(ABC):
    name: str = "abstract"
    needs_forecast: bool = False
    # True: plan() is given every queued job on each pass (a joint planner). False: only
    # jobs without a plan yet; a plan stands until the job starts or is suspended.
    replans_all: bool = False

    @abstractmethod
    def plan(self, snapshot: Snapshot) -> Plan: ...


_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    import orchestrator.policies.baselines  # noqa: F401  (registers)

    return list(_REGISTRY)


def resolve_policy(name: str) -> Policy:
    names = policy_names()
    cls = _REGISTRY.get(name.strip().lower())
    if cls is None:
        raise SpecError(f"unknown policy {name!r}; known: {', '.join(names)}")
    return cls()
