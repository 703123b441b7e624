"""The review of the time convention, the daemon's recorded settings and the thin client:
a stopped daemon's settings are history, the client names the home the settings do, one
source of the local zone (a bad TZ refused, DST gaps read as zoneinfo reads them), log
lines that a traceback cannot forge."""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.signals.redact import LineFormatter, LogHygiene

FORGED = "2026-11-24T00:00:00.000+00:00 INFO orchestrator.daemon.loop job 7 of root cancelled"


# -- 1. a stopped daemon's recorded settings and snapshot ---------------------------------


@pytest.mark.backends("sqlite")
def test_a_stopped_daemons_settings_give_way_to_the_config_and_its_signal_ages(cli):
    cli.env["GRIDSHIFT_UTC"] = "1"
    cli.submit("--now", "--", "true")
    cli.run("daemon", "--until-idle", "--interval", "0.1", "--budget", "20kg/day",
            "--grid", "synthetic:replay=now")  # fmt: skip
    (cli.home / "gridshift.toml").write_text(
        '[daemon]\nbudget = "5kg/week"\ngrid = ["synthetic:mean=100&replay=now"]\n'
    )
    assert cli.run("budget").stdout.startswith("5kg/week:"), "the config's, not the daemon's"
    assert cli.json("report")["signal"] == "synthetic:mean=100&replay=now"
    # 12 minutes later: the snapshot is dated, its signal aged
    with sqlite3.connect(cli.home / "gridshift.db") as db:
        (tick,) = db.execute("SELECT last_tick FROM health WHERE id = 1").fetchone()
        earlier = datetime.fromisoformat(tick) - timedelta(minutes=12)
        db.execute("UPDATE health SET last_tick = ? WHERE id = 1", (earlier.isoformat(" "),))
    data = cli.json("status")
    assert data["daemon"] == "stopped" and data["signal"]["age_s"] >= 12 * 60, data
    text = " ".join(cli.run("status").stdout.split())
    assert re.search(r"\((1[2-9]|[2-9]\d)\.\d min old\)", text), text
    assert "the figures below are as of its last pass" in text, text
    assert "this period" not in text, text


def test_status_shows_a_fallback_reasons_time_as_every_time_is(monkeypatch):
    from orchestrator.cli.accounts import dated

    monkeypatch.setenv("TZ", "Europe/Berlin")
    monkeypatch.delenv("GRIDSHIFT_UTC", raising=False)
    reason = "no grid signal yet: csv:t.csv: the trace ends at 2025-06-16T00:00:00+00:00, 3 d"
    assert dated(reason) == (
        "no grid signal yet: csv:t.csv: the trace ends at 2025-06-16 02:00 CEST, 3 d"
    )


# -- 2. the thin client names the home the settings do ------------------------------------


ENV_CASES = [
    {},
    {"GRIDSHIFT_HOME": "{tmp}/a"},
    {"gridshift_home": "{tmp}/b"},
    {"Gridshift_Home": "{tmp}/c", "GRIDSHIFT_SOCKET": "{tmp}/s.sock"},
    {"gridshift_socket": "{tmp}/t.sock"},
    {"GRIDSHIFT_HOME": ""},
    {"GRIDSHIFT_HOME": "  "},
    {"gridshift_home": ""},
    {"GRIDSHIFT_SOCKET": ""},
]


@pytest.mark.parametrize("case", range(len(ENV_CASES)))
def test_the_client_and_the_settings_name_the_same_home_and_socket(case, tmp_path, monkeypatch):
    from orchestrator.api.client import locate
    from orchestrator.errors import ConfigError
    from orchestrator.settings import load_settings

    for key in [k for k in __import__("os").environ if k.upper().startswith("GRIDSHIFT_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key, value in ENV_CASES[case].items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    try:
        settings = load_settings()
    except ConfigError as exc:
        assert "\n" not in str(exc) and "empty" in str(exc), exc
        assert locate(None) is None  # the full loader speaks
        return
    address = locate(None)
    assert address is not None and address.socket == str(settings.socket_path), case


def test_an_empty_home_is_refused_and_nothing_lands_in_the_working_directory(cli, tmp_path):
    cli.env["GRIDSHIFT_HOME"] = ""
    work = tmp_path / "work"
    work.mkdir()
    proc = cli.run("ls", check=False, cwd=work)
    assert proc.returncode == 2 and "GRIDSHIFT_HOME is set but empty" in proc.stderr, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(work.iterdir())


def test_no_fast_reads_its_value_as_gridshift_utc_is_read(monkeypatch, capsys):
    from orchestrator.cli import app
    from orchestrator.cli.fast import run

    tried = []
    monkeypatch.setattr(run, "plan", lambda typer_app, args: tried.append(args))
    for value, off in (("1", True), ("yes", True), ("On", True), ("0", False), ("", False)):
        monkeypatch.setenv("GRIDSHIFT_NO_FAST", value)
        tried.clear()
        with contextlib.suppress(SystemExit):
            app.main(["--version"])
        assert bool(tried) is not off, value


# -- 3, 4. one source of the local zone ----------------------------------------------------


def test_a_mistyped_tz_is_refused_for_input_and_output(monkeypatch):
    from orchestrator.errors import SpecError
    from orchestrator.timeparse import format_time, parse_time

    monkeypatch.setenv("TZ", "Europe/Berln")
    monkeypatch.delenv("GRIDSHIFT_UTC", raising=False)
    for call in (lambda: parse_time("2026-12-01T08:00"),
                 lambda: format_time(datetime(2026, 12, 1, tzinfo=UTC))):  # fmt: skip
        with pytest.raises(SpecError, match="unknown local time zone 'Europe/Berln'"):
            call()


def test_a_mistyped_tz_is_one_line_and_exit_2(cli):
    cli.env["TZ"] = "Europe/Berln"
    proc = cli.run("plan", "--grid", "synthetic", "--at", "2026-12-01T08:00", check=False)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().count("\n") == 0 and "Europe/Berln" in proc.stderr, proc.stderr
    # the daemon refuses to start, rather than failing every pass (it looped on the error)
    proc = cli.run("daemon", "--until-idle", check=False, timeout=60)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().count("\n") == 0 and "Europe/Berln" in proc.stderr, proc.stderr


def test_times_in_a_dst_gap_or_overlap_are_read_as_zoneinfo_reads_them(monkeypatch):
    from orchestrator.timeparse import format_time, parse_deadline, parse_time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    monkeypatch.delenv("GRIDSHIFT_UTC", raising=False)
    gap = parse_time("2026-03-29T02:30")  # the clock jumps 02:00 -> 03:00
    assert gap == datetime(2026, 3, 29, 1, 30, tzinfo=UTC) and format_time(gap).endswith("CEST")
    assert format_time(gap) == "2026-03-29 03:30 CEST"
    twice = parse_time("2026-10-25T02:30")  # 02:00-03:00 happens twice: the first
    assert twice == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_deadline("2026-03-29T02:30", now) == gap


# -- 5. log lines a traceback cannot forge -------------------------------------------------


def _evil_record() -> logging.LogRecord:
    record = logging.LogRecord("orchestrator.x", logging.ERROR, __file__, 1, "pass failed", (),
                               None)  # fmt: skip
    try:
        raise ValueError("evil\n" + FORGED)
    except ValueError:
        record.exc_info = sys.exc_info()
    assert LogHygiene().filter(record)
    return record


def test_a_text_log_is_one_line_per_record_traceback_included():
    line = LineFormatter().format(_evil_record())
    assert "\n" not in line and "ValueError: evil\\n" + FORGED in line, line
    assert line.startswith(datetime.now(UTC).strftime("%Y-%m-%d"))


def test_on_a_terminal_a_traceback_never_starts_a_line_of_its_own():
    from orchestrator.signals.redact import TerminalFormatter

    lines = TerminalFormatter().format(_evil_record()).split("\n")
    assert lines[0] == "pass failed" and len(lines) > 2
    assert all(line.startswith("    ") for line in lines[1:]), lines


def test_readme_documents_the_gap_and_the_overlap():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    times = text[text.index("**Times.**") :][:2000]
    assert "the clock skips" in times and "first occurrence" in times and "fold=0" in times
