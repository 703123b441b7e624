"""WattTime API v3: the marginal operating emissions rate (MOER), 5-minute points.
Login with HTTP Basic gives a bearer token valid 30 minutes; it is refreshed before it
expires and once more if the API refuses it. Values in lbs CO2/MWh are converted to g/kWh
(× 0.45359237). The ``signal-index`` percentile is not an intensity and is refused."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import httpx

from grid.errors import CredentialsRefused, GridDataError
from grid.http import HttpApi, shape_error
from grid.signal import Signal
from grid.sources.base import GridSource, Row, chunks, field, number, row_time

BASE_URL = "https://api.watttime.org"
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
TOKEN_LIFE_S = 30 * 60
MAX_SPAN = timedelta(days=30)


class WattTime(GridSource):
    name = "watttime"
    kind = "marginal"
    basis = "direct"
    resolution_s = 300

    def __init__(
        self,
        spec: str,
        api: HttpApi,
        region: str,
        username: str,
        password: str,
        *,
        signal_type: str = "co2_moer",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(spec, zone=region)
        self.api = api
        self.api.name = "watttime"
        self._auth = (username, password)
        self.signal_type = signal_type
        self._clock = clock
        self._token: str | None = None
        self._token_at = 0.0

    def _login(self) -> str:
        payload = self.api.get_json("/login", auth=httpx.BasicAuth(*self._auth))
        token = payload.get("token") if isinstance(payload, dict) else None
        if not token:
            raise shape_error(self.spec, "login without a token")
        self._token, self._token_at = token, self._clock()
        return token

    def _get(self, path: str, params: dict) -> dict:
        if self._token is None or self._clock() - self._token_at > TOKEN_LIFE_S - 60:
            self._login()
        try:
            return self.api.get_json(
                path, params=params, headers={"Authorization": f"Bearer {self._token}"}
            )
        except CredentialsRefused:  # token revoked or expired early: log in once more
            self._login()
            return self.api.get_json(
                path, params=params, headers={"Authorization": f"Bearer {self._token}"}
            )

    def _rows(self, payload, forecast: bool) -> list[Row]:
        if not isinstance(field(payload, "data"), list):
            raise shape_error(self.spec, "no data list")
        units = field(payload.get("meta"), "units") or "lbs_co2_per_mwh"
        if units == "percentile":
            raise GridDataError(
                f"{self.spec}: the signal index is a percentile, not an "
                "intensity; gridshift needs co2_moer"
            )
        factor = LBS_PER_MWH_TO_G_PER_KWH if units == "lbs_co2_per_mwh" else 1.0
        return [
            (row_time(field(item, "point_time"), self.spec),
             number(field(item, "value")) * factor, forecast)
            for item in payload["data"]
        ]  # fmt: skip

    def history(self, start: datetime, end: datetime) -> Signal:
        rows: list[Row] = []
        for a, b in chunks(start, end, MAX_SPAN):  # the end is inclusive at WattTime
            params = {
                "region": self.zone,
                "signal_type": self.signal_type,
                "start": a.isoformat(),
                "end": b.isoformat(),
            }
            rows += self._rows(self._get("/v3/historical", params), False)
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        hours = max(1, min(72, round(horizon.total_seconds() / 3600)))
        payload = self._get(
            "/v3/forecast",
            {"region": self.zone, "signal_type": self.signal_type, "horizon_hours": hours},
        )
        rows = self._rows(payload, True)
        generated = field(payload.get("meta"), "generated_at")
        issued = row_time(generated, self.spec) if generated else issued_at
        return self.signal(rows, issued_at=issued, end=issued_at + horizon)
