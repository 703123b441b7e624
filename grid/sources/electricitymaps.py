"""Electricity Maps API v3 (key in header ``auth-token``): average intensity, lifecycle
by default (``?basis=direct`` for direct), hourly. History through ``past-range`` in
chunks of at most 10 days (``history`` for the last 24 hours), ``latest`` and
``forecast``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from grid.http import HttpApi, shape_error
from grid.signal import Signal
from grid.sources.base import GridSource, Row, chunks, field, iso_z, row_time

BASE_URL = "https://api.electricitymap.org/v3"
MAX_SPAN = timedelta(days=10)


class ElectricityMaps(GridSource):
    name = "electricitymaps"
    resolution_s = 3600

    def __init__(
        self, spec: str, api: HttpApi, zone: str, api_key: str, basis: str = "lifecycle"
    ) -> None:
        super().__init__(spec, zone)
        self.api = api
        self.api.name = "electricitymaps"
        self.basis = basis
        self._headers = {"auth-token": api_key}

    def _get(self, path: str, **params):
        params = {"zone": self.zone, "emissionFactorType": self.basis, **params}
        return self.api.get_json(path, params=params, headers=self._headers)

    def _rows(self, items, forecast: bool) -> list[Row]:
        if not isinstance(items, list):
            raise shape_error(self.spec, "expected a list of rows")
        return [
            (row_time(field(item, "datetime"), self.spec), field(item, "carbonIntensity"),
             forecast)
            for item in items
        ]  # fmt: skip

    def history(self, start: datetime, end: datetime) -> Signal:
        now = datetime.now(UTC)
        if start >= now - timedelta(hours=24):  # the free tier's recent history
            payload = self._get("/carbon-intensity/history")
            rows = self._rows(payload.get("history") if isinstance(payload, dict) else None, False)
            return self.signal(rows, start=start, end=end)
        rows = []
        for a, b in chunks(start, end, MAX_SPAN):
            payload = self._get("/carbon-intensity/past-range", start=iso_z(a), end=iso_z(b))
            rows += self._rows(payload.get("data") if isinstance(payload, dict) else None, False)
        return self.signal(rows, start=start, end=end)

    def latest(self) -> tuple[datetime, float | None]:
        payload = self._get("/carbon-intensity/latest")
        (row,) = self._rows([payload], False)
        return row[0], row[1]

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        payload = self._get("/carbon-intensity/forecast")
        if not isinstance(payload, dict):
            raise shape_error(self.spec, "forecast is not an object")
        updated = payload.get("updatedAt")
        issued = row_time(updated, self.spec) if updated else issued_at
        rows = self._rows(payload.get("forecast"), True)
        return self.signal(rows, issued_at=issued, end=issued_at + horizon)
