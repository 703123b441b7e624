"""CSV traces, the resampling rule, the cache and the forecasters."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import pytest

from grid.cache import CachedChain, SignalCache
from grid.errors import GridDataError, SourceSpecError
from grid.forecasters import make_forecast
from grid.registry import ProviderConfig, build_source
from grid.resample import regularise
from tests.conftest import shared_data
from tests.grid_fixtures import Router, ok, uk_rows

DATA = shared_data() / "grid"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared grid data is absent")


def _csv(path, query: str = ""):
    return build_source(f"csv:{path}{query}", {}, httpx.Client())


# -- the resampling rule ----------------------------------------------------------------------


def test_rule_duplicates_finer_rows_gaps_and_nulls():
    times = [
        "2023-01-01T00:00Z",
        "2023-01-01T00:00Z",
        "2023-01-01T01:00Z",
        "2023-01-01T01:30Z",
        "2023-01-01T02:00Z",
        "2023-01-01T05:00Z",
        "2023-01-01T06:00Z",
        "2023-01-01T15:00Z",
        "2023-01-01T16:00Z",
    ]
    values = [10, 20, 30, 50, None, 60, 70, 80, 90]
    frame, res, report = regularise(times, values, column="v")
    assert res == 3600
    v = frame["v"]
    assert v.iloc[0] == 15, "duplicates averaged"
    assert v.iloc[1] == 40, "the finer 01:30 row averaged into 01:00"
    assert math.isnan(v.iloc[2]), "a null row stays unknown"
    assert v.iloc[3] == pytest.approx(60 - (60 - 40) * 2 / 4), "3 h gap interpolated in time"
    assert v.iloc[8:15].isna().all(), "an 8 h gap is longer than the fill limit"
    assert (report.duplicates, report.aggregated, report.filled) == (1, 1, 2)
    assert report.missing == 1 + 8


def test_dst_day_in_local_time_becomes_23_utc_hours(tmp_path):
    # Europe/Berlin, 2023-03-26: 02:00 local does not exist; the day has 23 hours.
    rows = [f"2023-03-26 {h:02d}:00:00,{100 + h}" for h in range(24) if h != 2]
    path = tmp_path / "berlin.csv"
    path.write_text("time,ci\n" + "\n".join(rows) + "\n")
    signal = _csv(path, "?tz=Europe/Berlin").load()
    assert len(signal.frame) == 23 and signal.meta.resolution_s == 3600
    assert signal.start == datetime(2026 - 3, 3, 25, 23, tzinfo=UTC)
    assert signal.meta.report.filled == 0 and signal.values.notna().all()


def test_generic_csv_options_and_bad_files(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("when,eur,note\n2024-01-01T00:00Z,50,a\n2024-01-01T01:00Z,-5,b\n")
    signal = _csv(path, "?quantity=price&unit=EUR/MWh").load()
    assert signal.meta.quantity == "price_per_mwh" and list(signal.values) == [50, -5]
    two = tmp_path / "two.csv"
    two.write_text("t,a,b\n2024-01-01,1,2\n2024-01-02,3,4\n")
    with pytest.raises(SourceSpecError, match="several numeric columns"):
        _csv(two).load()
    assert list(_csv(two, "?column=b").load().values) == [2, 4]
    for content, message in [
        ("t,name\n2024-01-01,x\n2024-01-02,y\n", "no numeric column"),
        ("", "cannot read"),
        ("t,v\nnot-a-time,1\nnope,2\n", "does not hold timestamps"),
    ]:
        bad = tmp_path / "bad.csv"
        bad.write_text(content)
        with pytest.raises(SourceSpecError, match=message):
            _csv(bad).load()
    with pytest.raises(SourceSpecError, match="no such file"):
        _csv(tmp_path / "absent.csv").load()
    with pytest.raises(SourceSpecError, match="no column 'x'"):
        _csv(two, "?column=x").load()


# -- the real files ---------------------------------------------------------------------------


@needs_data
def test_electricity_maps_export_lifecycle_and_direct():
    path = DATA / "carbon" / "DE-LU" / "DE-LU_2023_hourly.csv"
    lca = _csv(path).load()
    summary = lca.summary()
    assert summary["points"] == 8760 and summary["mean"] == 367.0
    assert summary["resolution_s"] == 3600 and lca.meta.basis == "lifecycle"
    direct = _csv(path, "?basis=direct").load()
    assert direct.meta.basis == "direct" and direct.summary()["mean"] < summary["mean"]


@needs_data
def test_lets_wait_awhile_gb_mixed_steps_lose_nothing():
    signal = _csv(DATA / "lets-wait-awhile" / "gb_ci.csv").load()
    report = signal.meta.report
    assert signal.meta.resolution_s == 1800
    # every raw row is accounted for: one per interval, or averaged into one
    assert report.raw_rows == len(signal.frame) - report.filled + report.aggregated
    assert report.aggregated > 3000, "the 15-minute rows from 2020-10-31 were averaged"
    assert report.missing == 0
    germany = _csv(DATA / "lets-wait-awhile" / "ger_ci.csv").load()
    assert germany.meta.resolution_s == 900 and germany.meta.report.filled == 2


@needs_data
@pytest.mark.parametrize(
    "zone,year,rows", [("DE-LU", 2023, 8760), ("DE-LU", 2024, 8784), ("US-CAL-CISO", 2023, 8760)]
)
def test_price_files(zone, year, rows):
    signal = _csv(DATA / "prices" / zone / f"{zone}_electricity_prices_{year}.csv").load()
    assert signal.meta.unit == "USD/MWh" and signal.meta.currency == "USD"
    assert signal.meta.resolution_s == 3600 and len(signal.frame) == rows
    assert signal.meta.report.raw_rows == rows and signal.values.notna().all()


# -- cache and fallback -----------------------------------------------------------------------

T0 = datetime(2023, 6, 1, tzinfo=UTC)


def test_same_range_is_fetched_once_and_an_outage_is_served_stale(tmp_path):
    router = Router().on("/intensity/", ok({"data": uk_rows(0, 4)}))
    clock = [T0 + timedelta(days=1)]
    uk = build_source("uk", {"uk": ProviderConfig()}, router.client(), sleep=lambda s: None)
    chain = CachedChain([uk], SignalCache(tmp_path), clock=lambda: clock[0])
    first = chain.history(T0, T0 + timedelta(hours=2))
    again = chain.history(T0, T0 + timedelta(hours=2))
    assert len(router.requests) == 1 and list(again.values) == list(first.values)
    assert list(chain.history(T0, T0 + timedelta(hours=1)).values) == [100, 101]
    assert len(router.requests) == 1, "a part of history fetched whole is not fetched again"
    router.rules.clear()
    router.on("/intensity/", httpx.Response(503))
    clock[0] += timedelta(hours=3)
    part = chain.history(T0, T0 + timedelta(hours=3))  # more than cached: the API is down
    assert part.meta.stale_s == pytest.approx(3 * 3600)
    assert list(part.values) == [100, 101, 102, 103] and "HTTP 503" in chain.errors[0]
    with pytest.raises(GridDataError, match="nothing cached covers"):
        chain.history(T0 - timedelta(days=3), T0)


def test_fallback_chain_uses_the_next_source(tmp_path):
    router = Router().on("/intensity/", httpx.Response(500))
    router.on(
        "/co2eq",
        ok(
            {
                "unix_seconds": [int((T0 + timedelta(hours=i)).timestamp()) for i in range(3)],
                "co2eq": [1, 2, 3],
            }
        ),
    )
    providers = {"uk": ProviderConfig(), "energy-charts": ProviderConfig()}
    sources = [
        build_source(s, providers, router.client(), sleep=lambda s: None)
        for s in ("uk", "energy-charts:GB")
    ]
    signal = CachedChain(sources, None).history(T0, T0 + timedelta(hours=3))
    assert signal.meta.source == "energy-charts:GB" and list(signal.values) == [1, 2, 3]


# -- forecasters ------------------------------------------------------------------------------


def _hourly_trace(tmp_path, days=10):
    path = tmp_path / "trace.csv"
    hours = days * 24
    values = [100 + 50 * math.sin(h / 24 * 2 * math.pi) + h / 10 for h in range(hours)]
    lines = [f"{(T0 + timedelta(hours=h)).isoformat()},{v}" for h, v in enumerate(values)]
    path.write_text("time,ci\n" + "\n".join(lines) + "\n")
    return _csv(path).load()


def test_forecasters(tmp_path):
    actual = _hourly_trace(tmp_path)
    issued, horizon = T0 + timedelta(days=5), timedelta(hours=30)
    perfect = make_forecast(actual, issued, horizon)
    assert list(perfect.values) == list(actual.between(issued, issued + horizon).values)
    assert perfect.frame["forecast"].all() and perfect.meta.issued_at == issued
    naive = make_forecast(actual, issued, horizon, kind="seasonal-naive")
    t = issued + timedelta(hours=27)  # more than a day ahead: two periods back
    assert naive.values[t] == actual.values[t - timedelta(days=2)]
    assert naive.values[issued] == actual.values[issued - timedelta(days=1)]
    noisy = make_forecast(actual, issued, horizon, kind="noisy", relative_error=0.1, seed=3)
    again = make_forecast(actual, issued, horizon, kind="noisy", relative_error=0.1, seed=3)
    other = make_forecast(actual, issued, horizon, kind="noisy", relative_error=0.1, seed=4)
    assert list(noisy.values) == list(again.values) != list(other.values)
    errors = np.asarray(noisy.values) - np.asarray(perfect.values)
    assert 0 < errors.std() < 0.3 * float(actual.values.mean())
    with pytest.raises(SourceSpecError):
        make_forecast(actual, issued, horizon, kind="crystal-ball")
