"""The Green Software Foundation's Carbon Aware SDK web API (self-hosted), g/kWh:
``/emissions/bylocation`` for history and ``/emissions/forecasts/current`` (501 when the
backing source has no forecast)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from grid.errors import GridDataError, ProviderError
from grid.http import HttpApi, shape_error
from grid.signal import Signal
from grid.sources.base import GridSource, Row, field, iso_z, row_time

BASE_URL = "http://localhost:8080"
_HMS = re.compile(r"^(?:(\d+)\.)?(\d+):(\d+):(\d+)")


def duration_s(text: str | int | float | None) -> int | None:
    """``"00:05:00"`` / ``"1.00:00:00"`` (.NET time span), ``"PT5M"`` (ISO 8601), or a
    bare number, which the SDK's forecast data uses for minutes."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return int(text * 60) if 0 < text < 1e6 else None  # NaN fails too
    if not isinstance(text, str) or not text:
        return None
    if match := _HMS.match(text):
        days, h, m, s = (int(g or 0) for g in match.groups())
        return days * 86400 + h * 3600 + m * 60 + s
    if match := re.match(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$", text):
        h, m, s = (int(g or 0) for g in match.groups())
        return h * 3600 + m * 60 + s
    return None


class CarbonAwareSdk(GridSource):
    name = "carbon-aware"

    def __init__(self, spec: str, api: HttpApi, location: str) -> None:
        super().__init__(spec, location)
        self.api = api
        self.api.name = "carbon-aware"

    def history(self, start: datetime, end: datetime) -> Signal:
        payload = self.api.get_json(
            "/emissions/bylocation",
            params={"location": self.zone, "time": iso_z(start), "toTime": iso_z(end)},
        )
        if not isinstance(payload, list):
            raise shape_error(self.spec, "expected a list")
        rows: list[Row] = []
        for item in payload:
            rows.append((row_time(field(item, "time"), self.spec), field(item, "rating"), False))
            self.resolution_s = self.resolution_s or duration_s(field(item, "duration"))
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        try:
            payload = self.api.get_json(
                "/emissions/forecasts/current",
                params={
                    "location": self.zone,
                    "dataStartAt": iso_z(issued_at),
                    "dataEndAt": iso_z(issued_at + horizon),
                },
            )
        except ProviderError as exc:
            if "HTTP 501" in str(exc):
                raise GridDataError(f"{self.spec}: the SDK's data source has no forecast") from None
            raise
        if not isinstance(payload, list) or not payload:
            raise shape_error(self.spec, "expected a non-empty list of forecasts")
        first = payload[0]
        points = field(first, "forecastData")
        if not isinstance(points, list):
            raise shape_error(self.spec, "a forecast without forecastData")
        rows = [(row_time(field(p, "timestamp"), self.spec), field(p, "value"), True)
                for p in points]  # fmt: skip
        if rows:
            self.resolution_s = duration_s(field(points[0], "duration"))
        generated = field(first, "generatedAt")
        issued = row_time(generated, self.spec) if generated else issued_at
        return self.signal(rows, issued_at=issued, end=issued_at + horizon)
