"""The ``GridSource`` interface and helpers every adapter shares.

What a provider answers is untrusted: a value that is not a finite number in range (a
string, NaN, infinity, a negative carbon intensity) is unknown (NaN), handled as a gap;
a row whose time cannot be read, or times no signal can hold, are a ``ProviderError``
(that provider failed), never a crash. Rows more than a day outside the range asked for
are dropped before the rows are made regular: one point years away would otherwise make
a series of every interval in between."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from grid.errors import GridDataError, ProviderError, SourceSpecError
from grid.resample import regularise
from grid.signal import CARBON, Signal, SignalMeta

Row = tuple[datetime, float | None, bool]  # interval start, value, is forecast
#: The largest value a trace or a provider may give in either sign (g/kWh, or a currency
#: per MWh): far above any grid's, and small enough that sums over years stay finite.
MAX_VALUE = 1e6
MARGIN = timedelta(days=1)  # rows kept outside the range asked for (to tell gaps and steps)


class GridSource(ABC):
    """A signal provider for one zone and one quantity."""

    name: str = "abstract"
    quantity: str = CARBON
    unit: str = "g/kWh"
    kind: str | None = "average"
    basis: str | None = None
    currency: str | None = None
    resolution_s: int | None = None  # known native resolution, else inferred

    def __init__(self, spec: str, zone: str) -> None:
        self.spec = spec
        self.zone = zone

    @abstractmethod
    def history(self, start: datetime, end: datetime) -> Signal:
        """Actual values (a provider's best estimate) over ``[start, end)``."""

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        raise GridDataError(f"{self.spec}: this source has no forecast; use a forecaster")

    def signal(
        self,
        rows: list[Row],
        *,
        issued_at: datetime | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Signal:
        """Rows in the normal form (see ``grid.resample`` for the rule), cut to
        ``[start, end)`` (each bound when given)."""
        low = None if start is None else start - MARGIN  # the margin: the same result inside
        high = None if end is None else end + MARGIN
        if low is not None or high is not None:
            rows = [r for r in rows if (low is None or r[0] >= low)
                    and (high is None or r[0] < high)]  # fmt: skip
        if not rows:
            raise ProviderError(f"{self.spec}: no data in the requested range")
        times, values, forecast = zip(*rows, strict=True)
        low = 0.0 if self.quantity == CARBON else -MAX_VALUE  # prices can be negative
        try:
            frame, res, report = regularise(
                list(times),
                [number(v, low) for v in values],
                list(forecast),
                resolution_s=self.resolution_s,
                column=self.quantity,
            )
        except SourceSpecError as exc:  # times no signal can hold
            if isinstance(self, FileSource):
                raise  # the user's file
            raise ProviderError(f"{self.spec}: unusable answer ({exc})") from None
        meta = SignalMeta(
            source=self.spec,
            zone=self.zone,
            quantity=self.quantity,
            unit=self.unit,
            resolution_s=res,
            kind=self.kind,
            basis=self.basis,
            currency=self.currency,
            issued_at=issued_at,
            report=report,
        )
        return Signal(frame, meta).between(start, end)


class FileSource(GridSource):
    """A source whose whole signal is read (or made) at once, such as a CSV trace: history
    is a slice of it, and so is a forecast (a trace is what happened: a perfect forecast;
    for other error models see ``grid.forecasters``)."""

    replay: bool = False  # ``replay=now``: shifted by whole weeks to now, looped

    @abstractmethod
    def load(self) -> Signal: ...

    def history(self, start: datetime | None, end: datetime | None) -> Signal:
        if self.replay:
            return self._replayed(start, end)
        return self.load().between(start, end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        if self.replay:
            signal = self._replayed(issued_at, issued_at + horizon)
        else:
            signal = self.load().between(issued_at, issued_at + horizon)
        return Signal(signal.frame.assign(forecast=True), signal.meta).with_meta(
            issued_at=issued_at
        )

    def _replayed(self, start: datetime | None, end: datetime | None) -> Signal:
        from grid.replay import replayed

        return replayed(self.load(), start, end, self.name, datetime.now(UTC))


def number(value, low: float = -MAX_VALUE) -> float:
    """A value as a float: NaN (unknown) unless it is a finite number in ``[low, MAX]``."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return x if low <= x <= MAX_VALUE else math.nan  # NaN fails both


def field(item, key: str):
    """``item[key]`` of a row that should be an object; None when it is not one."""
    return item.get(key) if isinstance(item, dict) else None


def row_time(value, spec: str) -> datetime:
    """A row's time from a provider: ISO 8601 text or epoch seconds. Anything else is a
    ``ProviderError`` (an answer of the wrong shape)."""
    try:
        if isinstance(value, str):
            return parse_time(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        pass
    raise ProviderError(f"{spec}: unexpected response shape (a row's time is not a time)")


def chunks(
    start: datetime, end: datetime, span: timedelta, *, split_at_new_year: bool = False
) -> Iterator[tuple[datetime, datetime]]:
    """``[start, end)`` in pieces of at most ``span`` (and never across 1 January)."""
    if start >= end:
        raise GridDataError(f"start {start.isoformat()} is not before end {end.isoformat()}")
    cursor = start
    while cursor < end:
        stop = min(end, cursor + span)
        if split_at_new_year:
            new_year = datetime(cursor.year + 1, 1, 1, tzinfo=UTC)
            stop = min(stop, new_year)
        yield cursor, stop
        cursor = stop


def parse_time(text: str) -> datetime:
    """Provider timestamps: ISO 8601 with Z or an offset; naive ones are UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def iso_z(value: datetime, minutes: bool = False) -> str:
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%MZ" if minutes else "%Y-%m-%dT%H:%M:%SZ")
