"""Issue 22's time slice: one time convention (zones printed, ``--utc``, naive input read
as local), the daemon's log off a terminal (text and JSON lines), a recorded trace
replayed live (``?replay=now``), ``status`` explaining a missing signal, and ``budget``
and ``report`` defaulting to what the daemon runs with."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from grid.errors import SourceSpecError
from grid.registry import build_source
from orchestrator.signals.redact import JsonFormatter, LogHygiene

BERLIN = "Europe/Berlin"  # a zone with DST: CET in winter, CEST in summer
ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00"
TEXT_LINE = re.compile(rf"^{ISO_UTC} (INFO|WARNING|ERROR) [\w.]+ \S")


def _trace(path: Path, days: int = 14) -> Path:
    """Hourly from Monday 2023-01-02 00:00 UTC; each value names its weekday and hour
    (100 x weekday + hour), so an alignment is read off the value."""
    start = datetime(2023, 1, 2, tzinfo=UTC)
    rows = ["time,carbon"]
    for i in range(days * 24):
        t = start + timedelta(hours=i)
        rows.append(f"{t:%Y-%m-%dT%H:%M}Z,{100 * t.weekday() + t.hour}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def _source(spec: str):
    return build_source(spec, {}, httpx.Client())


# -- replay: a trace of 2023 read as a live signal -----------------------------------------


def test_replay_lines_up_weekday_and_hour_with_now_and_loops(tmp_path):
    path = _trace(tmp_path / "t.csv")
    src = _source(f"csv:{path}?replay=now")
    now = datetime.now(UTC)
    ahead = src.forecast(now, timedelta(hours=48))
    assert ahead.start <= now < ahead.end and ahead.frame["forecast"].all()
    for t, value in ahead.values.items():
        assert value == 100 * t.weekday() + t.hour, t
    years_on = datetime(2031, 5, 7, 13, tzinfo=UTC)  # far past the trace: it loops
    later = src.history(years_on, years_on + timedelta(days=9))
    assert len(later.frame) == 9 * 24
    assert all(v == 100 * t.weekday() + t.hour for t, v in later.values.items())
    # without replay the same trace has nothing now
    assert _source(f"csv:{path}").load().end == datetime(2023, 1, 16, tzinfo=UTC)


def test_replay_refuses_a_trace_shorter_than_a_week_and_unknown_modes(tmp_path):
    short = _trace(tmp_path / "short.csv", days=3)
    with pytest.raises(SourceSpecError, match="at least 7 days"):
        _source(f"csv:{short}?replay=now").forecast(datetime.now(UTC), timedelta(hours=4))
    with pytest.raises(SourceSpecError, match="invalid replay"):
        _source(f"csv:{short}?replay=yesterday")
    synthetic = _source("synthetic:days=14&replay=now")
    now = datetime.now(UTC)
    assert synthetic.forecast(now, timedelta(hours=24)).end > now  # a live synthetic signal


def test_json_log_lines_have_stable_keys_redacted_and_escaped():
    record = logging.LogRecord(
        "orchestrator.x", logging.ERROR, __file__, 1, "fetch ?api_key=%s \x1b[2J", ("s3cr3t",),
        None,
    )  # fmt: skip
    try:
        raise RuntimeError("password=s3cr3t")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    assert LogHygiene().filter(record)
    entry = json.loads(JsonFormatter().format(record))
    assert set(entry) == {"time", "level", "logger", "message", "exception"}
    assert re.fullmatch(ISO_UTC, entry["time"]) and entry["level"] == "ERROR"
    assert entry["logger"] == "orchestrator.x"
    assert entry["message"] == "fetch ?api_key=*** \\x1b[2J"
    assert "s3cr3t" not in json.dumps(entry) and "RuntimeError" in entry["exception"]


# -- the daemon on a replayed trace; budget and report from its settings ---------------------


@pytest.mark.backends("sqlite")
def test_a_replayed_trace_drives_the_daemon_and_budget_and_report_follow_it(cli, tmp_path):
    # a folder whose name holds a secret and a control character: the log hides and escapes
    trace = _trace(tmp_path / "de\x1bx" / "api_key=hunter22" / "t.csv")
    cli.env["TZ"] = BERLIN
    cli.submit("--now", "--", "true")
    spec = f"csv:{trace}?replay=now"
    proc = cli.run("daemon", "--until-idle", "--interval", "0.1", "--grid", spec,
                   "--budget", "20kg/day", "--log-format", "json")  # fmt: skip
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line]
    assert lines and all(set(e) >= {"time", "level", "logger", "message"} for e in lines)
    assert all(re.fullmatch(ISO_UTC, e["time"]) for e in lines)
    assert "hunter22" not in proc.stderr and "\x1b" not in proc.stderr
    assert any("de\\x1bx" in e["message"] for e in lines), proc.stderr
    status = cli.run("status").stdout
    assert re.search(r"signal .*: \d+ g/kWh", status) and "None" not in status, status
    assert re.search(r"last pass \d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T\)", status), status
    # no --budget, no --grid, none configured: the stopped daemon's, said to be its
    stopped = cli.run("budget")
    assert stopped.stdout.startswith("20kg/day: "), stopped.stdout
    assert re.search(
        r"the budget the daemon that stopped at \d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? CES?T ran with",
        stopped.stdout,
    ), stopped.stdout
    old = cli.json("report")
    assert old["signal"] == spec and old["signal_from"] == "stopped-daemon", old
    assert old["daemon_stopped_at"].endswith("+00:00"), old
    assert "the signal the daemon that stopped at" in cli.run("report").stdout
    # a running daemon's settings are current: nothing to say about them
    daemon = cli.daemon("--interval", "0.2", "--grid", spec, "--budget", "20kg/day")
    for _ in range(100):
        if cli.json("status")["daemon"] == "running":
            break
        time.sleep(0.2)
    budget = cli.run("budget").stdout
    assert budget.startswith("20kg/day: 0.000 kg spent") and "stopped" not in budget, budget
    report = cli.json("report")
    assert report["total"]["saving_pct"] is not None and report["signal"] == spec, report
    assert report["signal_from"] == "daemon", report
    daemon.terminate()
    daemon.wait(timeout=30)


@pytest.mark.backends("sqlite")
def test_status_says_the_trace_ended_and_the_log_is_one_line_per_record(cli, tmp_path):
    trace = _trace(tmp_path / "t.csv")
    cli.submit("--now", "--", "true")
    log = cli.run("daemon", "--until-idle", "--interval", "0.1", "--grid", f"csv:{trace}").stderr
    assert all(TEXT_LINE.match(line) for line in log.splitlines() if line), log  # a pipe
    assert "orchestrator.signals.feed grid source failed" in log, log
    cli.env["TZ"] = BERLIN
    status = cli.run("status").stdout
    assert "g/kWh" not in status and "None" not in status, status
    flat = " ".join(status.split())
    assert re.search(r"the trace ends at 2023-01-16 01:00 CET \(\d+ days ago\)", flat), flat
    assert "replay=now" in flat
    assert "2023-01-16 00:00 UTC" in " ".join(cli.run("--utc", "status").stdout.split())


# -- the time convention -------------------------------------------------------------------


@pytest.mark.backends("sqlite")
def test_naive_times_are_local_and_every_time_printed_carries_its_zone(cli, tmp_path):
    trace = _trace(tmp_path / "t.csv")
    cli.env["TZ"] = BERLIN
    window = ("--start", "2023-01-02T02:00", "--end", "2023-01-02T04:00")  # 01:00-03:00 UTC
    text = cli.run("grid", "show", "-s", f"csv:{trace}", "--window", "1h", *window).stdout
    assert "2023-01-02 02:00 CET → 2023-01-02 04:00 CET" in text, text  # read as local
    assert "greenest 1h: 2023-01-02 02:00 CET  mean 1.0" in text, text  # 01:00 UTC's value
    cli.env["GRIDSHIFT_UTC"] = "1"
    text = cli.run("grid", "show", "-s", f"csv:{trace}", "--window", "1h", *window).stdout
    assert "2023-01-02 01:00 UTC → 2023-01-02 03:00 UTC" in text and "CET" not in text, text
    del cli.env["GRIDSHIFT_UTC"]
    plan = cli.json("plan", "--grid", f"csv:{trace}", "--at", "2023-01-02T02:00")
    assert plan["now"] == "2023-01-02T01:00:00+00:00"
    cli.run("submit", "--cron", "0 3 * * *", "--window", "8h", "--", "true")
    crons = cli.run("cron", "ls").stdout
    assert "cron expressions read in Europe/Berlin" in crons, crons
    assert re.search(r"\d{4}-\d\d-\d\d 03:00 CES?T", crons), crons


def test_a_scenarios_naive_grid_range_is_in_its_timezone():
    from orchestrator.sim.inputs import _utc
    from orchestrator.sim.scenario import Scenario

    berlin = Scenario(timezone=BERLIN)
    naive = datetime(2023, 7, 1, 12, 0)
    assert _utc(naive, berlin) == datetime(2023, 7, 1, 10, 0, tzinfo=UTC)  # CEST
    assert _utc(naive, Scenario()) == datetime(2023, 7, 1, 12, 0, tzinfo=UTC)  # UTC default
    aware = datetime(2023, 7, 1, 12, 0, tzinfo=UTC)
    assert _utc(aware, berlin) == aware


def test_a_failing_source_is_dated_and_status_says_since_when(monkeypatch):
    from grid.errors import GridDataError
    from orchestrator.cli.accounts import signal_lines
    from orchestrator.signals.feed import SignalFeed

    class Down:
        spec, sources, errors = "uk", [], []

        def forecast(self, issued_at, horizon):
            raise GridDataError("uk: cannot be reached")

    monkeypatch.setenv("TZ", "UTC")
    feed = SignalFeed(Down(), horizon_s=86400, lookback_s=3600)
    first = datetime(2026, 11, 24, 6, 40, tzinfo=UTC)
    assert not feed.refresh(first) and feed.failing_since == first
    assert not feed.refresh(first + timedelta(minutes=5)) and feed.failing_since == first
    sig = {"source": "uk", "age_s": None, "g_per_kwh": None, "error": feed.last_error,
           "failing_since": first.isoformat(), "trace_end": None}  # fmt: skip
    monkeypatch.setenv("GRIDSHIFT_UTC", "1")
    lines = signal_lines(sig, first + timedelta(hours=1))
    assert "has been failing since 2026-11-24 06:40 UTC" in lines[0], lines
    assert "cannot be reached" in lines[1] and "None" not in " ".join(lines)
    fresh = signal_lines({**sig, "error": None, "failing_since": None}, first)
    assert fresh == ["uk: no signal yet (no fetch has answered yet)"]
    feed.recovered([], "uk")
    assert feed.failing_since is None and feed.last_error is None
