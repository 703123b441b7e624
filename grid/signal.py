"""The normal form of every grid signal.

A ``Signal`` is one quantity over time: a pandas frame indexed by interval start (UTC, a
regular ``resolution_s``), with the value column ``carbon_g_per_kwh`` or ``price_per_mwh``
(float, NaN where unknown) and a boolean ``forecast`` column (False for actual rows), plus
``SignalMeta``: zone, source, kind (average or marginal), basis (lifecycle or direct),
unit and currency, when a forecast was issued, and how the rows were resampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np
import pandas as pd

CARBON = "carbon_g_per_kwh"
PRICE = "price_per_mwh"


@dataclass(frozen=True)
class ResampleReport:
    """What regularising the raw rows did, so no loss is silent."""

    raw_rows: int = 0
    duplicates: int = 0  # rows sharing a timestamp (their mean was kept)
    aggregated: int = 0  # finer rows averaged into a coarser interval
    filled: int = 0  # empty intervals filled by time interpolation
    missing: int = 0  # empty intervals left NaN (gap longer than the fill limit)
    rule: str = ""


@dataclass(frozen=True)
class SignalMeta:
    source: str
    zone: str
    quantity: str  # CARBON or PRICE
    unit: str  # "g/kWh", "EUR/MWh" ...
    resolution_s: int
    kind: str | None = None  # average | marginal (carbon only)
    basis: str | None = None  # lifecycle | direct (carbon only)
    currency: str | None = None  # price only
    issued_at: datetime | None = None  # forecasts: when the provider issued it
    report: ResampleReport = field(default_factory=ResampleReport)
    stale_s: float | None = None  # served from the cache after a failure: its age


@dataclass(frozen=True)
class Signal:
    frame: pd.DataFrame
    meta: SignalMeta

    @property
    def values(self) -> pd.Series:
        return self.frame[self.meta.quantity]

    @property
    def start(self) -> datetime | None:
        return self.frame.index[0].to_pydatetime() if len(self.frame) else None

    @property
    def end(self) -> datetime | None:
        """End of the last interval (exclusive)."""
        if not len(self.frame):
            return None
        return (self.frame.index[-1] + pd.Timedelta(seconds=self.meta.resolution_s)).to_pydatetime()

    def between(self, start: datetime | None, end: datetime | None) -> Signal:
        frame = self.frame
        if start is not None:
            frame = frame[frame.index >= pd.Timestamp(start)]
        if end is not None:
            frame = frame[frame.index < pd.Timestamp(end)]
        return Signal(frame, self.meta)

    def with_meta(self, **changes) -> Signal:
        return Signal(self.frame, replace(self.meta, **changes))

    def summary(self) -> dict:
        """The stable JSON summary of ``gridshift grid show --json``."""
        v = self.values.dropna()
        return {
            "source": self.meta.source,
            "zone": self.meta.zone,
            "kind": self.meta.kind,
            "unit": self.meta.unit,
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "resolution_s": self.meta.resolution_s,
            "points": len(self.frame),
            "filled": self.meta.report.filled,
            "mean": _round(v.mean()),
            "min": _round(v.min()),
            "max": _round(v.max()),
        }

    def greenest_windows(self, window_s: int, count: int = 3) -> list[tuple[datetime, float]]:
        """Start and mean of the ``count`` lowest-mean windows of ``window_s``, not
        overlapping, in increasing mean."""
        steps = max(1, round(window_s / self.meta.resolution_s))
        values = self.values.to_numpy(dtype=float)
        if len(values) < steps:
            return []
        means = pd.Series(values).rolling(steps).mean().to_numpy()[steps - 1 :]
        order = np.argsort(np.where(np.isnan(means), np.inf, means), kind="stable")
        taken: list[int] = []
        for i in order:
            if np.isnan(means[i]) or len(taken) == count:
                break
            if all(abs(int(i) - t) >= steps for t in taken):
                taken.append(int(i))
        return [(self.frame.index[i].to_pydatetime(), float(means[i])) for i in taken]


def _round(value) -> float | None:
    return None if value is None or pd.isna(value) else round(float(value), 1)
