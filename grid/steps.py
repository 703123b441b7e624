"""A signal as a step function over epoch seconds, for fast arithmetic in planners and in
the simulator: ``values[i]`` holds over ``[start_s + i·step_s, start_s + (i+1)·step_s)``.

``integral(t0, t1)`` (value × seconds) is O(1) through a cumulative sum and works on numpy
arrays, so the carbon of a run (power × ∫ intensity dt) or the mean intensity of every
candidate window costs a few array operations, not a loop over slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grid.errors import GridDataError
from grid.signal import Signal


@dataclass(frozen=True)
class StepSeries:
    start_s: float
    step_s: float
    values: np.ndarray
    cum: np.ndarray = field(repr=False, compare=False, default=None)  # len(values) + 1

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=float)
        if values.ndim != 1 or len(values) == 0:
            raise GridDataError("a step series needs at least one value")
        if np.isnan(values).any():
            raise GridDataError("a step series cannot hold unknown (NaN) values; fill them first")
        object.__setattr__(self, "values", values)
        cum = np.concatenate(([0.0], np.cumsum(values) * self.step_s))
        object.__setattr__(self, "cum", cum)

    @classmethod
    def from_signal(cls, signal: Signal) -> tuple[StepSeries, int]:
        """The signal's values, with unknown ones interpolated in time (the edges held).
        Returns the series and how many values were filled."""
        values = signal.values.astype(float)
        missing = int(values.isna().sum())
        if missing == len(values):
            raise GridDataError(f"{signal.meta.source}: no known values")
        if missing:
            values = values.interpolate(method="time").ffill().bfill()
        start = signal.frame.index[0].timestamp()
        return cls(start, float(signal.meta.resolution_s), values.to_numpy()), missing

    @property
    def end_s(self) -> float:
        return self.start_s + len(self.values) * self.step_s

    def __len__(self) -> int:
        return len(self.values)

    def index(self, t):
        """Slot index of time(s) ``t``, clamped to the series."""
        i = np.floor((np.asarray(t, dtype=float) - self.start_s) / self.step_s).astype(np.int64)
        return np.clip(i, 0, len(self.values) - 1)

    def value_at(self, t):
        return self.values[self.index(t)]

    def cumulative(self, t):
        """∫ from ``start_s`` to ``t`` (times outside the series extend its edge values)."""
        t = np.asarray(t, dtype=float)
        i = self.index(t)
        return self.cum[i] + self.values[i] * (t - (self.start_s + i * self.step_s))

    def integral(self, t0, t1):
        return self.cumulative(t1) - self.cumulative(t0)

    def slots(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pieces of ``[t0, t1)`` cut at slot boundaries: (starts, ends, values)."""
        if t1 <= t0:
            empty = np.empty(0)
            return empty, empty, empty
        first, last = int(self.index(t0)), int(self.index(np.nextafter(t1, -np.inf)))
        bounds = self.start_s + np.arange(first, last + 2) * self.step_s
        starts = np.maximum(bounds[:-1], t0)
        ends = np.minimum(bounds[1:], t1)
        if t1 > self.end_s:
            ends[-1] = t1  # beyond the edge: the last value holds
        if t0 < self.start_s:
            starts[0] = t0
        return starts, ends, self.values[first : last + 1].copy()

    def extended(self, until_s: float, period_s: float = 7 * 86400) -> StepSeries:
        """The series continued to ``until_s`` by repeating its last ``period_s`` (a week:
        keeps the daily and weekly shape), or its whole length when shorter."""
        if until_s <= self.end_s:
            return self
        tail = self.values[-max(1, min(len(self.values), round(period_s / self.step_s))) :]
        extra = int(np.ceil((until_s - self.end_s) / self.step_s))
        reps = np.resize(tail, extra)
        return StepSeries(self.start_s, self.step_s, np.concatenate((self.values, reps)))

    def with_values(self, values: np.ndarray) -> StepSeries:
        return StepSeries(self.start_s, self.step_s, values)
