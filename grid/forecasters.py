"""Forecasts made from history, for what-if runs on traces.

- ``perfect``: the actual values (an upper bound on what forecasting can give);
- ``seasonal-naive``: each point is the last known value one period earlier (a day or a
  week) before the issue time;
- ``noisy``: actual plus normal noise with standard deviation ``relative_error`` × the
  mean of the series, seeded (the error model of the Let's Wait Awhile study).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from grid.errors import SourceSpecError
from grid.signal import Signal
from grid.steps import StepSeries

KINDS = ("perfect", "seasonal-naive", "noisy")


def make_forecast(
    actual: Signal,
    issued_at: datetime,
    horizon: timedelta,
    *,
    kind: str = "perfect",
    period: timedelta = timedelta(days=1),
    relative_error: float = 0.1,
    seed: int = 0,
) -> Signal:
    window = actual.between(issued_at, issued_at + horizon)
    frame = window.frame.copy()
    column = actual.meta.quantity
    if kind == "perfect":
        pass
    elif kind == "seasonal-naive":
        past = actual.values
        known = past[past.index < pd.Timestamp(issued_at)]
        shifted = []
        for t in frame.index:
            k = max(1, int(np.ceil((t - pd.Timestamp(issued_at)) / pd.Timedelta(period) + 1e-9)))
            source_t = t - k * pd.Timedelta(period)
            shifted.append(known.get(source_t, np.nan))
        frame[column] = shifted
    elif kind == "noisy":
        sd = relative_error * float(actual.values.mean())
        rng = np.random.default_rng([seed, int(pd.Timestamp(issued_at).timestamp())])
        frame[column] = frame[column] + rng.normal(0.0, sd, size=len(frame))
    else:
        raise SourceSpecError(f"unknown forecaster {kind!r}; known: {', '.join(KINDS)}")
    frame["forecast"] = True
    return Signal(frame, window.meta).with_meta(issued_at=issued_at)


# -- the same forecasters on step series (fast; used by planners and the simulator) --------
class StepForecaster:
    """What a planner sees at ``issued_s`` of the signal over ``[t0, t1)``."""

    label = "perfect"

    def __init__(self, actual: StepSeries) -> None:
        self.actual = actual

    def window(self, issued_s: float, t0: float, t1: float) -> StepSeries:
        return self.actual


class NoisySteps(StepForecaster):
    """Actual plus seeded normal noise of ``relative_error`` × the series mean, drawn once
    for the whole series: the error model of the Let's Wait Awhile study."""

    def __init__(self, actual: StepSeries, relative_error: float, seed: int = 0) -> None:
        super().__init__(actual)
        self.label = f"noise:{relative_error:g}"
        rng = np.random.default_rng(seed)
        sd = relative_error * float(actual.values.mean())
        self._noisy = actual.with_values(actual.values + rng.normal(0.0, sd, len(actual)))

    def window(self, issued_s: float, t0: float, t1: float) -> StepSeries:
        return self._noisy


class SeasonalNaiveSteps(StepForecaster):
    """Each slot not yet known at ``issued_s`` takes the value one period (or a whole
    number of periods) earlier that was known then."""

    def __init__(self, actual: StepSeries, period_s: float = 86400.0) -> None:
        super().__init__(actual)
        self.label = "naive" if period_s == 86400 else f"naive:{period_s / 86400:g}d"
        self.period = max(1, round(period_s / actual.step_s))

    def window(self, issued_s: float, t0: float, t1: float) -> StepSeries:
        a = self.actual
        first, last = int(a.index(min(t0, issued_s))), int(a.index(t1))
        idx = np.arange(first, last + 1)
        unknown = int(np.ceil((issued_s - a.start_s) / a.step_s))  # first slot starting ≥ issue
        future = idx >= unknown
        source = idx.copy()
        source[future] = idx[future] - ((idx[future] - unknown) // self.period + 1) * self.period
        source = np.clip(source, 0, len(a) - 1)
        return StepSeries(a.start_s + first * a.step_s, a.step_s, a.values[source])


def step_forecaster(text: str, actual: StepSeries, seed: int = 0) -> StepForecaster:
    """``perfect``, ``naive`` (seasonal-naive, a day; ``naive:7d`` a week) or
    ``noise:0.1`` (actual + noise of 10 % of the mean)."""
    name, _, arg = text.strip().lower().partition(":")
    if name == "perfect" and not arg:
        return StepForecaster(actual)
    if name in ("naive", "seasonal-naive"):
        days = 1.0
        if arg:
            try:
                days = float(arg.removesuffix("d"))
            except ValueError:
                days = 0.0
            if days <= 0:
                raise SourceSpecError(f"invalid forecast {text!r}: the period is like 1d or 7d")
        return SeasonalNaiveSteps(actual, days * 86400)
    if name in ("noise", "noisy"):
        try:
            error = float(arg or "0.1")
        except ValueError:
            error = -1.0
        if not 0 <= error <= 5:
            raise SourceSpecError(f"invalid forecast {text!r}: noise:0.1 means 10 % of the mean")
        return NoisySteps(actual, error, seed)
    raise SourceSpecError(f"unknown forecast {text!r}; use perfect, naive or noise:0.1")
