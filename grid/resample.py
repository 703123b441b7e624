"""Raw rows (any steps, gaps, duplicates, DST days) to a regular UTC series.

The rule, stated once:
1. Timestamps are converted to UTC (naive ones are taken as UTC, as the traces are).
2. Rows sharing a timestamp are duplicates: their mean is kept.
3. The resolution is the one given, else the most common step between rows.
4. Each interval ``[t, t + resolution)`` takes the mean of the rows that start in it; rows
   finer than the resolution are thus averaged, never dropped ("aggregated").
5. An interval with no row is filled by time interpolation between its neighbours when the
   gap is at most ``max_gap_s`` (default 6 hours), else left NaN ("missing"). A row whose
   value the provider gave as null stays NaN: it is unknown, not absent.
A row is a forecast when any row averaged into it was one.

Bounds, so that no file or answer can ask for more than memory holds: timestamps lie in
1900 .. 2200, and the regular series has at most ``MAX_POINTS`` points (ten 1-second rows
followed by one three years later would make 94.7 million).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grid.errors import SourceSpecError
from grid.signal import ResampleReport

MAX_GAP_S = 6 * 3600
MAX_POINTS = 1_000_000  # e.g. ten years of 5-minute data
EARLIEST = pd.Timestamp("1900-01-01", tz="UTC")
LATEST = pd.Timestamp("2200-01-01", tz="UTC")


def infer_resolution_s(index: pd.DatetimeIndex) -> int:
    if len(index) < 2:
        raise SourceSpecError("need at least two rows to tell the resolution")
    steps = np.diff(index.as_unit("ns").asi8) // 10**9
    steps = steps[steps > 0]
    values, counts = np.unique(steps, return_counts=True)
    return int(values[counts == counts.max()].max())  # ties: the coarser step, no invention


def regularise(
    times,
    values,
    forecast=None,
    *,
    resolution_s: int | None = None,
    max_gap_s: int = MAX_GAP_S,
    column: str = "value",
) -> tuple[pd.DataFrame, int, ResampleReport]:
    """Apply the rule above. Returns (frame, resolution_s, report)."""
    try:
        index = pd.DatetimeIndex(pd.to_datetime(times, utc=True))
    except (pd.errors.OutOfBoundsDatetime, OverflowError):
        raise SourceSpecError("timestamps must lie between 1900 and 2200") from None
    if len(index) and (index.min() < EARLIEST or index.max() >= LATEST):
        raise SourceSpecError(
            f"timestamps must lie between 1900 and 2200, not {index.min()} .. {index.max()}"
        )
    raw = pd.DataFrame(
        {
            column: pd.to_numeric(pd.Series(values, index=index), errors="coerce").astype(float),
            "forecast": pd.Series(
                forecast if forecast is not None else False, index=index, dtype=bool
            ),
        }
    ).sort_index()
    raw_rows = len(raw)
    by_time = raw.groupby(level=0).agg({column: "mean", "forecast": "max"})
    duplicates = raw_rows - len(by_time)
    res = resolution_s or infer_resolution_s(by_time.index)
    first, last = by_time.index[0], by_time.index[-1]
    points = int((last - first).total_seconds() // res) + 1
    if points > MAX_POINTS:
        raise SourceSpecError(
            f"rows from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} at {res}s "
            f"intervals make {points:,} points, more than {MAX_POINTS:,}: give a coarser "
            "resolution (e.g. ?resolution=1h) or split the data"
        )
    floor = by_time.index.floor(f"{res}s")
    grouped = by_time.groupby(floor).agg({column: "mean", "forecast": "max"})
    aggregated = len(by_time) - len(grouped)
    full = pd.date_range(grouped.index[0], grouped.index[-1], freq=f"{res}s", name="start")
    frame = grouped.reindex(full)
    empty = pd.Series(~full.isin(grouped.index), index=full)
    run_id = (~empty).cumsum()  # consecutive empty intervals share an id
    run_len = empty.groupby(run_id).transform("sum")
    fillable = empty & (run_len * res <= max_gap_s)  # a gap is filled whole or not at all
    interpolated = frame[column].interpolate(method="time", limit_area="inside")
    filled_mask = fillable & interpolated.notna()
    frame.loc[filled_mask, column] = interpolated[filled_mask]  # a provider's null stays NaN
    frame["forecast"] = frame["forecast"].fillna(False).astype(bool)
    report = ResampleReport(
        raw_rows=raw_rows,
        duplicates=duplicates,
        aggregated=aggregated,
        filled=int(filled_mask.sum()),
        missing=int(frame[column].isna().sum()),
        rule=f"{res}s intervals; duplicates and finer rows averaged; gaps up to "
        f"{max_gap_s // 3600}h interpolated in time",
    )
    return frame, res, report
