"""The ``GridSource`` interface and helpers every adapter shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from grid.errors import GridDataError, ProviderError
from grid.resample import regularise
from grid.signal import CARBON, Signal, SignalMeta

Row = tuple[datetime, float | None, bool]  # interval start, value, is forecast


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
        """Rows in the normal form (see ``grid.resample`` for the rule)."""
        if not rows:
            raise ProviderError(f"{self.spec}: no data in the requested range")
        times, values, forecast = zip(*rows, strict=True)
        frame, res, report = regularise(
            list(times),
            [_num(v) for v in values],
            list(forecast),
            resolution_s=self.resolution_s,
            column=self.quantity,
        )
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

    @abstractmethod
    def load(self) -> Signal: ...

    def history(self, start: datetime | None, end: datetime | None) -> Signal:
        return self.load().between(start, end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        signal = self.load().between(issued_at, issued_at + horizon)
        return Signal(signal.frame.assign(forecast=True), signal.meta).with_meta(
            issued_at=issued_at
        )


def _num(value) -> float:
    try:
        return float("nan") if value is None else float(value)
    except (TypeError, ValueError):
        return float("nan")


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
