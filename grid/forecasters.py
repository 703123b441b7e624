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
