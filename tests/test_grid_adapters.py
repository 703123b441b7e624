"""Every adapter through httpx.MockTransport against recorded-shape responses."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from grid.errors import (
    CredentialsRefused,
    GridDataError,
    MissingCredentials,
    ProviderError,
    SourceSpecError,
)
from grid.registry import ProviderConfig, build_source
from grid.signal import PRICE
from tests.grid_fixtures import Router, ok, uk_rows

T0 = datetime(2023, 6, 1, tzinfo=UTC)
NO_SLEEP = {"sleep": lambda s: None}


def _source(spec: str, router: Router, **config):
    providers = {spec.split(":")[0]: ProviderConfig(**config)}
    return build_source(spec, providers, router.client(), **NO_SLEEP)


# -- HTTP behaviour (through the UK adapter) -------------------------------------------------


def test_429_then_success_honours_retry_after():
    waits = []
    router = Router().on(
        "/intensity/",
        httpx.Response(429, headers={"Retry-After": "7"}),
        ok({"data": uk_rows(0, 4)}),
    )
    providers = {"uk": ProviderConfig()}
    src = build_source("uk", providers, router.client(), sleep=waits.append)
    signal = src.history(T0, T0 + timedelta(hours=2))
    assert waits == [7.0] and len(router.requests) == 2
    assert list(signal.values) == [100, 101, 102, 103]


def test_500_until_the_retries_run_out():
    router = Router().on("/intensity/", httpx.Response(500, text="outage"))
    src = _source("uk", router)
    with pytest.raises(ProviderError, match="failed after 5 tries \\(HTTP 500\\)"):
        src.history(T0, T0 + timedelta(hours=2))
    assert len(router.requests) == 5


def test_malformed_json_and_wrong_shape():
    router = Router().on("/intensity/", httpx.Response(200, text="{not json"))
    with pytest.raises(ProviderError, match="malformed JSON"):
        _source("uk", router).history(T0, T0 + timedelta(hours=2))
    router = Router().on("/intensity/", ok({"data": 5}))
    with pytest.raises(ProviderError, match="unexpected response shape"):
        _source("uk", router).history(T0, T0 + timedelta(hours=2))


def test_transport_errors_are_retried_then_reported():
    """A connection broken mid-answer is retried (one never made fails at once:
    tests/test_grid_faults.py)."""
    calls = []

    def flaky(request):
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ReadError("connection reset by peer")
        return ok({"data": uk_rows(0, 2)})

    router = Router().on("/intensity/", flaky)
    assert len(_source("uk", router).history(T0, T0 + timedelta(hours=1)).frame) == 2


# -- UK Carbon Intensity ---------------------------------------------------------------------


def test_uk_null_actual_falls_back_to_forecast_and_is_marked():
    rows = uk_rows(0, 4)
    rows[3]["intensity"]["actual"] = None
    router = Router().on("/intensity/", ok({"data": rows}))
    signal = _source("uk", router).history(T0, T0 + timedelta(hours=2))
    assert list(signal.values) == [100, 101, 102, 203]
    assert list(signal.frame["forecast"]) == [False, False, False, True]
    assert signal.meta.resolution_s == 1800 and signal.meta.zone == "GB"


def test_uk_duplicated_record_is_kept_once():
    rows = uk_rows(19, 4, day="2021-04-19")
    rows.insert(1, dict(rows[0]))  # the API's known duplicate at 2021-04-19T19:00Z
    router = Router().on("/intensity/", ok({"data": rows}))
    start = datetime(2021, 4, 19, 19, tzinfo=UTC)
    signal = _source("uk", router).history(start, start + timedelta(hours=2))
    assert len(signal.frame) == 4 and signal.meta.report.duplicates == 1


def test_uk_long_range_is_chunked_at_14_days_and_at_new_year():
    def answer(request):
        _, _, frm, to = request.url.path.split("/")
        start = datetime.fromisoformat(frm.replace("Z", "+00:00")) - timedelta(minutes=1)
        end = datetime.fromisoformat(to.replace("Z", "+00:00"))
        rows, t = [], start
        while t < end:
            rows.append(
                {
                    "from": t.strftime("%Y-%m-%dT%H:%MZ"),
                    "to": (t + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%MZ"),
                    "intensity": {"forecast": 1, "actual": t.day},
                }
            )
            t += timedelta(minutes=30)
        return ok({"data": rows})

    router = Router().on("/intensity/", answer)
    start, end = datetime(2022, 12, 20, tzinfo=UTC), datetime(2023, 1, 20, tzinfo=UTC)
    signal = _source("uk", router).history(start, end)
    paths = [r.url.path for r in router.requests]
    assert paths == [
        "/intensity/2022-12-20T00:01Z/2023-01-01T00:00Z",
        "/intensity/2023-01-01T00:01Z/2023-01-15T00:00Z",
        "/intensity/2023-01-15T00:01Z/2023-01-20T00:00Z",
    ]
    assert len(signal.frame) == 31 * 48 and signal.values.notna().all()
    assert signal.start == start and signal.end == end


def test_uk_regional_range_and_forecast_shapes():
    regional = {
        "data": {
            "regionid": 13,
            "shortname": "London",
            "data": [
                {**row, "generationmix": [{"fuel": "gas", "perc": 28.5}]}
                for row in uk_rows(0, 4, actual=False)
            ],
        }
    }
    router = Router().on("/regional/intensity/", ok(regional))
    src = _source("uk:region=13", router)
    signal = src.history(T0, T0 + timedelta(hours=2))
    assert list(signal.values) == [200, 201, 202, 203] and signal.meta.zone == "GB-region-13"
    assert router.requests[0].url.path.endswith("/regionid/13")
    fw = src.forecast(T0, timedelta(hours=2))
    assert fw.frame["forecast"].all() and fw.meta.issued_at == T0
    assert "/fw24h/" in router.requests[-1].url.path
    with pytest.raises(SourceSpecError, match="region must be a number"):
        _source("uk:region=london", router)


# -- Electricity Maps ------------------------------------------------------------------------


def _em_rows(start: datetime, hours: int, null_at=None):
    return [
        {
            "zone": "DE",
            "carbonIntensity": None if i == null_at else 300 + i,
            "datetime": (start + timedelta(hours=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "updatedAt": "2023-06-30T00:00:00.000Z",
            "emissionFactorType": "lifecycle",
            "isEstimated": None,
        }
        for i in range(hours)
    ]


def test_electricitymaps_past_range_chunks_nulls_and_key_header():
    def answer(request):
        a = datetime.fromisoformat(request.url.params["start"].replace("Z", "+00:00"))
        b = datetime.fromisoformat(request.url.params["end"].replace("Z", "+00:00"))
        return ok({"zone": "DE", "data": _em_rows(a, int((b - a) / timedelta(hours=1)), null_at=5)})

    router = Router().on("/carbon-intensity/past-range", answer)
    src = _source("electricitymaps:DE", router, api_key="sekrit-key")
    signal = src.history(T0, T0 + timedelta(days=25))
    assert len(router.requests) == 3, "10-day chunks"
    assert all(r.headers["auth-token"] == "sekrit-key" for r in router.requests)
    assert router.requests[0].url.params["emissionFactorType"] == "lifecycle"
    assert len(signal.frame) == 25 * 24 and signal.meta.report.filled == 0
    assert math.isnan(signal.values.iloc[5]), "a null stays unknown, not invented"


def test_electricitymaps_forecast_latest_and_missing_key():
    router = Router().on(
        "/carbon-intensity/forecast",
        ok(
            {
                "zone": "DE",
                "updatedAt": "2023-06-01T00:05:00.000Z",
                "forecast": [
                    {"carbonIntensity": 77 + i, "datetime": f"2023-06-01T{i:02d}:00:00.000Z"}
                    for i in range(6)
                ],
            }
        ),
    )
    router.on("/carbon-intensity/latest", ok(_em_rows(T0, 1)[0]))
    src = _source("electricitymaps:DE?basis=direct", router, api_key="k")
    fw = src.forecast(T0, timedelta(hours=4))
    assert list(fw.values) == [77, 78, 79, 80]
    assert fw.meta.issued_at == datetime(2023, 6, 1, 0, 5, tzinfo=UTC)
    assert src.latest() == (T0, 300)
    assert router.requests[0].url.params["emissionFactorType"] == "direct"
    with pytest.raises(MissingCredentials, match="GRIDSHIFT_GRID__ELECTRICITYMAPS__API_KEY"):
        _source("electricitymaps:DE", router)


def test_refused_key_is_the_providers_failure_without_the_key():
    router = Router().on("/carbon-intensity/", httpx.Response(401, text="bad token"))
    src = _source("electricitymaps:DE", router, api_key="sekrit-key")
    with pytest.raises(CredentialsRefused) as info:
        src.history(T0, T0 + timedelta(days=2))
    assert "sekrit" not in str(info.value) and "refused the credentials" in str(info.value)
    assert isinstance(info.value, ProviderError) and not isinstance(info.value, SourceSpecError)
    assert len(router.requests) == 1, "a refused key is not retried"


# -- WattTime --------------------------------------------------------------------------------


def _moer(start: datetime, points: int, value=1000.0):
    return {
        "data": [
            {"point_time": (start + timedelta(minutes=5 * i)).isoformat(), "value": value}
            for i in range(points)
        ],
        "meta": {
            "region": "CAISO_NORTH",
            "signal_type": "co2_moer",
            "units": "lbs_co2_per_mwh",
            "data_point_period_seconds": 300,
            "generated_at": "2023-06-01T00:00:00+00:00",
        },
    }


def test_watttime_login_units_and_token_refresh():
    tokens = iter(["t1", "t2"])
    hist = iter([httpx.Response(401), ok(_moer(T0, 12))])
    router = Router().on("/login", lambda r: ok({"token": next(tokens)}))
    router.on("/v3/historical", lambda r: next(hist))
    src = _source("watttime:CAISO_NORTH", router, username="u", password="p")
    signal = src.history(T0, T0 + timedelta(hours=1))
    assert signal.values.iloc[0] == pytest.approx(453.59237), "lbs/MWh to g/kWh"
    assert signal.meta.kind == "marginal" and signal.meta.resolution_s == 300
    logins = [r for r in router.requests if r.url.path == "/login"]
    assert len(logins) == 2, "refused token: log in again"
    assert logins[0].headers["authorization"].startswith("Basic ")
    assert router.requests[-1].headers["authorization"] == "Bearer t2"


def test_watttime_forecast_and_percentile_refusal():
    router = Router().on("/login", ok({"token": "t"}))
    router.on("/v3/forecast", ok(_moer(T0, 24, value=500)))
    src = _source("watttime:CAISO_NORTH", router, username="u", password="p")
    fw = src.forecast(T0, timedelta(hours=1))
    assert len(fw.frame) == 12 and fw.frame["forecast"].all()
    assert router.requests[-1].url.params["horizon_hours"] == "1"
    index = _moer(T0, 2)
    index["meta"]["units"] = "percentile"
    router = Router().on("/login", ok({"token": "t"})).on("/v3/historical", ok(index))
    with pytest.raises(GridDataError, match="percentile, not an intensity"):
        _source("watttime:CAISO_NORTH", router, username="u", password="p").history(
            T0, T0 + timedelta(hours=1)
        )


# -- Energy-Charts ---------------------------------------------------------------------------


def test_energy_charts_co2_with_forecast_padding_and_price():
    secs = [int((T0 + timedelta(hours=i)).timestamp()) for i in range(6)]
    router = Router().on(
        "/co2eq",
        ok(
            {
                "unix_seconds": secs,
                "co2eq": [300, 310, 320, None, None, None],
                "co2eq_forecast": [None, None, None, 330, 340, None],
            }
        ),
    )
    router.on(
        "/price",
        ok(
            {
                "license_info": "CC BY 4.0",
                "unix_seconds": secs,
                "price": [80.5, -3.2, 10, 11, 12, 13],
                "unit": "EUR / MWh",
                "deprecated": False,
            }
        ),
    )
    co2 = _source("energy-charts:DE", router).history(T0, T0 + timedelta(hours=6))
    assert list(co2.values[:5]) == [300, 310, 320, 330, 340]
    assert list(co2.frame["forecast"][:5]) == [False, False, False, True, True]
    assert math.isnan(co2.values.iloc[5])
    assert router.requests[0].url.params["country"] == "de"
    price = _source("energy-charts:DE?signal=price", router).history(T0, T0 + timedelta(hours=6))
    assert price.meta.quantity == PRICE and price.meta.currency == "EUR"
    assert price.values.iloc[1] == -3.2, "prices can be negative"
    assert router.requests[-1].url.params["bzn"] == "DE-LU"


def test_energy_charts_15_minute_prices_after_the_switch():
    start = datetime(2025, 10, 1, tzinfo=UTC)
    secs = [int((start + timedelta(minutes=15 * i)).timestamp()) for i in range(8)]
    router = Router().on(
        "/price", ok({"unix_seconds": secs, "price": list(range(8)), "unit": "EUR / MWh"})
    )
    price = _source("energy-charts:DE?signal=price", router).history(
        start, start + timedelta(hours=2)
    )
    assert price.meta.resolution_s == 900 and len(price.frame) == 8


# -- ENTSO-E ---------------------------------------------------------------------------------

A44 = """<?xml version="1.0" encoding="UTF-8"?>
<Publication_MarketDocument xmlns="urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3">
  <TimeSeries><curveType>A03</curveType>
    <Period>
      <timeInterval><start>2023-06-01T00:00Z</start><end>2023-06-01T06:00Z</end></timeInterval>
      <resolution>PT60M</resolution>
      <Point><position>1</position><price.amount>95.5</price.amount></Point>
      <Point><position>2</position><price.amount>90</price.amount></Point>
      <Point><position>5</position><price.amount>-4.1</price.amount></Point>
    </Period>
  </TimeSeries>
</Publication_MarketDocument>"""


def test_entsoe_a03_forward_fill_and_token_stays_out_of_errors():
    router = Router().on("/api", httpx.Response(200, text=A44))
    src = _source("entsoe:DE-LU", router, api_key="tok-123", base_url="https://e.test/api")
    signal = src.history(T0, T0 + timedelta(hours=6))
    assert list(signal.values) == [95.5, 90, 90, 90, -4.1, -4.1]
    params = router.requests[0].url.params
    assert params["in_Domain"] == "10Y1001A1001A82H" and params["documentType"] == "A44"
    assert params["periodStart"] == "202306010000"
    bad = Router().on("/api", httpx.Response(400, text="bad request"))
    with pytest.raises(ProviderError) as info:
        _source("entsoe:FR", bad, api_key="tok-123", base_url="https://e.test/api").history(
            T0, T0 + timedelta(hours=6)
        )
    assert "tok-123" not in str(info.value)


def test_entsoe_acknowledgement_and_unknown_zone():
    ack = (
        '<Acknowledgement_MarketDocument xmlns="urn:x"><Reason><code>999</code>'
        "<text>No matching data found</text></Reason></Acknowledgement_MarketDocument>"
    )
    router = Router().on("/api", httpx.Response(200, text=ack))
    src = _source("entsoe:FR", router, api_key="t", base_url="https://e.test/api")
    with pytest.raises(ProviderError, match="No matching data"):
        src.history(T0, T0 + timedelta(hours=6))
    with pytest.raises(SourceSpecError, match="unknown zone"):
        _source("entsoe:XX", router, api_key="t")


# -- Carbon Aware SDK ------------------------------------------------------------------------


def test_carbon_aware_sdk_history_forecast_and_501():
    router = Router().on(
        "/emissions/bylocation",
        ok(
            [
                {
                    "location": "westus",
                    "time": (T0 + timedelta(minutes=5 * i)).isoformat(),
                    "rating": 400 + i,
                    "duration": "00:05:00",
                }
                for i in range(6)
            ]
        ),
    )
    router.on(
        "/emissions/forecasts/current",
        ok(
            [
                {
                    "generatedAt": "2023-06-01T00:00:00+00:00",
                    "location": "westus",
                    "optimalDataPoints": [],
                    "forecastData": [
                        {
                            "location": "westus",
                            "timestamp": (T0 + timedelta(minutes=5 * i)).isoformat(),
                            "duration": 5,
                            "value": 300.0 + i,
                        }
                        for i in range(4)
                    ],
                }
            ]
        ),
    )
    src = _source("carbon-aware:westus", router)
    hist = src.history(T0, T0 + timedelta(minutes=30))
    assert list(hist.values) == [400, 401, 402, 403, 404, 405] and hist.meta.resolution_s == 300
    fw = src.forecast(T0, timedelta(minutes=20))
    assert list(fw.values) == [300, 301, 302, 303]
    router = Router().on("/emissions/forecasts/current", httpx.Response(501))
    with pytest.raises(GridDataError, match="no forecast"):
        _source("carbon-aware:westus", router).forecast(T0, timedelta(hours=1))


def test_every_request_in_these_tests_stayed_in_process():
    """A guard: MockTransport never opens a socket; a stray real client would."""
    assert json.dumps({"ok": True})


# -- the same failure modes for every HTTP adapter --------------------------------------------

SECS = [int((T0 + timedelta(hours=i)).timestamp()) for i in range(2)]
ADAPTERS = {
    "uk": ("uk", {}, "/intensity/", ok({"data": uk_rows(0, 2)})),
    "electricitymaps": (
        "electricitymaps:DE",
        {"api_key": "k"},
        "/past-range",
        ok({"data": _em_rows(T0, 2)}),
    ),
    "watttime": (
        "watttime:CAISO_NORTH",
        {"username": "u", "password": "p"},
        "/v3/historical",
        ok(_moer(T0, 12)),
    ),
    "energy-charts": (
        "energy-charts:DE",
        {},
        "/co2eq",
        ok({"unix_seconds": SECS, "co2eq": [1, 2]}),
    ),
    "entsoe": (
        "entsoe:DE-LU",
        {"api_key": "t", "base_url": "https://e.test/api"},
        "/api",
        httpx.Response(200, text=A44),
    ),
    "carbon-aware": (
        "carbon-aware:westus",
        {},
        "/emissions/bylocation",
        ok(
            [
                {"location": "w", "time": T0.isoformat(), "rating": 1, "duration": "01:00:00"},
                {
                    "location": "w",
                    "time": (T0 + timedelta(hours=1)).isoformat(),
                    "rating": 2,
                    "duration": "01:00:00",
                },
            ]
        ),
    ),
}


def _router(path, *responses) -> Router:
    return Router().on("/login", ok({"token": "t"})).on(path, *responses)


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_adapter_retries_429_then_succeeds(name):
    spec, config, path, good = ADAPTERS[name]
    router = _router(path, httpx.Response(429, headers={"Retry-After": "1"}), good)
    signal = _source(spec, router, **config).history(T0, T0 + timedelta(hours=1))
    assert len(signal.frame) >= 1 and signal.values.notna().any()
    assert sum(path in r.url.path for r in router.requests) == 2


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_adapter_reports_a_persistent_500(name):
    spec, config, path, _ = ADAPTERS[name]
    router = _router(path, httpx.Response(500))
    with pytest.raises(ProviderError, match="HTTP 500"):
        _source(spec, router, **config).history(T0, T0 + timedelta(hours=1))


@pytest.mark.parametrize("name", [n for n in ADAPTERS if n != "entsoe"])
def test_each_json_adapter_reports_malformed_json(name):
    spec, config, path, _ = ADAPTERS[name]
    router = _router(path, httpx.Response(200, text="<html>maintenance</html>"))
    with pytest.raises(ProviderError, match="malformed JSON"):
        _source(spec, router, **config).history(T0, T0 + timedelta(hours=1))


def test_entsoe_reports_malformed_xml():
    router = _router("/api", httpx.Response(200, text="<html>maintenance"))
    with pytest.raises(ProviderError, match="malformed XML"):
        _source("entsoe:DE-LU", router, api_key="t", base_url="https://e.test/api").history(
            T0, T0 + timedelta(hours=1)
        )
