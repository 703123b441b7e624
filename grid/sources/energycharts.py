"""Energy-Charts (Fraunhofer ISE), no key: CO2 intensity (``/co2eq``, measured values
first, then the forecast, both padded with null) and day-ahead prices (``/price``;
``energy-charts:DE?signal=price``). Requests go in chunks of at most 31 days, with times
as ISO 8601 in UTC (a bare date would be read as a CET day)."""

from __future__ import annotations

from datetime import datetime, timedelta

from grid.http import HttpApi, shape_error
from grid.signal import PRICE, Signal
from grid.sources.base import GridSource, Row, chunks, iso_z, row_time

BASE_URL = "https://api.energy-charts.info"
MAX_SPAN = timedelta(days=31)
BIDDING_ZONES = {"DE": "DE-LU", "LU": "DE-LU"}


class EnergyCharts(GridSource):
    name = "energy-charts"
    basis = "lifecycle"

    def __init__(self, spec: str, api: HttpApi, zone: str, signal: str = "carbon") -> None:
        super().__init__(spec, zone.upper())
        self.api = api
        self.api.name = "energy-charts"
        if signal == "price":
            self.quantity, self.unit, self.kind, self.basis = PRICE, "EUR/MWh", None, None
            self.currency = "EUR"
        self.country = self.zone.split("-")[0].lower()
        self.bidding_zone = BIDDING_ZONES.get(self.zone, self.zone)

    def _fetch(self, a: datetime, b: datetime) -> list[Row]:
        if self.quantity == PRICE:
            params = {"bzn": self.bidding_zone, "start": iso_z(a), "end": iso_z(b)}
            payload = self.api.get_json("/price", params=params)
            series = [("price", False)]
        else:
            params = {"country": self.country, "start": iso_z(a), "end": iso_z(b)}
            payload = self.api.get_json("/co2eq", params=params)
            series = [("co2eq", False), ("co2eq_forecast", True)]
        if not isinstance(payload, dict) or not isinstance(payload.get("unix_seconds"), list):
            raise shape_error(self.spec, "no unix_seconds")
        if self.quantity == PRICE and "EUR" not in str(payload.get("unit", "EUR")):
            self.unit = str(payload["unit"]).replace(" ", "")
        columns = [(_list(payload.get(key)), is_forecast) for key, is_forecast in series]
        rows = []
        for i, seconds in enumerate(payload["unix_seconds"]):
            when = row_time(seconds, self.spec)
            for values, is_forecast in columns:
                if i < len(values) and values[i] is not None:
                    rows.append((when, values[i], is_forecast))
                    break
            else:
                rows.append((when, None, False))
        return rows

    def history(self, start: datetime, end: datetime) -> Signal:
        rows = [row for a, b in chunks(start, end, MAX_SPAN) for row in self._fetch(a, b)]
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        rows = self._fetch(issued_at, issued_at + horizon)
        return self.signal(
            [(t, v, True) for t, v, _ in rows], issued_at=issued_at, end=issued_at + horizon
        )


def _list(value) -> list:
    return value if isinstance(value, list) else []
