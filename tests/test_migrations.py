"""Upgrades lose nothing: databases made by earlier gridshifts (their DDL frozen in
tests/fixtures), filled with jobs, attempts, events, usage and cron templates, upgrade
with ``gridshift db upgrade`` and every row intact, on SQLite and PostgreSQL; the models
and the migrations agree; a database older or newer than the code is one line, exit 2."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, insert, inspect, select, text
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel

from orchestrator.queue import schema
from orchestrator.queue.db import Database
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
T0 = datetime(2025, 3, 1, 8, 0, 0)  # naive UTC, as gridshift stores times
# columns added to a primary key cannot be NULL: the value an old row gets instead
KEYED_EMPTY = {"calibration": {"gpu_model": "", "uid": -1}}  # -1: no owner, used by none


def _engine(url: str):
    return create_engine(url, poolclass=NullPool)


def _create_from_fixture(url: str, name: str) -> None:
    """The tables exactly as an earlier gridshift's ensure_schema made them."""
    backend = "sqlite" if url.startswith("sqlite") else "postgresql"
    ddl = (FIXTURES / f"schema-{name}.{backend}.sql").read_text()
    body = "\n".join(ln for ln in ddl.splitlines() if not ln.startswith("--"))
    engine = _engine(url)
    with engine.begin() as conn:
        for statement in filter(None, (s.strip() for s in body.split(";"))):
            conn.execute(text(statement))
    engine.dispose()


def _fill(url: str) -> None:
    """Jobs in every final and live state, their attempts, events, attempt events, usage
    per day, a dependency, cron templates, nodes, GPUs, a calibration, the health row and
    a lease: whatever of these tables the old schema has, only its columns."""
    engine = _engine(url)
    meta = MetaData()
    meta.reflect(engine)
    tables = meta.tables

    def row(table: str, **values):
        cols = set(tables[table].columns.keys())
        return {k: v for k, v in values.items() if k in cols}

    states = ["completed", "failed", "cancelled", "queued", "running", "lost"]
    with engine.begin() as conn:
        for n in range(1, 13):
            at = T0 + timedelta(hours=n)
            conn.execute(insert(tables["job"]), row(
                "job", id=n, name=f"train-{n}", state=states[n % len(states)],
                reason="exit code 1" if n % 6 == 1 else None, user="alice" if n % 2 else "bob",
                uid=1000 + n % 2, command=["python", "train.py", f"--seed={n}", "ünïcode ✓"],
                workdir=f"/work/{n}", env={"PATH": "/usr/bin", "SEED": str(n)}, gpus_min=1,
                gpus_max=2 + n % 3, duration_s=3600.5 * n, deadline=at + timedelta(days=1),
                interruptible=bool(n % 2), priority=n % 4 - 1, labels=["exp", f"n{n}"],
                submitted_at=at, started_at=at + timedelta(minutes=5),
                finished_at=at + timedelta(hours=1) if n % 6 in (1, 2, 3) else None,
                exit_code=n % 2, node="local", gpu_ids=[0, n % 4], energy_j=1.25e6 * n,
                carbon_g=12.5 * n, cost=0.3 * n, energy_modelled=n % 3 == 0,
                cancel_requested_at=None, attempts=2, planned_start=at, plan_note="low carbon",
                cron_id=1 if n % 5 == 0 else None,
            ))  # fmt: skip
            conn.execute(insert(tables["event"]), [
                row("event", job_id=n, at=at + timedelta(seconds=k), from_state=a, to_state=b,
                    reason=f"step {k}", actor="daemon")
                for k, (a, b) in enumerate([(None, "queued"), ("queued", "planned"),
                                            ("planned", "running")])
            ])  # fmt: skip
            for number in (1, 2):
                attempt_id = 100 * n + number
                conn.execute(insert(tables["attempt"]), row(
                    "attempt", id=attempt_id, job_id=n, number=number,
                    state="exited" if number == 1 else "running", node="local",
                    gpu_ids=[0, 1], run_dir=f"/home/q/run/attempt-{attempt_id}",
                    handle={"attempt_id": attempt_id, "data": {"monitor": {"pid": 42}}},
                    run_as_uid=1000, started_at=at, finished_at=at + timedelta(minutes=30),
                    exit_code=0, signal=None, energy_j=5e5 + number, progress_done=10.0 * number,
                    progress_total=100.0, progress_at=at, detail="ok", cap=0.7,
                    planned_until=at + timedelta(hours=2), carbon_g=3.25, cost=0.12,
                    energy_modelled=False, accounted_until=at + timedelta(minutes=30),
                ))  # fmt: skip
                if "attemptevent" in tables:
                    conn.execute(insert(tables["attemptevent"]), row(
                        "attemptevent", attempt_id=attempt_id, job_id=n, at=at,
                        from_state="launching", to_state="running", reason="started",
                    ))  # fmt: skip
                conn.execute(insert(tables["usage"]), [
                    row("usage", attempt_id=attempt_id, day=datetime(2025, 3, d), job_id=n,
                        energy_j=1e5 * d, carbon_g=1.5 * d, cost=None if d == 2 else 0.01 * d)
                    for d in (1, 2)
                ])  # fmt: skip
        conn.execute(insert(tables["dependency"]), [{"job_id": 4, "after_id": 1}])
        conn.execute(insert(tables["crontemplate"]), [
            row("crontemplate", id=k, cron=f"{k} 2 * * *", window_s=3600.0 * k,
                spec={"command": ["true"], "gpus": k}, env={"HOME": "/root"},
                user="alice", uid=1001, created_at=T0, last_fire=T0 if k == 1 else None,
                removed_at=T0 if k == 3 else None)
            for k in (1, 2, 3)
        ])  # fmt: skip
        conn.execute(insert(tables["node"]), row(
            "node", name="local", executor="local", gpus=4, gpu_model="A100",
            gpu_source="fake", updated_at=T0, reachable=True, last_seen=T0,
        ))  # fmt: skip
        conn.execute(insert(tables["gpu"]), [
            row("gpu", node="local", index=i, uuid=f"GPU-{i}", model="A100",
                memory_mb=40960, power_limit_w=400.0)
            for i in range(4)
        ])  # fmt: skip
        conn.execute(insert(tables["calibration"]), row(
            "calibration", name="train-1", gpus=2, throughput_per_s=12.5,
            power_w_per_gpu=310.0, samples=3, updated_at=T0, gpu_model="A100", uid=1001,
        ))  # fmt: skip
        conn.execute(insert(tables["health"]), row(
            "health", id=1, pid=4242, started_at=T0, last_tick=T0, data={"passes": 7}
        ))  # fmt: skip
        if "lease" in tables:
            conn.execute(insert(tables["lease"]), row(
                "lease", name="daemon", holder={"host": "h", "pid": 1}, epoch=3,
                acquired_at=T0, expires_at=T0,
            ))  # fmt: skip
        if engine.dialect.name == "postgresql":  # ids given: move the sequences past them
            for table in ("job", "attempt", "event", "attemptevent", "crontemplate"):
                if table in tables:
                    conn.execute(text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    ))  # fmt: skip
    engine.dispose()


def _dump(url: str) -> dict[str, list[dict]]:
    """Every row of every table, in primary-key order (the version table aside)."""
    engine = _engine(url)
    meta = MetaData()
    meta.reflect(engine)
    out = {}
    with engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            if name == schema.VERSION_TABLE:
                continue
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
            out[name] = [_plain(dict(r)) for r in rows]
    engine.dispose()
    return out


def _columns(url: str) -> dict[str, set[str]]:
    engine = _engine(url)
    with engine.connect() as conn:
        found = inspect(conn)
        names = set(found.get_table_names()) - {schema.VERSION_TABLE}
        out = {t: {c["name"] for c in found.get_columns(t)} for t in names}
    engine.dispose()
    return out


def _autoincrement(url: str) -> set[str]:
    """The SQLite tables whose ids are never reused (AUTOINCREMENT)."""
    engine = _engine(url)
    with engine.connect() as conn:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%AUTOINCREMENT%'"
        names = set(conn.execute(text(sql)).scalars())
    engine.dispose()
    return names


def _db_status(cli) -> dict:
    return json.loads(cli.run("db", "status", "--json").stdout)


def _plain(row: dict) -> dict:
    """JSON columns as their values, whichever way the driver hands them back."""
    out = {}
    for k, v in row.items():
        if isinstance(v, str) and v[:1] in "[{":
            with contextlib.suppress(ValueError):
                v = json.loads(v)
        out[k] = v
    return out


@pytest.mark.parametrize("made_by", ["pre20", "d6c7ef1"])
def test_a_filled_old_database_upgrades_with_every_row_intact(cli, made_by):
    _create_from_fixture(cli.db_url, made_by)
    _fill(cli.db_url)
    before = _dump(cli.db_url)
    assert len(before["job"]) == 12 and len(before["usage"]) == 48

    # older than the code: every command that opens it says so in one line, exit 2
    for args in (["ls"], ["submit", "--", "true"], ["daemon", "--until-idle"], ["show", "1"]):
        proc = cli.run(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "gridshift db upgrade" in proc.stderr, proc.stderr
    assert _dump(cli.db_url) == before  # nothing written
    assert _db_status(cli) | {"database": None} == {
        "current": None, "head": schema.head(), "state": "legacy", "up_to_date": False,
        "database": None,
    }  # fmt: skip

    out = cli.run("db", "upgrade").stdout
    assert f"to {schema.head()}" in out
    after = _dump(cli.db_url)
    for table, rows in before.items():
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table], strict=True):
            assert {k: new[k] for k in old} == old, table  # every value, unchanged
            added = {k: new[k] for k in set(new) - set(old)}
            assert all(v is None for v in added.values()) or added == KEYED_EMPTY.get(table), (
                table
            )  # added: empty (a column added to a key: its stated "unknown")
    assert set(after) >= set(before) | {"lease", "attemptevent"}
    assert _columns(cli.db_url) == {
        t.name: {c.name for c in t.columns} for t in SQLModel.metadata.sorted_tables
    }  # every column the code reads, the ones old gridshifts never added too
    assert _db_status(cli)["up_to_date"] is True
    if cli.backend == "sqlite":
        (backup,) = cli.home.glob("gridshift.db.backup-*")
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600
        assert _dump(f"sqlite:///{backup}") == before  # the database as it was
    # and it is used as before: the jobs are there, new ones are taken
    shown = cli.json("show", "1")
    assert shown["name"] == "train-1" and shown["command"][-1] == "ünïcode ✓"
    assert len(shown["runs"]) == 2 and len(shown["events"]) == 3
    assert cli.submit("--", "true") == 13
    assert "already" in cli.run("db", "upgrade").stdout


def test_the_migrations_build_what_the_models_say(cli):
    """From empty, the migrations alone make the schema the models describe (so a database
    created at head directly and one upgraded are the same); so do the old schemas
    upgraded. Alembic's autogenerate compares tables, columns, types, indexes and keys."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    db = Database(cli.db_url)
    db.upgrade_schema()  # every migration, from nothing
    assert db.schema_status().up_to_date
    with db._reader.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []
    db.dispose()
    if cli.backend == "sqlite":  # which autogenerate does not compare
        assert _autoincrement(cli.db_url) == {"job", "attempt"}


@pytest.mark.parametrize("made_by", ["pre20", "d6c7ef1"])
@pytest.mark.backends("sqlite")
def test_an_old_schema_upgraded_is_what_the_models_say(tmp_path, made_by):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    url = f"sqlite:///{tmp_path / 'old.db'}"
    _create_from_fixture(url, made_by)
    db = Database(url)
    db.upgrade_schema()
    with db._reader.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []


def test_the_revisions_are_one_line_and_the_files_name_them():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(schema.MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    scripts = ScriptDirectory.from_config(cfg)
    assert scripts.get_heads() == [schema.head()]
    line = [s.revision for s in scripts.walk_revisions()][::-1]
    assert line == schema.revisions()
    for path in (schema.MIGRATIONS / "versions").glob("*.py"):
        assert path.name.startswith(scripts.get_revision(path.name[:4]).revision + "_")


@pytest.mark.backends("sqlite")
def test_a_database_newer_than_the_code_is_refused_with_one_line(cli):
    cli.run("ls")  # created at head
    engine = _engine(cli.db_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {schema.VERSION_TABLE} SET version_num = 'f00d'"))
    engine.dispose()
    for args in (["ls"], ["submit", "--", "true"], ["daemon", "--until-idle"], ["db", "upgrade"]):
        proc = cli.run(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "newer than this gridshift" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert _db_status(cli)["state"] == "newer"
    assert cli.job_count() == 0


def test_a_new_database_is_created_at_head(cli):
    cli.run("ls")
    engine = _engine(cli.db_url)
    with engine.connect() as conn:
        assert inspect(conn).has_table("job")
        version = conn.execute(text(f"SELECT version_num FROM {schema.VERSION_TABLE}"))
        assert version.scalars().all() == [schema.head()]
    engine.dispose()
    if cli.backend == "sqlite":  # ids the usage ledger, logs and run directories outlive
        assert _autoincrement(cli.db_url) == {"job", "attempt"}


@pytest.mark.backends("sqlite")  # PostgreSQL's sequences never went back: 0006 does nothing
def test_a_0005_database_whose_newest_job_was_cleaned_never_gives_its_ids_again(cli):
    from alembic import command

    db = Database(cli.db_url)
    with db._writer.begin() as conn:
        command.upgrade(schema._config(conn), "0005")
    db.dispose()
    _fill(cli.db_url)  # jobs 1-12, their attempts 101-1202 and usage
    engine = _engine(cli.db_url)
    with engine.begin() as conn:  # job 12 cleaned before the upgrade: its usage kept
        for table in ("attemptevent", "attempt", "event"):
            conn.execute(text(f"DELETE FROM {table} WHERE job_id = 12"))
        conn.execute(text("DELETE FROM job WHERE id = 12"))
    engine.dispose()
    before = _dump(cli.db_url)
    assert max(r["job_id"] for r in before["usage"]) == 12 > max(r["id"] for r in before["job"])

    proc = cli.run("ls", check=False)
    assert proc.returncode == 2 and "revision 0005" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "gridshift db upgrade" in proc.stderr
    assert _db_status(cli)["state"] == "older"
    cli.run("db", "upgrade")
    assert _db_status(cli)["current"] == schema.head()
    after = _dump(cli.db_url)  # every row as it was (columns later revisions add: empty)
    assert {t: [{k: r[k] for k in old} for r, old in zip(after[t], rows, strict=True)]
            for t, rows in before.items()} == before  # fmt: skip
    assert _autoincrement(cli.db_url) == {"job", "attempt"}
    assert cli.submit("--", "true") == 13  # above every id the ledger names
    seq = dict(cli.db_rows("SELECT name, seq FROM sqlite_sequence"))
    assert seq == {"job": 13, "attempt": 1202}


@pytest.mark.backends("sqlite")
def test_the_backup_is_consistent_while_the_wal_holds_writes(tmp_path):
    """Rows still in the -wal file (not checkpointed) are in the backup too."""
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    conn.commit()
    assert Path(f"{path}-wal").stat().st_size > 0
    backup = schema.backup_sqlite(path)
    again = schema.backup_sqlite(path)  # same second: a new name, never over the first
    assert backup != again
    copy = sqlite3.connect(backup)
    assert copy.execute("SELECT count(*) FROM t").fetchone() == (1000,)
    copy.close()
    conn.close()


def test_a_schema_another_process_commits_meanwhile_is_not_read_as_legacy(tmp_path, monkeypatch):
    """CI saw one of 8 first commands on a fresh PostgreSQL database refused as "made by a
    gridshift before schema versions": it asked whether the version table existed, then
    which tables did, and another process committed the whole schema in between. The
    status is now read from one listing of the tables."""
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()  # the other process's commit

    class Between:  # the version table not there yet when asked, every table when listed
        def __init__(self, conn):
            self.real = inspect(conn)

        def has_table(self, name):
            return False

        def get_table_names(self):
            return self.real.get_table_names()

    monkeypatch.setattr(schema, "inspect", Between)
    with create_engine(f"sqlite:///{tmp_path / 'q.db'}", poolclass=NullPool).connect() as conn:
        assert schema.read_status(conn).state == "up to date"


def test_0013_keeps_the_idle_ledgers_day_rows_under_their_midnight(cli):
    """0013 makes ``idle_usage`` per hour (``day`` becomes ``hour``): the rows written per
    day before keep their energy and carbon (unknown carbon too) under the day's 00:00,
    where each holds its whole day; ``report --since`` counts one when it reaches back
    to that midnight, and the key still refuses a second row for one node and hour."""
    from alembic import command
    from sqlalchemy.exc import IntegrityError

    db = Database(cli.db_url)
    with db._writer.begin() as conn:
        command.upgrade(schema._config(conn), "0012")
    db.dispose()
    days = [(datetime(2026, 6, 9), "a", 3.6e6 * 2, 150.0),
            (datetime(2026, 6, 10), "a", 3.6e6 * 5, None),
            (datetime(2026, 6, 10), "b", 3.6e6 * 0.5, 20.5)]  # fmt: skip
    written = [{"day": d, "node": n, "energy_j": e, "carbon_g": c} for d, n, e, c in days]
    _insert(cli.db_url, "idle_usage", written)

    cli.run("db", "upgrade")
    assert _db_status(cli)["current"] == schema.head()
    rows = cli.db_rows("SELECT hour, node, energy_j, carbon_g FROM idle_usage ORDER BY hour, node")
    assert [(_naive(h), n, e, c) for h, n, e, c in rows] == days
    assert "day" not in _columns(cli.db_url)["idle_usage"]
    report = cli.json("report", "--since", "2026-06-10T00:00Z")["idle"]
    assert report["energy_kwh"] == 5.5 and report["carbon_kg"] is None
    assert report["by_node"]["b"] == {"energy_kwh": 0.5, "carbon_kg": 0.0205}
    assert cli.json("report", "--since", "2026-06-10T10:00Z")["idle"]["energy_kwh"] == 0
    with pytest.raises(IntegrityError):
        again = {"node": "a", "hour": datetime(2026, 6, 10), "energy_j": 1, "carbon_g": 1}
        _insert(cli.db_url, "idle_usage", [again])


def _insert(url: str, table: str, rows: list[dict]) -> None:
    """Rows written as gridshift writes them: through the columns' types (SQLite stores a
    DateTime as SQLAlchemy's text, which the queries compare)."""
    engine = _engine(url)
    meta = MetaData()
    meta.reflect(engine, only=[table])
    try:
        with engine.begin() as conn:
            conn.execute(insert(meta.tables[table]), rows)
    finally:
        engine.dispose()


def _naive(value) -> datetime:
    """A stored time as the naive UTC datetime gridshift writes (SQLite hands back text)."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value.replace(tzinfo=None)
