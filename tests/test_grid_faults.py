"""Grid I/O that fails, and the daemon that does not fall over because of it: a host that
cannot be reached, a provider that is slow, hangs, refuses the key or answers garbage;
the cache that stays bounded; passes and exits that never wait on a provider; and log
lines a person can read later. Real HTTP: a local provider (``tests.helpers.provider``)."""

from __future__ import annotations

import errno
import json
import logging
import math
import random
import re
import signal
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from grid.cache import CachedChain, SignalCache
from grid.errors import GridDataError, ProviderError, SourceSpecError
from grid.http import HttpApi
from grid.registry import ProviderConfig, build_source
from grid.sources.base import GridSource
from orchestrator.signals.feed import SignalFeed
from tests.conftest import E2E
from tests.grid_fixtures import Router, ok, uk_rows
from tests.helpers.provider import ProviderServer, drip
from tests.helpers.waiting import free_port, wait_for

T0 = datetime(2023, 6, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
NATIONAL = "/intensity/2023-06-01T00:01Z/2023-06-01T02:00Z"
REGIONAL = "/regional/intensity/2023-06-01T00:01Z/2023-06-01T02:00Z/regionid/13"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d (INFO|WARNING|ERROR) ")


@pytest.fixture
def provider():
    server = ProviderServer().start()
    yield server
    server.stop()


def _source(spec: str, base_url: str, client: httpx.Client | None = None, **http):
    client = client or httpx.Client(timeout=5)
    return build_source(spec, {"uk": ProviderConfig(base_url=base_url)}, client, **http)


# -- 1, 2: fail fast, and never longer than max_total_s ---------------------------------------


def test_a_closed_port_fails_in_one_try_at_once():
    sleeps: list[float] = []
    src = _source("uk", f"http://127.0.0.1:{free_port()}", sleep=sleeps.append)
    started = time.monotonic()
    with pytest.raises(ProviderError, match="cannot be reached"):
        src.history(T0, T0 + 2 * HOUR)
    # (the bound is loose for a loaded CI machine: a retry would also have slept)
    assert time.monotonic() - started < 5.0 and sleeps == [], "no retry, no backoff"


def test_a_dns_failure_fails_in_one_try():
    calls, sleeps = [], []

    def no_such_host(request):
        calls.append(request)
        raise httpx.ConnectError("[Errno -2] Name or service not known", request=request)

    client = httpx.Client(transport=httpx.MockTransport(no_such_host))
    src = _source("uk", "https://grid.invalid", client, sleep=sleeps.append)
    with pytest.raises(ProviderError, match=r"cannot be reached .*Name or service not known"):
        src.history(T0, T0 + 2 * HOUR)
    assert len(calls) == 1 and sleeps == []


def test_retries_never_take_longer_than_max_total_s():
    clock = [0.0]

    def slow_503(request):
        clock[0] += 4.0  # each try takes 4 s
        return httpx.Response(503)

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    client = httpx.Client(transport=httpx.MockTransport(slow_503))
    api = HttpApi(client, "https://grid.test", retries=10, backoff_s=1.0, max_total_s=30.0,
                  sleep=sleep, clock=lambda: clock[0])  # fmt: skip
    with pytest.raises(ProviderError, match=r"failed after 4 tries \(HTTP 503, time limit 30 s"):
        api.get("/x")
    assert clock[0] <= 30.0  # 4 + 1 + 4 + 2 + 4 + 4 + 4 = 23; 8 more would pass 30
    clock[0] = 0.0
    late = httpx.MockTransport(lambda r: httpx.Response(429, headers={"Retry-After": "45"}))
    api = HttpApi(httpx.Client(transport=late), "https://grid.test", max_total_s=30.0,
                  sleep=sleep, clock=lambda: clock[0])  # fmt: skip
    with pytest.raises(ProviderError, match="after 1 try"):
        api.get("/x")
    assert clock[0] == 0.0, "a Retry-After beyond the limit is not slept"


def test_a_slow_answer_is_cut_at_max_total_s(provider):
    provider.delay_s = 10.0
    api = HttpApi(httpx.Client(timeout=20), provider.url, max_total_s=1.0)
    started = time.monotonic()
    with pytest.raises(ProviderError, match=r"timed out|did not finish answering within 1 s"):
        api.get(NATIONAL)
    assert time.monotonic() - started < 6.0, "the try's timeout is cut to the time left"


# -- 3: a refused key is that source's failure ------------------------------------------------


def test_a_refused_key_hands_over_to_the_next_source(provider, tmp_path):
    provider.status["/intensity/"] = 401
    client = httpx.Client(timeout=5)
    sources = [_source(spec, provider.url, client) for spec in ("uk", "uk:region=13")]
    chain = CachedChain(sources, SignalCache(tmp_path))
    signal = chain.history(T0, T0 + 2 * HOUR)
    assert signal.meta.source == "uk:region=13" and len(signal.frame) == 4
    assert "refused the credentials (HTTP 401)" in chain.errors[0]
    assert provider.requests == [NATIONAL, REGIONAL], "the refused key: one try"


def test_a_refused_key_with_a_cached_day_is_served_from_the_cache(provider, tmp_path):
    clock = [T0 + HOUR]
    chain = CachedChain([_source("uk", provider.url)], SignalCache(tmp_path),
                        clock=lambda: clock[0])  # fmt: skip
    fresh = chain.forecast(T0 + HOUR, 24 * HOUR)
    assert fresh.meta.stale_s is None
    provider.status["/intensity/"] = 403
    clock[0] += timedelta(minutes=30)
    stale = chain.forecast(clock[0], 24 * HOUR)
    assert stale.meta.stale_s == pytest.approx(1800)
    assert stale.start == clock[0] and stale.end == fresh.end, "as far as the cache reaches"
    assert "refused the credentials (HTTP 403)" in chain.errors[0]


def test_a_failing_source_is_logged_once_and_its_recovery_once(provider, caplog):
    caplog.set_level(logging.INFO, logger="orchestrator.signals.feed")
    provider.status["/intensity/"] = 401
    feed = SignalFeed(CachedChain([_source("uk", provider.url)], None), horizon_s=86400,
                      lookback_s=3600)  # fmt: skip
    for i in range(4):
        assert not feed.refresh(T0 + i * HOUR)
        assert "HTTP 401" in feed.last_error
    failed = [r.getMessage() for r in caplog.records if "source failed" in r.getMessage()]
    assert len(failed) == 1 and "refused the credentials" in failed[0], failed
    del provider.status["/intensity/"]
    for i in range(4, 7):
        assert feed.refresh(T0 + i * HOUR) and feed.last_error is None
    back = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(back) == 1, back


def test_a_refused_key_passed_over_is_logged_once(provider, caplog):
    caplog.set_level(logging.INFO, logger="orchestrator.signals.feed")
    provider.status["/intensity/"] = 401
    client = httpx.Client(timeout=5)
    chain = CachedChain([_source(s, provider.url, client) for s in ("uk", "uk:region=13")], None)
    feed = SignalFeed(chain, horizon_s=86400, lookback_s=3600)
    assert all(feed.refresh(T0 + i * HOUR) for i in range(4)), "the next source answers"
    assert feed.last_error is None
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "HTTP 401" in warned[0] and "using uk:region=13" in warned[0]


# -- 4: the cache stays bounded and reads only what it needs ----------------------------------


def test_the_cache_keeps_one_file_per_source_kind_and_day_and_prunes(provider, tmp_path):
    clock = [T0]
    chain = CachedChain([_source("uk", provider.url)], SignalCache(tmp_path),
                        clock=lambda: clock[0])  # fmt: skip
    for _ in range(18 * 4):  # a refresh every 6 hours for 18 days
        chain.forecast(clock[0], 48 * HOUR)
        chain.history(clock[0] - HOUR, clock[0])
        last = clock[0]
        clock[0] += 6 * HOUR
    files = list(tmp_path.iterdir())
    assert all(p.suffix == ".json" for p in files), "no temporary file left"
    keys = []
    for path in files:
        data = json.loads(path.read_text())
        days = {datetime.fromtimestamp(t, UTC).date() for t in data["index"]}
        assert len(days) == 1, f"{path.name} holds one UTC day"
        keys.append((data["meta"]["source"], data["kind"], days.pop()))
        assert path.stat().st_mtime >= (last - timedelta(days=14)).timestamp(), path.name
    assert len(keys) == len(set(keys)), "one file per source, kind and day"
    oldest = min(day for _, _, day in keys)
    assert oldest >= (last - timedelta(days=14)).date(), "older days pruned"
    assert len(files) <= 2 * (14 + 3)


def test_the_fallback_reads_only_the_files_of_that_source_and_range(
    provider, tmp_path, monkeypatch
):
    cache = SignalCache(tmp_path)
    clock = [T0 + 10 * 24 * HOUR]
    client = httpx.Client(timeout=5)
    national, regional = (_source(s, provider.url, client) for s in ("uk", "uk:region=13"))
    CachedChain([national], cache, clock=lambda: clock[0]).history(T0, T0 + 10 * 24 * HOUR)
    before = set(tmp_path.iterdir())
    CachedChain([regional], cache, clock=lambda: clock[0]).history(T0, T0 + 10 * 24 * HOUR)
    others = set(tmp_path.iterdir()) - before
    assert len(others) == 10
    opened: list[Path] = []
    read_text = Path.read_text

    def spy(self, *args, **kwargs):
        opened.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", spy)
    provider.status["/"] = 503
    chain = CachedChain([national], cache, clock=lambda: clock[0])
    monkeypatch.setattr(national.api, "retries", 0)
    stale = chain.history(T0 + 4 * 24 * HOUR, T0 + 5 * 24 * HOUR + HOUR)  # not all of it final
    assert stale.meta.stale_s == 0 and len(stale.frame) == 50
    assert opened and not set(opened) & others, "none of the other source's files"
    assert len(set(opened)) <= 2, "only the two days of the range"


# -- 5: garbage from a provider is unknown, not a crash ---------------------------------------

GARBAGE = ["abc", math.nan, -5, math.inf, [1], {"x": 1}, True, "1e999", -math.inf, 2e6]


def test_garbage_values_become_unknown(provider):
    def value(t: datetime):
        i = int((t - T0) / timedelta(minutes=30))
        return GARBAGE[i // 2] if i % 2 else 100 + i  # every other row is garbage

    provider.value = value
    signal = _source("uk", provider.url).history(T0, T0 + 10 * HOUR)
    values = list(signal.values)
    assert len(values) == 20
    assert all(math.isnan(v) for v in values[1::2]), values
    assert values[0::2] == [100 + i for i in range(0, 20, 2)]
    assert signal.meta.report.missing == 10


def _moer(value) -> dict:
    return {"data": [{"point_time": (T0 + timedelta(minutes=5 * i)).isoformat(), "value": v}
                     for i, v in enumerate([value, 500.0])],
            "meta": {"units": "lbs_co2_per_mwh"}}  # fmt: skip


def _ec(key, seconds, values) -> dict:
    return {"unix_seconds": seconds, key: values}


SECS = [int((T0 + i * HOUR).timestamp()) for i in range(2)]
A44 = (
    '<Publication_MarketDocument xmlns="urn:x"><TimeSeries><Period><timeInterval>'
    "<start>2023-06-01T00:00Z</start><end>2023-06-01T02:00Z</end></timeInterval>"
    "<resolution>{res}</resolution><Point><position>1</position><price.amount>{price}"
    "</price.amount></Point><Point><position>2</position><price.amount>9</price.amount>"
    "</Point></Period></TimeSeries></Publication_MarketDocument>"
)
# (spec, config, path, answer, outcome): "nan" is a signal whose first value is unknown,
# "fails" a ProviderError; nothing else may come out
ANSWERS = {
    "uk intensity not an object": (
        "uk", {}, "/intensity/",
        ok({"data": [{**uk_rows(0, 1)[0], "intensity": "x"}, uk_rows(0, 2)[1]]}), "nan",
    ),
    "uk row time not a time": (
        "uk", {}, "/intensity/", ok({"data": [{"from": {"a": 1}}, *uk_rows(0, 2)]}), "fails",
    ),
    "uk answer not a list of rows": ("uk", {}, "/intensity/", ok({"data": [7]}), "fails"),
    "electricitymaps time a list": (
        "electricitymaps:DE", {"api_key": "k"}, "/past-range",
        ok({"data": [{"datetime": ["x"], "carbonIntensity": 1}]}), "fails",
    ),
    "watttime value text": (
        "watttime:CAISO_NORTH", {"username": "u", "password": "p"}, "/v3/historical",
        ok(_moer("high")), "nan",
    ),
    "watttime row without a time": (
        "watttime:CAISO_NORTH", {"username": "u", "password": "p"}, "/v3/historical",
        ok({"data": [{"value": 1}], "meta": "x"}), "fails",
    ),
    "energy-charts time text": (
        "energy-charts:DE", {}, "/co2eq", ok(_ec("co2eq", ["x", SECS[1]], [1, 2])), "fails",
    ),
    "energy-charts values an object": (
        "energy-charts:DE", {}, "/co2eq", ok(_ec("co2eq", SECS, {"a": 1})), "nan",
    ),
    "carbon-aware duration a list": (
        "carbon-aware:westus", {}, "/emissions/bylocation",
        ok([{"time": T0.isoformat(), "rating": "x", "duration": [5]},
            {"time": (T0 + HOUR).isoformat(), "rating": 2, "duration": [5]}]), "nan",
    ),
    "entsoe price text": (
        "entsoe:DE-LU", {"api_key": "t", "base_url": "https://e.test/api"}, "/api",
        httpx.Response(200, text=A44.format(res="PT60M", price="n/a")), "nan",
    ),
    "entsoe zero resolution": (
        "entsoe:DE-LU", {"api_key": "t", "base_url": "https://e.test/api"}, "/api",
        httpx.Response(200, text=A44.format(res="PT0M", price="1")), "fails",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", ANSWERS)
def test_garbage_answers_are_unknown_values_or_that_providers_failure(case):
    spec, config, path, answer, outcome = ANSWERS[case]
    router = Router().on("/login", ok({"token": "t"})).on(path, answer)
    providers = {spec.split(":")[0]: ProviderConfig(**config)}
    src = build_source(spec, providers, router.client(), sleep=lambda s: None)
    try:
        signal = src.history(T0, T0 + 2 * HOUR)
    except ProviderError:
        got = "fails"
    else:
        got = "nan" if math.isnan(signal.values.iloc[0]) else "value"
    assert got == outcome


def test_a_forecast_of_nothing_but_garbage_is_a_failed_refresh(provider):
    provider.value = lambda t: "n/a"
    feed = SignalFeed(CachedChain([_source("uk", provider.url)], None), horizon_s=86400,
                      lookback_s=3600)  # fmt: skip
    assert not feed.refresh(T0) and "no known value" in feed.last_error
    assert feed.series() is None


# -- 6, 7: the daemon with a provider that hangs ----------------------------------------------


def _plain_log(text: str) -> None:
    """Every line of the daemon's log off a terminal: ISO time, level, message."""
    lines = [line for line in text.splitlines() if line]
    assert lines, "the daemon logged nothing"
    bad = [line for line in lines if not LOG_LINE.match(line)]
    assert not bad, bad
    assert "maximum number of running instances" not in text
    assert "Traceback" not in text and "JobLookupError" not in text


def _daemon_env(cli, provider, refresh: str) -> None:
    cli.env.update({"GRIDSHIFT_GRID__UK__BASE_URL": provider.url,
                    "GRIDSHIFT_DAEMON__REFRESH": refresh})  # fmt: skip


@E2E
@pytest.mark.backends("sqlite")
def test_a_hanging_provider_delays_no_pass_nor_the_exit(cli, provider, tmp_path):
    provider.delay_s = 10.0  # every request hangs 10 s; a refresh asks two
    _daemon_env(cli, provider, "1s")
    done = tmp_path / "done"
    job = cli.submit("--", "sh", "-c", f"sleep 1; touch {done}")
    daemon = cli.daemon("--grid", "uk", "--policy", "fifo", "--interval", "0.2")
    wait_for(done.exists, timeout_s=40, what="the job to end")
    ended = time.monotonic()
    wait_for(lambda: cli.job_state(job) == "completed", timeout_s=40, what="its end recorded",
             every_s=0.02)  # fmt: skip
    late_s = time.monotonic() - ended
    assert late_s < 5.0, f"the job's end was recorded {late_s:.1f} s late"
    assert provider.requests, "the refresh was asking (and hanging) meanwhile"
    daemon.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert daemon.wait(timeout=30) == 0
    assert time.monotonic() - started < 8.0, "a refresh stuck on the network held the exit up"
    _plain_log(daemon.stderr.read())


@E2E
@pytest.mark.backends("sqlite")
def test_the_daemon_serves_when_its_first_source_refuses_the_key(cli, provider):
    provider.status["/intensity/"] = 401
    _daemon_env(cli, provider, "15m")
    job = cli.submit("--", "true")
    proc = cli.run("daemon", "--grid", "uk", "--grid", "uk:region=13", "--policy", "fifo",
                   "--until-idle", "--interval", "0.1", timeout=60)  # fmt: skip
    assert cli.job_state(job) == "completed"
    warned = [line for line in proc.stderr.splitlines() if "source failed" in line]
    assert len(warned) == 1, proc.stderr
    assert "HTTP 401" in warned[0] and "using uk:region=13" in warned[0]
    _plain_log(proc.stderr)


def _served_by(cli, pid: int) -> bool:
    """Whether the daemon ``pid`` has done a pass (its health row is written after one)."""
    from sqlalchemy.exc import DBAPIError

    try:
        return cli.db_rows("SELECT pid FROM health") == [(pid,)]
    except (LookupError, DBAPIError):
        return False


@E2E
@pytest.mark.backends("sqlite")
def test_sigterm_during_a_pass_exits_0_every_time(cli, provider):
    provider.delay_s = 0.3  # a refresh under way most of the time, too
    _daemon_env(cli, provider, "0.2s")
    codes, logs = [], []
    for _ in range(5):
        daemon = cli.daemon("--grid", "uk", "--policy", "fifo", "--interval", "0.05")
        wait_for(lambda: _served_by(cli, daemon.pid), what="the first pass")  # noqa: B023
        time.sleep(random.uniform(0.1, 0.6))  # passes every 50 ms: mostly one under way
        daemon.send_signal(signal.SIGTERM)
        codes.append(daemon.wait(timeout=20))
        logs.append(daemon.stderr.read())
    assert not [log for log in logs if "JobLookupError" in log or "Traceback" in log], logs
    assert codes == [0] * 5
    for log in logs:
        _plain_log(log)


@E2E
@pytest.mark.backends("sqlite")
def test_a_bug_in_a_pass_still_stops_the_daemon_and_is_raised(cli, provider, monkeypatch, caplog):
    from tests.test_crash_recovery import _daemon

    provider.delay_s = 2.0  # a refresh hanging meanwhile holds up neither passes nor the stop
    _daemon_env(cli, provider, "1s")
    cli.env.update({"GRIDSHIFT_DAEMON__GRID": '["uk"]', "GRIDSHIFT_DAEMON__POLICY": "fifo"})
    daemon = _daemon(cli, monkeypatch)
    passes = []

    def tick(now):
        passes.append(now)
        if len(passes) == 3:
            raise KeyError("a bug")
        return 0.05

    monkeypatch.setattr(daemon, "tick", tick)
    started = time.monotonic()
    with pytest.raises(KeyError, match="a bug"):
        daemon.run()
    assert len(passes) == 3 and time.monotonic() - started < 10.0
    health = json.loads(cli.db_rows("SELECT data FROM health")[0][0])
    assert health["stopped"] is True, "stopped as a daemon stops: caps restored, health said"
    assert not [r for r in caplog.records if r.name.startswith("apscheduler")]


# -- 8: an answer that drips, is huge or nests too deep is that provider's failure ------------


def _within(seconds: float, fn) -> tuple[object, BaseException | None, float]:
    """``fn()``'s result, exception and time taken, which must come within ``seconds``
    (``fn`` runs on a daemon thread: the test of a hang fails then, not when it ends)."""
    out: list = []

    def run() -> None:
        try:
            out.append((fn(), None))
        except BaseException as exc:  # handed to the test
            out.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(seconds)
    assert out, f"still running after {seconds:g} s"
    return *out[0], time.monotonic() - started


def test_a_body_that_drips_is_cut_at_max_total_s(provider):
    provider.body = b'{"data": []}' + b" " * 100  # 22 s at a byte every 0.2 s
    provider.pieces = drip(0.2)  # each byte well within the read timeout
    api = HttpApi(httpx.Client(timeout=2), provider.url, max_total_s=1.5)
    _, error, took_s = _within(8.0, lambda: api.get_json(NATIONAL))
    assert isinstance(error, ProviderError), error
    assert "did not finish answering within 1.5 s" in str(error)
    assert took_s < 5.0  # 1.5 s, and room for a loaded machine


def test_a_refresh_from_a_provider_that_drips_fails_and_the_next_one_runs(provider):
    provider.pieces = drip(0.2)
    feed = SignalFeed(CachedChain([_source("uk", provider.url, max_total_s=1.0)], None),
                      horizon_s=86400, lookback_s=3600)  # fmt: skip
    assert _within(6.0, lambda: feed.refresh(T0))[0] is False
    assert "did not finish answering within 1 s" in feed.last_error
    provider.pieces = None  # the provider recovers: the lock was let go, a refresh works
    assert _within(10.0, lambda: feed.refresh(T0 + HOUR))[0] is True
    assert feed.now_value(T0 + HOUR) == 201.0


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-closed"])
def test_an_answer_over_16_mib_is_refused(provider, length):
    provider.body = b'{"data": []}' + b" " * (40 * 2**20)
    provider.content_length = length
    api = HttpApi(httpx.Client(timeout=5), provider.url)
    tracemalloc.start()
    try:
        _, error, _ = _within(15.0, lambda: api.get_json(NATIONAL))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(error, ProviderError) and "answered more than 16 MiB" in str(error), error
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MiB held"


def test_a_huge_error_answer_is_quoted_from_its_start(provider):
    provider.status["/intensity/"] = 400
    provider.error_body = b"bad request " + b"x " * (5 * 2**20)  # 10 MiB
    api = HttpApi(httpx.Client(timeout=5), provider.url)
    tracemalloc.start()
    try:
        with pytest.raises(ProviderError, match=r"answered HTTP 400: bad request x x") as info:
            api.get(NATIONAL)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(str(info.value)) < 250
    assert peak < 2 * 2**20, f"{peak / 2**20:.1f} MiB held to quote 160 characters"


def test_json_nested_too_deep_is_malformed_json(provider):
    provider.body = b"[" * 100_000
    feed = SignalFeed(CachedChain([_source("uk", provider.url)], None), horizon_s=86400,
                      lookback_s=3600)  # fmt: skip
    assert feed.refresh(T0) is False
    assert "answered malformed JSON" in feed.last_error


def test_a_body_its_content_encoding_does_not_describe_is_that_providers_failure():
    garbled = httpx.Response(200, stream=httpx.ByteStream(b"not gzip at all"),
                             headers={"Content-Encoding": "gzip"})  # fmt: skip
    api = HttpApi(Router().on("/x", garbled).client(), "https://grid.test")
    with pytest.raises(ProviderError, match="undecodable body"):
        api.get_json("/x")


def test_a_base_url_that_is_no_url_is_the_users_to_mend():
    api = HttpApi(httpx.Client(timeout=1), "http://grid\x00.test")
    with pytest.raises(SourceSpecError, match="is not a URL"):
        api.get_json("/x")


def _a44(periods: str) -> httpx.Response:
    document = '<Publication_MarketDocument xmlns="urn:x"><TimeSeries>{}</TimeSeries>'
    return httpx.Response(200, text=document.format(periods) + "</Publication_MarketDocument>")


def _period(start: str, end: str, res: str = "PT60M", inner: str = "") -> str:
    return (f"<Period><timeInterval><start>{start}</start><end>{end}</end></timeInterval>"
            f"<resolution>{res}</resolution><Point><position>1</position>"
            f"<price.amount>42</price.amount></Point>{inner}</Period>")  # fmt: skip


def _entsoe(answer: httpx.Response):
    router = Router().on("/api", answer)
    config = {"entsoe": ProviderConfig(api_key="t", base_url="https://e.test/api")}
    return build_source("entsoe:DE-LU", config, router.client(), sleep=lambda s: None)


ENTITIES = (
    '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(6))
    + "]><l>&g;</l>"
)
XML_ANSWERS = {
    "entities": (ENTITIES, "DOCTYPE or entities refused"),
    "external entity": (
        '<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>', "DOCTYPE"
    ),
    "nested 100,000 deep": ("<a>" * 100_000 + "</a>" * 100_000, "nested more than 32 deep"),
    "periods nested 5,000 deep": (  # each Period's timeInterval found at the bottom
        '<Publication_MarketDocument xmlns="urn:x">' + "<Period>" * 5_000
        + _period("2023-06-01T00:00Z", "2023-06-01T02:00Z") + "</Period>" * 5_000
        + "</Publication_MarketDocument>", "nested more than 32 deep",
    ),
    "70 overlapping periods": (  # 70 × 32 days (the range and a day each side) of 15 min
        _a44(_period("2023-05-25T00:00Z", "2023-07-04T00:00Z", "PT15M") * 70).text,
        "more than 200,000 points",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", XML_ANSWERS)
def test_entsoe_xml_that_expands_nests_or_multiplies_is_refused_at_once(case):
    text, message = XML_ANSWERS[case]
    src = _entsoe(httpx.Response(200, text=text))
    _, error, _ = _within(8.0, lambda: src.history(T0, T0 + 30 * 24 * HOUR))
    assert isinstance(error, ProviderError) and message in str(error), error


def test_entsoe_makes_rows_only_for_the_range_asked_for():
    src = _entsoe(_a44(_period("2023-01-01T00:00Z", "2122-01-01T00:00Z")))  # a century
    signal, error, _ = _within(10.0, lambda: src.history(T0, T0 + 2 * HOUR))
    assert error is None and list(signal.values) == [42.0, 42.0]
    assert signal.meta.report.raw_rows <= 2 * 24 + 2 + 24


# -- 9: the cache only helps: it never throws a fetched signal away nor fails a read ----------


def test_a_cache_that_cannot_be_written_is_logged_once_and_the_signal_used(
    provider, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="grid.cache")
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Path, "write_text", lambda *a, **k: (_ for _ in ()).throw(full))
    chain = CachedChain([_source("uk", provider.url)], SignalCache(tmp_path / "cache"))
    feed = SignalFeed(chain, horizon_s=86400, lookback_s=3600)
    for i in range(3):
        assert feed.refresh(T0 + i * HOUR), feed.last_error
        assert feed.now_value(T0 + i * HOUR) == 200.0 + i
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    chain.cache = SignalCache(tmp_path / "file")  # a file where the folder should be
    assert len(chain.forecast(T0, 24 * HOUR).frame) == 48
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert "No space left on device" in warned[0] and "File exists" in warned[1]


def _garble(path: Path, how: str) -> None:
    data = json.loads(path.read_text())
    if how == "nested":
        path.write_text("[" * 100_000)
    elif how == "resolution":
        data["meta"]["resolution_s"] = "x"
    elif how == "naive time":
        data["fetched_at"] = "2023-06-02T00:00:00"
    if how != "nested":
        path.write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["nested", "resolution", "naive time"])
def test_a_garbled_cache_file_counts_as_not_cached(provider, tmp_path, how):
    clock = [T0 + 24 * HOUR]
    chain = CachedChain([_source("uk", provider.url)], SignalCache(tmp_path),
                        clock=lambda: clock[0])  # fmt: skip
    chain.history(T0, T0 + 2 * HOUR)
    (path,) = tmp_path.iterdir()
    _garble(path, how)
    asked = len(provider.requests)
    assert len(chain.history(T0, T0 + 2 * HOUR).frame) == 4, "asked again, not read"
    assert len(provider.requests) == asked + 1
    assert json.loads(path.read_text())["meta"]["resolution_s"] == 1800, "written anew"
    _garble(path, how)
    provider.status["/"] = 503
    chain.sources[0].api.retries = 0
    with pytest.raises(GridDataError, match="nothing cached covers the range"):
        chain.history(T0, T0 + 2 * HOUR)


def test_a_put_writes_only_the_days_asked_for_and_at_most_60(tmp_path):
    from grid.sources.synthetic import Synthetic

    year = Synthetic("synthetic:days=365", {"days": "365", "start": "2023-01-01"}).load()
    cache = SignalCache(tmp_path)
    start = datetime(2023, 3, 1, 12, tzinfo=UTC)
    cache.put(year, "history", start, start, start + 2 * HOUR)
    assert [p.name[-15:-5] for p in tmp_path.iterdir()] == ["2023-03-01"]
    cache.put(year, "history", start, start, start + 100 * 24 * HOUR)
    days = sorted(p.name[-15:-5] for p in tmp_path.iterdir())
    assert len(days) == 60 and days[0] == "2023-03-01" and days[-1] == "2023-04-29"


# -- 10: one point far away neither wipes the tape nor fills the cache ------------------------

FAR = T0 + timedelta(days=400)


class _FarPoint(GridSource):
    """Hourly values 100 + hour, and one point at ``FAR`` in each forecast, as the Carbon
    Aware SDK adapter passed it on before it clipped its forecasts."""

    name = "far"

    def __init__(self, far: bool = True, step_s: int = 3600) -> None:
        super().__init__("far:test", "XX")
        self.step_s = self.resolution_s = step_s
        self.far = far
        self.asked: list[tuple[datetime, datetime]] = []

    def _rows(self, start: datetime, end: datetime, forecast: bool) -> list:
        n = int((end - start).total_seconds() // self.step_s)
        times = [start + timedelta(seconds=i * self.step_s) for i in range(n)]
        return [(t, 100.0 + t.hour, forecast) for t in times]

    def history(self, start: datetime, end: datetime):
        self.asked.append((start, end))
        return self.signal(self._rows(start, end, False))

    def forecast(self, issued_at: datetime, horizon: timedelta):
        rows = self._rows(issued_at, issued_at + horizon, True)
        rows += [(FAR, 999.0, True)] if self.far else []
        return self.signal(rows, issued_at=issued_at)


def test_a_far_future_point_neither_wipes_the_tape_nor_fills_the_cache(tmp_path):
    chain = CachedChain([_FarPoint()], SignalCache(tmp_path), clock=lambda: T0)
    feed = SignalFeed(chain, horizon_s=48 * 3600, lookback_s=3600)
    assert feed.refresh(T0) and feed.age_s(T0) == 0
    assert feed.covers(T0.timestamp() - 3600, (T0 + 48 * HOUR).timestamp())
    assert feed.now_value(T0 + 5 * HOUR) == 105.0
    assert feed.series().end_s <= (T0 + 73 * HOUR).timestamp(), "nothing from far away"
    assert len(list(tmp_path.iterdir())) <= 4, "the days asked for only"
    assert feed.refresh(T0 + HOUR) and feed.now_value(T0 + HOUR) == 101.0


def test_a_forecast_with_nothing_from_now_on_is_a_failed_refresh():
    source = _FarPoint()
    source.forecast = lambda at, h: source.signal([(FAR, 1.0, True), (FAR + HOUR, 2.0, True)])
    feed = SignalFeed(CachedChain([source], None), horizon_s=48 * 3600, lookback_s=3600)
    assert not feed.refresh(T0) and "no known value in the forecast from now on" in feed.last_error
    assert feed.series().end_s == T0.timestamp(), "the past hour only"
    assert feed.fresh_at is None


def test_the_carbon_aware_forecast_is_clipped_to_the_horizon():
    points = [{"timestamp": (T0 + i * HOUR).isoformat(), "value": 100 + i, "duration": 60}
              for i in range(48)]  # fmt: skip
    points.append({"timestamp": "2060-01-01T00:00:00+00:00", "value": 999, "duration": 60})
    router = Router().on("/emissions/forecasts/current", ok([{"forecastData": points}]))
    src = build_source("carbon-aware:westus", {}, router.client(), sleep=lambda s: None)
    signal = src.forecast(T0, 24 * HOUR)
    assert signal.start == T0 and signal.end == T0 + 24 * HOUR and 999 not in list(signal.values)


def test_a_hole_years_long_asks_only_for_what_the_tape_keeps(provider):
    feed = SignalFeed(CachedChain([_source("uk", provider.url)], None), horizon_s=86400,
                      lookback_s=3600)  # fmt: skip
    assert feed.refresh(T0)
    asked = len(provider.requests)
    carbon = feed.integral((T0 - timedelta(days=300)).timestamp(), T0.timestamp())
    assert len(provider.requests) == asked + 1, "8 days: one request, not 22"
    assert carbon is not None and math.isfinite(carbon)


def test_a_bug_while_fetching_a_hole_is_logged_once_and_the_pass_goes_on(caplog):
    class Buggy(_FarPoint):
        def history(self, start, end):
            if start < T0 - HOUR:  # the hole, not the refresh's lookback
                raise RuntimeError("a bug in an adapter")
            return super().history(start, end)

    caplog.set_level(logging.WARNING, logger="orchestrator.signals.feed")
    feed = SignalFeed(CachedChain([Buggy()], None), horizon_s=86400, lookback_s=3600)
    assert feed.refresh(T0)
    for i in range(3):
        t0 = (T0 - (5 + i) * HOUR).timestamp()
        assert feed.integral(t0, T0.timestamp()) is not None, "the tape as it is"
        assert feed.refresh(T0 + i * HOUR)  # a new tape: another try at the hole
    logged = [r for r in caplog.records if "a bug in an adapter" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None, "once, with its traceback"


# -- 11: an error nobody foresaw is a failed refresh, never the daemon's end -------------------


def test_a_refresh_round_that_raises_anything_is_logged_once_and_the_next_one_runs(caplog):
    from orchestrator.daemon.loop import Every

    caplog.set_level(logging.ERROR, logger="orchestrator.daemon.loop")
    rounds: list[int] = []
    faults = [RuntimeError("bug 1"), RuntimeError("bug 2"), SystemExit(3), None,
              RuntimeError("bug 4"), None]  # fmt: skip

    def round_(first: bool) -> None:
        rounds.append(first)
        fault = faults[len(rounds) - 1] if len(rounds) <= len(faults) else None
        if fault is not None:
            raise fault

    timer = Every("grid refresh", 0.02, round_, fatal=(SourceSpecError,)).start()
    assert timer.wait_first(2.0) is None, "only the user's spec is handed to the caller"
    wait_for(lambda: len(rounds) >= 8, timeout_s=3, what="rounds after the faults")
    timer.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["grid refresh failed"] * 3, messages  # bugs 1 and 2 are alike
    assert [r.exc_info[0] for r in caplog.records] == [RuntimeError, SystemExit, RuntimeError]


def test_a_missing_trace_at_start_is_still_handed_to_the_caller():
    from orchestrator.daemon.loop import Every

    def round_(first: bool) -> None:
        raise SourceSpecError("csv: no such file 'x.csv'")

    timer = Every("grid refresh", 10, round_, fatal=(SourceSpecError,)).start()
    assert isinstance(timer.wait_first(2.0), SourceSpecError)
    timer.stop()


@E2E
@pytest.mark.backends("sqlite")
def test_a_daemon_whose_refresh_raises_anything_serves_and_tries_again(
    cli, provider, tmp_path, monkeypatch, caplog
):
    from tests.test_crash_recovery import _daemon

    caplog.set_level(logging.INFO)
    _daemon_env(cli, provider, "0.2s")
    cli.env.update({"GRIDSHIFT_DAEMON__GRID": '["uk"]', "GRIDSHIFT_DAEMON__POLICY": "fifo"})
    done = tmp_path / "done"
    job = cli.submit("--", "sh", "-c", f"sleep 1; touch {done}")
    daemon = _daemon(cli, monkeypatch)
    daemon.interval_s = 0.1
    feed = daemon.planner.feed
    forecast, calls = feed.chain.forecast, []

    def buggy(*args):
        calls.append(args)
        if len(calls) <= 3:  # the first refresh and two more: the same bug
            raise RecursionError(f"maximum recursion depth exceeded (call {len(calls)})")
        return forecast(*args)

    monkeypatch.setattr(feed.chain, "forecast", buggy)
    started = time.monotonic()
    daemon.run(until_idle=True)
    assert cli.job_state(job) == "completed" and done.exists()
    assert time.monotonic() - started < 15
    assert len(calls) >= 4 and feed.last_error is None, "tried again, and it worked"
    bugs = [r for r in caplog.records if "RecursionError" in r.getMessage()]
    assert len(bugs) == 1 and bugs[0].exc_info is not None, "logged once, with its traceback"


def test_a_bug_fetching_the_past_keeps_the_forecast_in_hand(caplog):
    class Buggy(_FarPoint):
        def history(self, start, end):
            raise RuntimeError("a bug in an adapter")

    caplog.set_level(logging.WARNING, logger="orchestrator.signals.feed")
    feed = SignalFeed(CachedChain([Buggy(far=False)], None), horizon_s=86400, lookback_s=3600)
    for i in range(3):
        assert feed.refresh(T0 + i * HOUR) and feed.last_error is None
        assert feed.now_value(T0 + i * HOUR) == 100.0 + i
    logged = [r for r in caplog.records if "a bug in an adapter" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_a_source_whose_parsing_recurses_too_deep_hands_over_to_the_next(provider):
    class Deep(_FarPoint):
        def forecast(self, issued_at, horizon):
            raise RecursionError("maximum recursion depth exceeded")

    chain = CachedChain([Deep(), _source("uk", provider.url)], None)
    signal = chain.forecast(T0, 24 * HOUR)
    assert signal.meta.source == "uk" and "unusable answer (RecursionError)" in chain.errors[0]


def test_headers_that_drip_are_cut_at_max_total_s(provider):
    provider.pieces, provider.head_in_pieces = drip(0.2), True  # 5 bytes a second, forever
    provider.content_length = False
    api = HttpApi(httpx.Client(timeout=2), provider.url, max_total_s=1.5)
    _, error, took_s = _within(8.0, lambda: api.get_json(NATIONAL))
    assert isinstance(error, ProviderError), error
    assert "did not finish answering within 1.5 s" in str(error)
    assert took_s < 5.0  # 1.5 s, and room for a loaded machine


def test_a_body_that_drips_then_stalls_is_cut_at_max_total_s(provider):
    def drip_then_stall(body: bytes):
        yield from drip(0.2)(body[:6])  # 1.2 s of bytes, then nothing for 10 s
        time.sleep(10)
        yield body[6:]

    provider.pieces = drip_then_stall
    api = HttpApi(httpx.Client(timeout=5), provider.url, max_total_s=1.5)
    _, error, took_s = _within(8.0, lambda: api.get_json(NATIONAL))
    assert isinstance(error, ProviderError) and "did not finish answering" in str(error), error
    assert took_s < 5.0  # 1.5 s, and room for a loaded machine
