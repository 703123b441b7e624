"""The daemon's live grid signal: refreshed on a timer, cache first, kept as a tape.

Each refresh asks the source chain (``grid.cache.CachedChain``: the sources in order, the
file cache when they all fail) for the recent past and a forecast, and writes them onto a
tape of values by time (newer values replace older ones from their time on). Planning
reads the forecast from the tape; accounting integrates the tape over what ran, asking the
source for history where the tape has a hole (the daemon was down). What a source answers
is clipped to the window around now (the lookback and the horizon, and a day either side)
before it is written, and the tape keeps ``KEEP_S`` of past before now and the horizon
after: a point far in the past or future neither wipes the tape nor makes it huge, and a
forecast with nothing from now on is a failed refresh.

Refreshes run on a thread of their own while passes read the tape: a ``Tape`` is never
changed once made, a refresh builds the next one and swaps it in (under a lock held only
for that, never across a request), so a reader always sees a whole tape and never waits on
a provider. One request to the chain at a time: a pass that finds a hole while a refresh
is under way (or while the source is failing) does not wait for it, and uses what the tape
holds this time.

The signal's age is the time since the data in hand came from a source (a cache entry
counts from when it was fetched). While it is younger than ``max_age_s`` the daemon plans
on what it has (cached data and forecasts); after that it falls back to its configured
rule until a refresh succeeds again. A failing source is logged once, when its error
changes, and its recovery once.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from datetime import UTC, datetime, timedelta

import numpy as np

from grid.errors import GridDataError, SourceSpecError
from grid.steps import StepSeries

log = logging.getLogger(__name__)
KEEP_S = 8 * 86400.0  # the tape keeps this much past
DAY_S = 86400.0
MAX_BUGS_LOGGED = 50
_DIGITS = re.compile(r"\d+")


class Tape:
    """Values by slot (index × ``step_s`` seconds); never changed once made."""

    __slots__ = ("_series", "slots", "step_s", "version")

    def __init__(self, step_s: float | None = None, slots=None, version: int = 0) -> None:
        self.step_s = step_s
        self.slots: dict[int, float] = slots or {}  # slot index -> value
        self.version = version
        self._series: StepSeries | None = None  # made on first read (the same by any thread)

    def series(self) -> StepSeries | None:
        """The tape as one step series (holes filled from their neighbours)."""
        if self._series is None and self.slots:
            keys = sorted(self.slots)
            full = np.arange(keys[0], keys[-1] + 1)
            values = np.interp(full, np.array(keys), [self.slots[k] for k in keys])
            self._series = StepSeries(keys[0] * self.step_s, self.step_s, values)
        return self._series

    def merged(self, signal, now_s: float, horizon_s: float) -> Tape:
        """A new tape: this one with ``signal`` written over it from its start on, keeping
        only ``[now_s - KEEP_S, now_s + horizon_s + DAY_S]`` (by the time the daemon is
        at, never by the signal's own times: one point far in the future cannot push now
        off the tape). Raises ``GridDataError`` when the signal has no known value."""
        if not len(signal.frame):
            return self
        series, _ = StepSeries.from_signal(signal)
        step = self.step_s
        slots = dict(self.slots)
        if step is None or series.step_s < step:
            finer = series.step_s
            if step is not None:  # finer data: re-cut the tape
                old, slots = self.series(), {}
                if old is not None:
                    t = old.start_s + np.arange(len(old) * round(old.step_s / finer)) * finer
                    for ti, v in zip(t, old.value_at(t), strict=True):
                        slots[round(ti / finer)] = float(v)
            step = finer
        low, high = now_s - KEEP_S, now_s + horizon_s + DAY_S
        begin = max(0, math.ceil((low - series.start_s) / step))  # on the series' grid
        stop = math.ceil((min(series.end_s, high) - series.start_s) / step)
        t = series.start_s + np.arange(begin, max(begin, stop)) * step
        for ti, v in zip(t, series.value_at(t), strict=True):
            slots[round(ti / step)] = float(v)
        first, last = math.floor(low / step), math.ceil(high / step)
        slots = {k: v for k, v in slots.items() if first <= k <= last}
        return Tape(step, slots, self.version + 1)

    def covers(self, t0: float, t1: float) -> bool:
        s = self.series()
        return s is not None and s.start_s <= t0 and t1 <= s.end_s


def trace_end(chain) -> datetime | None:
    """Where the recorded traces of a chain end, when none is replayed: a daemon reading
    a trace past its end has no signal, and ``status`` says since when."""
    from grid.sources.base import FileSource

    ends = []
    for source in getattr(chain, "sources", []):
        if not isinstance(source, FileSource) or source.replay:
            return None
        try:
            ends.append(source.load().end)
        except Exception:  # a file that cannot be read: the error says so already
            return None
    return max((e for e in ends if e is not None), default=None)


class SignalFeed:
    """One quantity (carbon or price) from one source chain."""

    def __init__(self, chain, *, horizon_s: float, lookback_s: float, what: str = "grid") -> None:
        self.chain = chain
        self.horizon_s = horizon_s
        self.lookback_s = lookback_s
        self.what = what
        self._tape = Tape()
        self._swap = threading.Lock()  # held to write a new tape, never across a request
        self._fetching = threading.Lock()  # one request to the chain at a time
        self.fresh_at: datetime | None = None  # when the newest data came from a source
        self.last_error: str | None = None
        self.failing_since: datetime | None = None  # since when last_error holds
        self._logged: str | None = None  # the failure last logged
        self._history_tried: int | None = None  # the version a hole was last fetched at
        self._now_s: float | None = None  # the time of the latest refresh
        self._bugs: set[str] = set()  # the unexpected errors logged

    @property
    def version(self) -> int:
        return self._tape.version

    @property
    def step_s(self) -> float | None:
        return self._tape.step_s

    # -- refresh ------------------------------------------------------------------------
    def refresh(self, now: datetime) -> bool:
        """True when a source answered (not only the cache). A source that cannot be used
        as given (``SourceSpecError``: a missing file, a bad option) raises: that is the
        user's to mend, not a failure to plan around."""
        now_s = self._now_s = now.timestamp()
        with self._fetching:
            try:
                signal = self.chain.forecast(now, timedelta(seconds=self.horizon_s))
            except SourceSpecError:
                raise
            except GridDataError as exc:
                self.failed(str(exc))
                return False
            errors = list(self.chain.errors)
            try:
                past = self.chain.history(now - timedelta(seconds=self.lookback_s), now)
            except GridDataError:
                past = None  # a forecast alone will do
            except Exception as exc:  # a bug: not a reason to drop the forecast in hand
                self._log_bug(exc, f"{self.chain.spec}: {type(exc).__name__}: {exc}")
                past = None
        low = now - timedelta(seconds=self.lookback_s + DAY_S)  # whatever a source answers
        high = now + timedelta(seconds=self.horizon_s + DAY_S)
        if past is not None:
            self._merge(past.between(low, high), now_s)
        signal = signal.between(low, high)
        if signal.end is None or signal.end <= now or not self._merge(signal, now_s):
            ended = trace_end(self.chain)
            if ended is not None and ended <= now:
                self.failed(
                    f"{self.chain.spec}: the trace ends at {ended.isoformat()}, "
                    f"{(now - ended).days} days ago (replay it live: ?replay=now)"
                )
            else:
                self.failed(f"{self.chain.spec}: no known value in the forecast from now on")
            return False
        fetched = now - timedelta(seconds=signal.meta.stale_s or 0.0)
        if self.fresh_at is None or fetched > self.fresh_at:
            self.fresh_at = fetched  # when the data in hand came from a source
        if signal.meta.stale_s is not None:
            self.failed("; ".join(errors) + " (served from the cache)")
            return False
        self.recovered(errors, signal.meta.source)
        return True

    def failed(self, error: str) -> None:
        """Note why the source failed (logged when the reason is new)."""
        self._failing()
        self.last_error = error
        self._log(error)

    def unexpected(self, exc: Exception) -> None:
        """A fetch raised what nobody foresaw (a bug, here or in an adapter): the source
        counts as failing until a refresh succeeds, and each kind of error is logged
        once in the daemon's life, with its traceback."""
        self._failing()
        self.last_error = f"{self.chain.spec}: {type(exc).__name__}: {exc}"
        self._log_bug(exc, self.last_error)

    def _failing(self) -> None:
        if self.last_error is None or self.failing_since is None:
            now_s = self._now_s
            self.failing_since = (
                datetime.now(UTC) if now_s is None else datetime.fromtimestamp(now_s, UTC)
            )

    def _log_bug(self, exc: Exception, problem: str) -> None:
        key = f"{type(exc).__name__}: {_DIGITS.sub('0', str(exc))}"
        if key not in self._bugs and len(self._bugs) < MAX_BUGS_LOGGED:
            self._bugs.add(key)
            log.error("%s source failed: %s", self.what, problem, exc_info=exc)

    def recovered(self, passed_over: list[str], source: str) -> None:
        """A source answered (``source``), after those of ``passed_over`` failed."""
        self.last_error = self.failing_since = None
        self._log("; ".join(passed_over) + f"; using {source}" if passed_over else None)

    def _log(self, problem: str | None) -> None:
        """Log a problem once, not each refresh (the same failure for another time range
        or after another number of tries is the same), and its end once."""
        key = None if problem is None else _DIGITS.sub("0", problem)
        if key == self._logged:
            return
        if problem is None:
            log.info("%s source answers again: %s", self.what, self.chain.spec)
        else:
            log.warning("%s source failed: %s", self.what, problem)
        self._logged = key

    def _merge(self, signal, now_s: float) -> bool:
        """Write ``signal`` onto the tape; False when it holds no known value."""
        with self._swap:
            try:
                self._tape = self._tape.merged(signal, now_s, self.horizon_s)
            except GridDataError:
                return False
        return True

    # -- read ---------------------------------------------------------------------------
    def age_s(self, now: datetime) -> float | None:
        return None if self.fresh_at is None else (now - self.fresh_at).total_seconds()

    def series(self) -> StepSeries | None:
        """The tape as one step series (holes filled from their neighbours)."""
        return self._tape.series()

    def covers(self, t0: float, t1: float) -> bool:
        return self._tape.covers(t0, t1)

    def integral(self, t0: float, t1: float) -> float | None:
        """∫ signal dt over ``[t0, t1]`` (value × seconds); fetches history for a hole
        (as far back as the tape keeps), unless a refresh is under way or the source is
        failing (then the tape as is). Runs on the passes' thread: whatever the fetch
        raises, the pass goes on (a bug is logged, once, with its traceback)."""
        tape = self._tape
        if (
            not tape.covers(t0, t1)
            and self._history_tried != tape.version
            and self.last_error is None
            and self._fetching.acquire(blocking=False)
        ):
            now_s = max(t1, self._now_s or t1)
            start_s = max(t0, now_s - KEEP_S)  # the tape keeps no more
            past = None
            try:
                self._history_tried = tape.version  # one request per hole, not per stretch
                if start_s < t1:
                    start = datetime.fromtimestamp(start_s, UTC)
                    past = self.chain.history(start, datetime.fromtimestamp(t1, UTC))
            except GridDataError:
                pass
            except Exception as exc:  # a bug on the way: the accounting does without
                self.unexpected(exc)
            finally:
                self._fetching.release()
            if past is not None:
                self._merge(past, now_s)
        s = self._tape.series()
        return None if s is None else float(s.integral(t0, t1))

    def now_value(self, now: datetime) -> float | None:
        s = self._tape.series()
        return None if s is None else float(s.value_at(now.timestamp()))


class TapeForecaster:
    """The planners' forecaster interface over a feed's tape."""

    label = "live"

    def __init__(self, series: StepSeries) -> None:
        self.actual = series

    def window(self, issued_s: float, t0: float, t1: float) -> StepSeries:
        return self.actual.extended(t1 + self.actual.step_s)
