"""Carbon budgets and the ledger that spends them.

A budget is an amount of CO2e per period, as people write it: ``20kg/day``, ``150kg/week``,
``2t/month``, or a plain amount (``500kg``) for the whole of a what-if run. Periods are
calendar periods in UTC: days from midnight, weeks from Monday, months from the 1st.

The ledger records what ran (power over time × intensity) into the periods it fell in, so
the planner can ask how much of the current period is left, and the reports can say which
periods went over and why (a deadline that forced a start).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.errors import SpecError

_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(g|kg|t)\s*(?:/\s*(day|week|month))?\s*$", re.I)
_GRAMS = {"g": 1.0, "kg": 1e3, "t": 1e6}
J_PER_KWH = 3.6e6
MAX_GRAMS = 1e12  # a million tonnes: more than any lab emits; also keeps sums finite


@dataclass(frozen=True)
class Budget:
    grams: float
    period: str  # day | week | month | run

    @classmethod
    def parse(cls, text: str) -> Budget:
        match = _AMOUNT.match(text or "")
        if not match:
            raise SpecError(
                f"invalid budget {text!r}: use e.g. 20kg/day, 150kg/week, 2t/month or 500kg"
            )
        grams = float(match.group(1)) * _GRAMS[match.group(2).lower()]
        if grams <= 0:
            raise SpecError(f"invalid budget {text!r}: it must be more than zero")
        if not grams < MAX_GRAMS:  # also NaN and infinity
            raise SpecError(f"invalid budget {text[:40]!r}: at most 1000000t")
        return cls(grams, (match.group(3) or "run").lower())

    def __str__(self) -> str:
        amount = f"{self.grams / 1e3:g}kg"
        return amount if self.period == "run" else f"{amount}/{self.period}"

    def period_of(self, t_s: float) -> tuple[float, float]:
        """The (start, end) of the period holding ``t_s`` (the run's period is endless)."""
        if self.period == "run":
            return -math.inf, math.inf
        day = math.floor(t_s / 86400) * 86400.0
        if self.period == "day":
            return day, day + 86400.0
        if self.period == "week":
            start = day - datetime.fromtimestamp(day, UTC).weekday() * 86400.0
            return start, start + 7 * 86400.0
        d = datetime.fromtimestamp(t_s, UTC)
        start = datetime(d.year, d.month, 1, tzinfo=UTC)
        end = datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=UTC)
        return start.timestamp(), end.timestamp()

    def boundaries(self, t0_s: float, t1_s: float) -> list[float]:
        """Period starts strictly inside ``(t0_s, t1_s)``."""
        out, (_, end) = [], self.period_of(t0_s)
        while end < t1_s:
            out.append(end)
            end = self.period_of(end)[1]
        return out


@dataclass(frozen=True)
class BudgetState:
    """What a planner needs of the ledger at one moment."""

    budget: Budget
    period_start_s: float
    period_end_s: float
    spent_g: float

    @property
    def remaining_g(self) -> float:
        return max(0.0, self.budget.grams - self.spent_g)


@dataclass
class Ledger:
    """Grams of CO2e per period, from what actually ran."""

    budget: Budget
    spent_g: dict[float, float] = field(default_factory=lambda: defaultdict(float))
    forced: dict[float, int] = field(default_factory=lambda: defaultdict(int))

    def record(self, start_s: float, end_s: float, power_w: float, carbon) -> float:
        """Charge a stretch of constant power (``carbon``: a StepSeries of g/kWh) to the
        periods it fell in. Returns the grams."""
        total = 0.0
        cuts = [start_s, *self.budget.boundaries(start_s, end_s), end_s]
        for a, b in itertools.pairwise(cuts):
            grams = power_w * float(carbon.integral(a, b)) / J_PER_KWH
            self.spent_g[self.budget.period_of(a)[0]] += grams
            total += grams
        return total

    def note_forced(self, t_s: float) -> None:
        """A deadline made a job start although the budget did not allow it."""
        self.forced[self.budget.period_of(t_s)[0]] += 1

    def state(self, now_s: float) -> BudgetState:
        start, end = self.budget.period_of(now_s)
        return BudgetState(self.budget, start, end, self.spent_g.get(start, 0.0))

    def over_g(self) -> dict[float, float]:
        """Periods that went over the budget, by how many grams."""
        limit = self.budget.grams
        return {p: g - limit for p, g in sorted(self.spent_g.items()) if g > limit * (1 + 1e-9)}
