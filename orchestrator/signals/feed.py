"""The daemon's live grid signal: refreshed on a timer, cache first, kept as a tape.

Each refresh asks the source chain (``grid.cache.CachedChain``: the sources in order, the
file cache when they all fail) for the recent past and a forecast, and writes them onto a
tape of values by time (newer values replace older ones from their time on). Planning
reads the forecast from the tape; accounting integrates the tape over what ran, asking the
source for history where the tape has a hole (the daemon was down).

The signal's age is the time since the data in hand came from a source (a cache entry
counts from when it was fetched). While it is
younger than ``max_age_s`` the daemon plans on what it has (cached data and forecasts);
after that it falls back to its configured rule until a refresh succeeds again.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

import numpy as np

from grid.errors import GridDataError, SourceSpecError
from grid.steps import StepSeries

log = logging.getLogger(__name__)
KEEP_S = 8 * 86400.0  # the tape keeps this much past


class SignalFeed:
    """One quantity (carbon or price) from one source chain."""

    def __init__(self, chain, *, horizon_s: float, lookback_s: float, what: str = "grid") -> None:
        self.chain = chain
        self.horizon_s = horizon_s
        self.lookback_s = lookback_s
        self.what = what
        self.step_s: float | None = None
        self._tape: dict[int, float] = {}  # slot index -> value
        self._series: StepSeries | None = None
        self.fresh_at: datetime | None = None  # when the newest data came from a source
        self.version = 0
        self.last_error: str | None = None
        self._history_tried: int | None = None  # the version a hole was last fetched at

    # -- refresh ------------------------------------------------------------------------
    def refresh(self, now: datetime) -> bool:
        """True when a source answered (not only the cache). A source that cannot be used
        as given (``SourceSpecError``: a missing file, a bad option) raises: that is the
        user's to mend, not a failure to plan around."""
        try:
            signal = self.chain.forecast(now, timedelta(seconds=self.horizon_s))
        except SourceSpecError:
            raise
        except GridDataError as exc:
            self.last_error = str(exc)
            return False
        reached = signal.meta.stale_s is None
        fetched = now - timedelta(seconds=signal.meta.stale_s or 0.0)
        try:
            past = self.chain.history(now - timedelta(seconds=self.lookback_s), now)
            self._merge(past)
        except GridDataError:
            pass  # a forecast alone will do
        self._merge(signal)
        if self.fresh_at is None or fetched > self.fresh_at:
            self.fresh_at = fetched  # when the data in hand came from a source
        if reached:
            self.last_error = None
        else:
            self.last_error = "; ".join(self.chain.errors) or "served from the cache"
        return reached

    def _merge(self, signal) -> None:
        if not len(signal.frame):
            return
        series, _ = StepSeries.from_signal(signal)
        step = series.step_s
        if self.step_s is None or step < self.step_s:
            if self.step_s is not None:  # finer data: re-cut the tape
                old = self.series()
                self._tape = {}
                self.step_s = step
                if old is not None:
                    t = old.start_s + np.arange(len(old) * round(old.step_s / step)) * step
                    for ti, v in zip(t, old.value_at(t), strict=True):
                        self._tape[round(ti / step)] = float(v)
            self.step_s = step
        step = self.step_s
        t = series.start_s + np.arange(math.ceil(len(series) * series.step_s / step)) * step
        for ti, v in zip(t, series.value_at(t), strict=True):
            self._tape[round(ti / step)] = float(v)
        floor = round((t[-1] - KEEP_S - self.horizon_s) / step)
        self._tape = {k: v for k, v in self._tape.items() if k >= floor}
        self._series = None
        self.version += 1

    # -- read ---------------------------------------------------------------------------
    def age_s(self, now: datetime) -> float | None:
        return None if self.fresh_at is None else (now - self.fresh_at).total_seconds()

    def series(self) -> StepSeries | None:
        """The tape as one step series (holes filled from their neighbours)."""
        if self._series is None and self._tape:
            keys = sorted(self._tape)
            full = np.arange(keys[0], keys[-1] + 1)
            known = np.array(keys)
            values = np.interp(full, known, [self._tape[k] for k in keys])
            self._series = StepSeries(keys[0] * self.step_s, self.step_s, values)
        return self._series

    def covers(self, t0: float, t1: float) -> bool:
        s = self.series()
        return s is not None and s.start_s <= t0 and t1 <= s.end_s

    def integral(self, t0: float, t1: float) -> float | None:
        """∫ signal dt over ``[t0, t1]`` (value × seconds); fetches history for a hole."""
        if not self.covers(t0, t1) and self._history_tried != self.version:
            self._history_tried = self.version  # one request per hole, not one per stretch
            try:
                start = datetime.fromtimestamp(t0, UTC)
                end = datetime.fromtimestamp(t1, UTC)
                self._merge(self.chain.history(start, end))
            except GridDataError:
                pass
        s = self.series()
        return None if s is None else float(s.integral(t0, t1))

    def now_value(self, now: datetime) -> float | None:
        s = self.series()
        return None if s is None else float(s.value_at(now.timestamp()))


class TapeForecaster:
    """The planners' forecaster interface over a feed's tape."""

    label = "live"

    def __init__(self, series: StepSeries) -> None:
        self.actual = series

    def window(self, issued_s: float, t0: float, t1: float) -> StepSeries:
        return self.actual.extended(t1 + self.actual.step_s)
