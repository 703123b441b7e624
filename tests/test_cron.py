"""Cron that keeps time like cron: occurrences across daylight-saving transitions in three
zones (one southern), crontab's field rules, the rule for missed occurrences, and
containment (a template that cannot be used is disabled or paused with its reason, once,
and the other templates go on). Pure tests take ``now`` as an argument (the injected
clock); the admit tests run the daemon's admit step on a real SQLite database."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from orchestrator.errors import SpecError
from orchestrator.queue import cron, crontime
from orchestrator.queue.models import CronTemplate

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HALF_HOUR = timedelta(minutes=30)

# (zone, transition, a fixed-time expression whose time the transition skips or repeats,
#  the instant that fixed time runs on the transition's day)
TRANSITIONS = {
    "Berlin fall back": ("Europe/Berlin", "2026-10-25", "30 2 * * *", "2026-10-25T00:30Z"),
    "Berlin spring forward": ("Europe/Berlin", "2026-03-29", "30 2 * * *", "2026-03-29T01:00Z"),
    "New York fall back": ("America/New_York", "2026-11-01", "30 1 * * *", "2026-11-01T05:30Z"),
    "New York spring forward": (
        "America/New_York", "2026-03-08", "30 2 * * *", "2026-03-08T07:00Z",
    ),
    "Sydney fall back": ("Australia/Sydney", "2026-04-05", "30 2 * * *", "2026-04-04T15:30Z"),
    "Sydney spring forward": (
        "Australia/Sydney", "2026-10-04", "30 2 * * *", "2026-10-03T16:00Z",
    ),
}  # fmt: skip


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _occurrences(sched: crontime.Schedule, start: datetime, end: datetime) -> list[datetime]:
    out, t = [], start
    while (t := sched.next_after(t)) is not None and t <= end:
        out.append(t)
    return out


def _days_around(zone: ZoneInfo, day: str) -> tuple[datetime, datetime]:
    local = datetime.fromisoformat(day).replace(tzinfo=zone)
    return (local - timedelta(days=2)).astimezone(UTC), (local + timedelta(days=3)).astimezone(UTC)


@pytest.mark.parametrize("zone_name,day,fixed,expected", TRANSITIONS.values(), ids=TRANSITIONS)
def test_a_fixed_time_runs_once_a_day_across_the_transition(zone_name, day, fixed, expected):
    zone = ZoneInfo(zone_name)
    sched = crontime.parse(fixed, zone)
    assert sched.fixed
    start, end = _days_around(zone, day)
    runs = _occurrences(sched, start, end)
    local_days = [r.astimezone(zone).date() for r in runs]
    assert local_days == sorted(set(local_days)), f"a day ran twice: {runs}"
    assert len(runs) == 5, runs
    assert _utc(expected) in runs
    assert runs == sorted(set(runs))


@pytest.mark.parametrize("zone_name,day,fixed,expected", TRANSITIONS.values(), ids=TRANSITIONS)
def test_a_wildcard_schedule_runs_as_time_passes(zone_name, day, fixed, expected):
    """``*/30`` fires every 30 minutes of elapsed time: both passes through a repeated
    hour, none in a skipped one; never the same instant twice, never a step back."""
    zone = ZoneInfo(zone_name)
    sched = crontime.parse("*/30 * * * *", zone)
    assert not sched.fixed
    start, end = _days_around(zone, day)
    runs = _occurrences(sched, start, end)
    assert all(b - a == HALF_HOUR for a, b in itertools.pairwise(runs))
    assert len(runs) == (end - start) // HALF_HOUR
    walls = [r.astimezone(zone).replace(tzinfo=None) for r in runs]
    falls_back = start.astimezone(zone).utcoffset() > end.astimezone(zone).utcoffset()
    if falls_back:
        assert len(set(walls)) == len(walls) - 2, "the repeated hour's two times run twice"
    else:
        assert len(set(walls)) == len(walls)
        assert sum(w.hour == 2 and w.date().isoformat() == day for w in walls) == 0


def test_the_cursor_never_repeats_an_occurrence_whatever_the_pass_times():
    """The daemon's cursor: every pass asks for occurrences after the last one dealt
    with; through the Berlin fall-back night, passes every 10 s queue each half hour once."""
    zone = ZoneInfo("Europe/Berlin")
    every_30 = _template("*/30 * * * *", 600, _utc("2026-10-24T22:00Z"))
    daily = _template("30 2 * * *", 3600, _utc("2026-10-24T22:00Z"))
    queued = {1: [], 2: []}
    now = _utc("2026-10-24T22:00Z")
    while now < _utc("2026-10-25T04:00Z"):
        now += timedelta(seconds=10)
        for row in (every_30, daily):
            todo = cron.due(row, now, zone)
            if todo is not None:
                assert todo.skipped == 0 and todo.chosen is not None
                queued[row.id].append(todo.chosen)
                row.last_fire = todo.cursor
    assert len(queued[1]) == 12 and len(set(queued[1])) == 12
    assert queued[2] == [_utc("2026-10-25T00:30Z")]


def test_crontab_fields_as_crontab_reads_them():
    wednesday = datetime(2026, 3, 4, tzinfo=UTC)
    sunday = crontime.parse("0 2 * * 0", UTC).next_after(wednesday)
    assert (
        sunday.strftime("%a") == "Sun"
        and crontime.parse("0 2 * * 7", UTC).next_after(wednesday) == sunday
    )
    weekdays = _occurrences(crontime.parse("0 9 * * 1-5", UTC), wednesday, wednesday + timedelta(7))
    assert [d.strftime("%a") for d in weekdays] == ["Wed", "Thu", "Fri", "Mon", "Tue"]
    # both day fields restricted: either matches (the 14th, or any Friday)
    either = _occurrences(crontime.parse("0 0 14 * 5", UTC), wednesday, wednesday + timedelta(14))
    assert [d.day for d in either] == [6, 13, 14]
    seconds = crontime.parse("*/20 * * * * *", UTC)
    assert _occurrences(seconds, T0, T0 + timedelta(minutes=1)) == [
        T0 + timedelta(seconds=s) for s in (20, 40, 60)
    ]


@pytest.mark.parametrize(
    "bad,message",
    [
        ("* * *", "give 5 fields"),
        ("61 * * * *", "cron expression"),
        ("0 2 * * * * *", "give 5 fields"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 * * 8", "invalid weekday"),
    ],
)
def test_cron_expressions_are_checked(bad, message):
    with pytest.raises(SpecError, match=message):
        crontime.parse(bad, UTC)


def test_leap_day_fires():
    feb29 = crontime.parse("0 0 29 2 *", UTC).next_after(T0)
    assert feb29 == datetime(2028, 2, 29, tzinfo=UTC)


def _template(expr: str, window_s: float, last: datetime | None, **kw) -> CronTemplate:
    spec = {"command": ["true"], "workdir": "/"}
    return CronTemplate(
        id=kw.pop("id", 1 if expr.startswith("*") else 2), cron=expr, window_s=window_s,
        spec=kw.pop("spec", spec), env={}, user="u", uid=1, created_at=T0, last_fire=last, **kw,
    )  # fmt: skip


def test_missed_occurrences_run_once_when_their_window_is_open():
    every_10s = "*/10 * * * * *"
    row = _template(every_10s, 25.0, T0)
    # down for 45 s: occurrences at +10 .. +40; +10 and +20 have closed windows
    todo = cron.due(row, T0 + timedelta(seconds=45), UTC)
    assert todo.chosen == todo.cursor == T0 + timedelta(seconds=40)
    assert todo.skipped == 3 and todo.first == T0 + timedelta(seconds=10)
    assert cron.due(row, T0 + timedelta(seconds=5), UTC) is None
    # all windows closed: nothing queued, every occurrence skipped, the cursor moves on
    todo = cron.due(_template(every_10s, 2.0, T0), T0 + timedelta(seconds=33), UTC)
    assert todo.chosen is None and todo.skipped == 3
    assert todo.cursor == T0 + timedelta(seconds=30)


def test_a_long_downtime_is_bounded_work(caplog):
    """A year of a per-second template: the latest occurrence is found by a search, not
    by walking 31 M occurrences, and the skips are counted to a cap."""
    import time

    row = _template("* * * * * *", 3600.0, T0)
    started = time.perf_counter()
    todo = cron.due(row, T0 + timedelta(days=365, microseconds=500), UTC)
    assert time.perf_counter() - started < 2.0
    assert todo.chosen == todo.cursor == T0 + timedelta(days=365)
    assert todo.skipped_more and todo.skipped == cron.MAX_COUNTED - 1


# -- the daemon's admit step on a real database ------------------------------------------


@pytest.fixture
def db(tmp_path):
    from orchestrator.queue.db import Database

    database = Database(f"sqlite:///{tmp_path / 'q.db'}")
    database.ensure_schema()
    return database


def _store(db, expr: str, window_s: float, workdir, created: datetime, **raw) -> int:
    with db.write() as session:
        row = CronTemplate(
            cron=expr, window_s=window_s, env={}, user="u", uid=1, created_at=created,
            spec={"command": ["true"], "workdir": str(workdir), **raw},
        )  # fmt: skip
        session.add(row)
        session.flush()
        return row.id


def _jobs(db) -> list[tuple[int, datetime]]:
    from sqlmodel import select

    from orchestrator.queue.models import Job

    with db.read() as session:
        return [(j.cron_id, j.submitted_at) for j in session.exec(select(Job)).all()]


def _row(db, template_id: int) -> CronTemplate:
    with db.read() as session:
        return session.get(CronTemplate, template_id)


def test_admit_through_the_berlin_fall_back_night(db, tmp_path, caplog):
    zone = ZoneInfo("Europe/Berlin")
    start = _utc("2026-10-24T22:00Z")
    every_30 = _store(db, "*/30 * * * *", 1800, tmp_path, start)
    daily = _store(db, "30 2 * * *", 8 * 3600, tmp_path, start)
    caplog.set_level(logging.INFO, logger="orchestrator.queue.cron")
    now = start
    while now < _utc("2026-10-25T04:00Z"):  # a pass a minute for six hours
        now += timedelta(minutes=1)
        cron.materialise(db, now, 4, zone)
    jobs = _jobs(db)
    half_hours = sorted(t for c, t in jobs if c == every_30)
    assert len(half_hours) == 12 == len(set(half_hours)), half_hours
    assert [t for c, t in jobs if c == daily] == [_utc("2026-10-25T00:30Z")]
    assert len(caplog.records) == 13, "one line per queued job, nothing else"
    assert _row(db, every_30).last_fire == _utc("2026-10-25T04:00Z")


def test_a_deleted_workdir_pauses_its_template_once_and_others_go_on(db, tmp_path, caplog):
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    gone.mkdir()
    kept.mkdir()
    bad = _store(db, "*/10 * * * * *", 60, gone, T0)
    good = _store(db, "*/10 * * * * *", 60, kept, T0)
    shutil.rmtree(gone)
    caplog.set_level(logging.INFO, logger="orchestrator.queue.cron")
    for s in range(5, 65, 5):
        cron.materialise(db, T0 + timedelta(seconds=s), 4, UTC)
    jobs = _jobs(db)
    assert [c for c, _ in jobs] == [good] * 6 and not any(c == bad for c, _ in jobs)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "paused: working directory" in errors[0], errors
    assert _row(db, bad).fault.startswith("paused: working directory")
    assert _row(db, bad).last_fire == T0 + timedelta(seconds=60), "occurrences skipped"
    gone.mkdir()
    cron.materialise(db, T0 + timedelta(seconds=70), 4, UTC)
    assert _row(db, bad).fault is None and (bad, T0 + timedelta(seconds=70)) in _jobs(db)


@pytest.mark.parametrize(
    "expr,window_s,spec,reason",
    [
        ("0 0 31 2 *", 3600, None, "never fires"),
        ("not cron", 3600, None, "invalid cron expression"),
        ("*/10 * * * * *", 1e13, None, "invalid cron window"),
        ("*/10 * * * * *", float("inf"), None, "invalid cron window"),
        ("*/10 * * * * *", 60, [], "malformed"),
        ("*/10 * * * * *", 60, {"workdir": "/", "command": ["x"], "priority": "x"}, "priority"),
        ("*/10 * * * * *", 60, {"workdir": "/", "command": ["x"], "duration": "9e999h"}, "dur"),
    ],
)
def test_a_bad_stored_template_is_disabled_once_not_a_crash(db, tmp_path, caplog, expr,
                                                            window_s, spec, reason):  # fmt: skip
    bad = _store(db, expr, window_s, tmp_path, T0)
    good = _store(db, "*/10 * * * * *", 60, tmp_path, T0)
    if spec is not None:
        with db.write() as session:
            session.get(CronTemplate, bad).spec = spec
    caplog.set_level(logging.WARNING, logger="orchestrator.queue.cron")
    for s in (15, 25, 35):
        cron.materialise(db, T0 + timedelta(seconds=s), 4, UTC)
    assert [c for c, _ in _jobs(db)] == [good] * 3
    row = _row(db, bad)
    assert row.fault.startswith("disabled: ") and reason in row.fault, row.fault
    assert len(caplog.records) == 1 and reason in caplog.records[0].getMessage()
    assert cron.next_fire(row, T0, UTC) is None


def test_missed_occurrences_are_one_line_per_template(db, tmp_path, caplog):
    """Down for a day: a per-minute template skips 1439 occurrences in one line."""
    every_minute = _store(db, "* * * * *", 600, tmp_path, T0)
    caplog.set_level(logging.INFO, logger="orchestrator.queue.cron")
    for s in (0, 10, 20):
        cron.materialise(db, T0 + timedelta(days=1, seconds=s), 4, UTC)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped at least 999 occurrence(s)" in warnings[0], warnings
    assert _jobs(db) == [(every_minute, T0 + timedelta(days=1))]


@pytest.mark.backends("sqlite")
def test_cron_ls_shows_why_a_template_is_paused(cli, tmp_path):
    from orchestrator.queue.db import Database

    workdir = tmp_path / "nightly"
    workdir.mkdir()
    cli.run("submit", "--cron", "*/10 * * * * *", "--window", "1m", "--workdir", str(workdir),
            "--", "true")  # fmt: skip
    shutil.rmtree(workdir)
    db = Database(cli.db_url)
    cron.materialise(db, datetime.now(UTC) + timedelta(seconds=15), 4)
    out = cli.run("cron", "ls").stdout
    assert f"cron template 1 paused: working directory '{workdir}' does not exist" in out, out
    listed = json.loads(cli.run("cron", "ls", "--json").stdout)
    assert listed[0]["fault"].startswith("paused: working directory")
    assert cli.job_count() == 0


@pytest.mark.backends("sqlite")
def test_cron_ls_shows_the_command_as_ls_does(cli, tmp_path):
    """Quoted as a shell reads it (``shlex.join``, as ``ls``), not joined with spaces."""
    cli.run("submit", "--cron", "0 3 * * *", "--window", "1h", "--workdir", str(tmp_path),
            "--", "echo", "a b", "")  # fmt: skip
    out = cli.run("cron", "ls").stdout
    assert "echo 'a b' ''" in out, out


def test_a_cursor_at_the_end_of_time_disables_its_template_not_the_daemon(db, tmp_path):
    bad = _store(db, "*/10 * * * * *", 60, tmp_path, T0)
    with db.write() as session:
        session.get(CronTemplate, bad).last_fire = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    cron.materialise(db, T0 + timedelta(seconds=15), 4, UTC)
    assert _row(db, bad).fault.startswith("disabled: ")
    assert cron.next_fire(_row(db, bad), T0, UTC) is None


@pytest.mark.backends("sqlite")
def test_a_cron_job_wider_than_any_node_is_refused_as_a_plain_submit(cli, tmp_path):
    """It was stored, and every occurrence then paused it: refused at once instead."""
    cli.home.joinpath("gridshift.toml").write_text('[[nodes]]\nname = "a"\nfake_gpus = 4\n')
    proc = cli.run("submit", "--cron", "0 3 * * *", "--window", "8h", "--gpus", "8",
                   "--", "true", check=False)  # fmt: skip
    assert proc.returncode == 2 and "needs 8 GPUs; the largest node has 4" in proc.stderr
    assert proc.stderr.count("\n") == 1 and json.loads(cli.run("cron", "ls", "--json").stdout) == []
    cli.run("submit", "--cron", "0 3 * * *", "--window", "8h", "--gpus", "2-8", "--", "true")
