"""Carbon budgets and the ledger that spends them.

A budget is an amount of CO2e per period, as people write it: ``20kg/day``, ``150kg/week``,
``2t/month``, or a plain amount (``500kg``) for the whole of a what-if run; or an amount of
energy (``500kWh/day``, ``2MWh/week``: PowerFlow's setting). Periods are calendar periods
in UTC: days from midnight, weeks from Monday, months from the 1st.

An energy budget is kept as a carbon budget against a flat signal of 1,000 per kWh: its
"grams" are watt-hours, so the ledger, the planner and the reports share one code path
(``Budget.measure`` gives the signal a budget is charged against).

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

_AMOUNT = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(g|kg|t|wh|kwh|mwh)\s*(?:/\s*(day|week|month))?\s*$", re.I
)
# budget units per unit written: grams of CO2e, or watt-hours for an energy budget
_UNITS = {"g": 1.0, "kg": 1e3, "t": 1e6, "wh": 1.0, "kwh": 1e3, "mwh": 1e6}
WH_PER_KWH = 1000.0  # an energy budget's flat "intensity": units (Wh) per kWh
J_PER_KWH = 3.6e6
MAX_GRAMS = 1e12  # a million tonnes: more than any lab emits; also keeps sums finite


@dataclass(frozen=True)
class Budget:
    grams: float  # per period, in the budget's unit: g CO2e, or Wh for an energy budget
    period: str  # day | week | month | run
    kind: str = "carbon"  # carbon | energy

    @classmethod
    def parse(cls, text: str) -> Budget:
        match = _AMOUNT.match(text or "")
        if not match:
            raise SpecError(
                f"invalid budget {text!r}: use e.g. 20kg/day, 150kg/week, 2t/month, 500kg"
                " or 500kWh/day"
            )
        unit = match.group(2).lower()
        grams = float(match.group(1)) * _UNITS[unit]
        if grams <= 0:
            raise SpecError(f"invalid budget {text!r}: it must be more than zero")
        kind = "energy" if unit.endswith("wh") else "carbon"
        if not grams < MAX_GRAMS:  # also NaN and infinity
            most = "1000000MWh" if kind == "energy" else "1000000t"
            raise SpecError(f"invalid budget {text[:40]!r}: at most {most}")
        return cls(grams, (match.group(3) or "run").lower(), kind)

    @property
    def unit(self) -> str:
        """The unit amounts are shown in: kg (of CO2e) or kWh."""
        return "kWh" if self.kind == "energy" else "kg"

    def __str__(self) -> str:
        amount = f"{self.grams / 1e3:g}{self.unit}"
        return amount if self.period == "run" else f"{amount}/{self.period}"

    def measure(self, carbon):
        """The signal (a StepSeries, per kWh) this budget is charged against: the carbon
        intensity, or for an energy budget a flat 1,000 Wh per kWh on the same steps."""
        if self.kind == "carbon":
            return carbon
        import numpy as np

        return carbon.with_values(np.full(len(carbon.values), WH_PER_KWH))

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
    # When jobs stop arriving, for pacing a whole-run budget (a what-if run knows its
    # trace's last arrival); None: the period's end (a run budget: the planner's horizon).
    arrivals_end_s: float | None = None

    @property
    def remaining_g(self) -> float:
        return max(0.0, self.budget.grams - self.spent_g)


@dataclass(frozen=True)
class ForcedStart:
    """A start a deadline forced although the budget did not allow it."""

    job_id: int
    start_s: float
    grams: float  # what the start was expected to spend (budget units: g, or Wh)


def expected_spend(
    decision, watts_w: float, carbon, now_s: float, run_s: float, until_s: float = math.inf
) -> tuple[float, float]:
    """What a start at ``now_s`` on ``decision`` is expected to spend up to ``until_s``:
    (g CO2e, Wh) over its pieces still to come (its intervals, else now to its expected
    end, else ``run_s`` from now), each at its planned draw (``watts_w`` where the plan
    gives none). ``carbon``: a StepSeries of g/kWh."""
    end_s = decision.end_s if decision.end_s is not None else now_s + run_s
    pieces = decision.intervals or ((decision.start_s, end_s),)
    grams = wh = 0.0
    for i, (a, b) in enumerate(pieces):
        a, b = max(a, now_s), min(max(b, now_s), until_s)
        if b <= a:
            continue
        watts = decision.piece_config(i)[2] or watts_w
        grams += watts * float(carbon.integral(a, b)) / J_PER_KWH
        wh += watts * (b - a) / 3600.0
    return grams, wh


@dataclass
class Ledger:
    """Grams of CO2e (Wh for an energy budget) per period, from what actually ran."""

    budget: Budget
    spent_g: dict[float, float] = field(default_factory=lambda: defaultdict(float))
    forced: dict[float, int] = field(default_factory=lambda: defaultdict(int))
    forced_jobs: list[ForcedStart] = field(default_factory=list)
    arrivals_end_s: float | None = None  # see BudgetState

    def record(self, start_s: float, end_s: float, power_w: float, carbon) -> float:
        """Charge a stretch of constant power (``carbon``: a StepSeries of g/kWh) to the
        periods it fell in. Returns the grams (Wh for an energy budget)."""
        total = 0.0
        signal = self.budget.measure(carbon)
        cuts = [start_s, *self.budget.boundaries(start_s, end_s), end_s]
        for a, b in itertools.pairwise(cuts):
            grams = power_w * float(signal.integral(a, b)) / J_PER_KWH
            self.spent_g[self.budget.period_of(a)[0]] += grams
            total += grams
        return total

    def note_forced(self, t_s: float, job_id: int | None = None, grams: float = 0.0) -> None:
        """A deadline made a job start although the budget did not allow it."""
        self.forced[self.budget.period_of(t_s)[0]] += 1
        if job_id is not None:
            self.forced_jobs.append(ForcedStart(job_id, t_s, grams))

    def state(self, now_s: float) -> BudgetState:
        start, end = self.budget.period_of(now_s)
        spent = self.spent_g.get(start, 0.0)
        return BudgetState(self.budget, start, end, spent, self.arrivals_end_s)

    def over_g(self) -> dict[float, float]:
        """Periods that went over the budget, by how many grams."""
        limit = self.budget.grams
        return {p: g - limit for p, g in sorted(self.spent_g.items()) if g > limit * (1 + 1e-9)}
