"""A recorded trace replayed live (``csv:PATH?replay=now``, ``synthetic:replay=now``).

The trace's first whole weeks are repeated, back to back, over all time: the value at
any moment ``t`` is the trace's at ``start + ((t - start) mod period)``, the period a whole
number of weeks. So each weekday and time of day line up with what the trace recorded
on that weekday at that time, and the trace loops when it runs out: a daemon sees a
signal that behaves as a live one (history behind now, a forecast ahead of it), at any
date. Only whole weeks are used; a trace shorter than a week cannot be replayed."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from grid.errors import SourceSpecError
from grid.resample import MAX_POINTS
from grid.signal import Signal

WEEK_S = 7 * 86400
MODES = ("now",)
DEFAULT_SIDE_S = 4 * WEEK_S  # a range without a bound: up to four weeks either side of now


def replay_mode(options: dict[str, str], where: str) -> bool:
    """True when the options ask for a replay (``replay=now``); ``replay=off`` or no
    option: the trace read at its own dates."""
    mode = options.get("replay")
    if mode is None or mode.strip().lower() in ("", "off", "no"):
        return False
    if mode.strip().lower() not in MODES:
        raise SourceSpecError(
            f"{where}: invalid replay {mode!r}: use replay=now (the trace shifted by whole "
            "weeks to now, looped)"
        )
    return True


def period_s(base: Signal, where: str) -> int:
    """The replayed period: the trace's whole weeks (at least one)."""
    res = base.meta.resolution_s
    if not len(base.frame):
        raise SourceSpecError(f"{where}: the trace holds no data to replay")
    if WEEK_S % res:
        raise SourceSpecError(f"{where}: replay needs a resolution that divides a week")
    weeks = len(base.frame) * res // WEEK_S
    if weeks < 1:
        days = len(base.frame) * res / 86400
        raise SourceSpecError(
            f"{where}: replay needs a trace of at least 7 days (this one has {days:.1f})"
        )
    return weeks * WEEK_S


def replayed(
    base: Signal, start: datetime | None, end: datetime | None, where: str, now: datetime
) -> Signal:
    """The replayed signal over ``[start, end)``; a missing bound: four weeks (at most one
    period) before or after ``now``."""
    import numpy as np
    import pandas as pd

    res = base.meta.resolution_s
    period = period_s(base, where)
    origin = base.start
    assert origin is not None
    side = timedelta(seconds=min(period, DEFAULT_SIDE_S))
    end = end or now + side
    start = start or now - side
    k0 = math.floor((start - origin).total_seconds() / res)
    k1 = math.ceil((end - origin).total_seconds() / res)
    if k1 - k0 > MAX_POINTS:
        raise SourceSpecError(
            f"{where}: {k1 - k0:,} points asked of a replay, more than {MAX_POINTS:,}"
        )
    steps = np.arange(k0, max(k0, k1), dtype=np.int64)
    frame = base.frame.iloc[steps % (period // res)].copy()
    first = pd.Timestamp(origin.astimezone(UTC))
    frame.index = pd.DatetimeIndex(
        first + pd.to_timedelta(steps * res, unit="s"), name=frame.index.name
    )
    return Signal(frame, base.meta)
