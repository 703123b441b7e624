"""UK Carbon Intensity API (NESO), no key. National or regional (``uk:region=13``),
30-minute average intensity, generation-based (direct). Ranges are fetched in chunks of at
most 14 days, never across 1 January; ``{from}`` gets one minute added, because the API
answers with the period that contains it."""

from __future__ import annotations

from datetime import datetime, timedelta

from grid.http import HttpApi, shape_error
from grid.signal import Signal
from grid.sources.base import GridSource, Row, chunks, field, iso_z, row_time

BASE_URL = "https://api.carbonintensity.org.uk"
MAX_SPAN = timedelta(days=14)


class UkCarbonIntensity(GridSource):
    name = "uk"
    basis = "direct"
    resolution_s = 1800

    def __init__(self, spec: str, api: HttpApi, region: int | None = None) -> None:
        super().__init__(spec, zone=f"GB-region-{region}" if region else "GB")
        self.api = api
        self.api.name = "uk"
        self.region = region

    def _rows(self, payload) -> list[Row]:
        data = field(payload, "data")
        if isinstance(data, dict):  # regional answers wrap the list in an object
            data = data.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict) and "regionid" in data[0]:
            data = [row for region in data for row in _list(field(region, "data"))]
        if not isinstance(data, list):
            raise shape_error(self.spec, "no data list")
        rows = []
        for item in data:
            start = row_time(field(item, "from"), self.spec)
            intensity = field(item, "intensity")
            actual, forecast = field(intensity, "actual"), field(intensity, "forecast")
            rows.append((start, actual if actual is not None else forecast, actual is None))
        return rows

    def history(self, start: datetime, end: datetime) -> Signal:
        rows: list[Row] = []
        for a, b in chunks(start, end, MAX_SPAN, split_at_new_year=True):
            frm, to = iso_z(a + timedelta(minutes=1), True), iso_z(b, True)
            path = (
                f"/regional/intensity/{frm}/{to}/regionid/{self.region}"
                if self.region
                else f"/intensity/{frm}/{to}"
            )
            rows += self._rows(self.api.get_json(path))
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        frm = iso_z(issued_at + timedelta(minutes=1), True)
        window = "fw48h" if horizon > timedelta(hours=24) else "fw24h"
        path = (
            f"/regional/intensity/{frm}/{window}/regionid/{self.region}"
            if self.region
            else f"/intensity/{frm}/{window}"
        )
        rows = [(t, v, True) for t, v, _ in self._rows(self.api.get_json(path))]
        return self.signal(rows, issued_at=issued_at, end=issued_at + horizon)


def _list(value) -> list:
    return value if isinstance(value, list) else []
