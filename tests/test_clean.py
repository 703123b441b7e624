"""Retention: ``gridshift clean`` removes finished jobs' rows, run directories and logs;
keeps the usage ledger, jobs others wait on and members' hands off others' jobs; never
follows a link out of the queue's folders. And no ``spec.json`` outlives its attempt."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from orchestrator.daemon.ops import handle
from orchestrator.daemon.ops.base import Caller, OpContext
from orchestrator.queue import store
from orchestrator.queue.db import Database
from orchestrator.queue.ownership import User
from orchestrator.queue.spec import build_spec
from orchestrator.settings import Settings

COUNTED = ("job", "attempt", "event", "attemptevent", "usage", "dependency")


def _sql(url: str, statement: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(text(statement))
    engine.dispose()


def _rows(cli, table: str, job_id: int) -> int:
    column = "after_id" if table == "dependency" else "job_id"
    key = "id" if table == "job" else column
    return cli.db_rows(f"SELECT count(*) FROM {table} WHERE {key} = {job_id}")[0][0]


def _clean(cli, *args: str) -> dict:
    return json.loads(cli.run("clean", "--json", *args).stdout)


def test_clean_removes_finished_jobs_and_their_files_and_keeps_the_usage_ledger(cli):
    ok = cli.submit("--", "sh", "-c", "echo fine")
    bad = cli.submit("--", "sh", "-c", "echo broken; exit 3")
    recent = cli.submit("--", "true")
    cli.run_until_idle()
    waiting = cli.submit("--after", str(ok), "--", "true")  # queued: it waits on ok
    _sql(cli.db_url, f"UPDATE job SET finished_at = finished_at - INTERVAL '40 days' "
         f"WHERE id IN ({ok}, {bad})" if cli.backend == "postgresql" else
         f"UPDATE job SET finished_at = datetime(finished_at, '-40 days') "
         f"WHERE id IN ({ok}, {bad})")  # fmt: skip
    usage = cli.db_rows("SELECT count(*), sum(energy_j) FROM usage")[0]
    assert usage[0] >= 1  # the runs' energy (modelled on fake GPUs), per run and day
    runs = {
        j: Path(cli.db_rows(f"SELECT run_dir FROM attempt WHERE job_id = {j}")[0][0])
        for j in (ok, bad, recent)
    }
    logs = {j: cli.home / "logs" / f"{j}.log" for j in (ok, bad, recent)}
    assert all(p.is_dir() for p in runs.values()) and all(p.is_file() for p in logs.values())

    preview = _clean(cli, "--dry-run")  # 30 days: bad only (a queued job waits on ok)
    assert preview["dry_run"] and preview["jobs"] == [bad] and preview["run_dirs"] == 1
    assert preview["logs"] == 1 and preview["bytes"] > 0 and preview["events"] >= 4
    assert runs[bad].is_dir() and logs[bad].is_file() and _rows(cli, "job", bad) == 1

    done = _clean(cli)
    assert done == preview | {"dry_run": False, "before": done["before"]}
    assert [_rows(cli, t, bad) for t in COUNTED if t != "usage"] == [0, 0, 0, 0, 0]
    assert not runs[bad].exists() and not logs[bad].exists()
    assert cli.db_rows("SELECT count(*), sum(energy_j) FROM usage")[0] == usage  # ledger kept
    assert runs[ok].is_dir() and logs[ok].is_file() and runs[recent].is_dir()
    show = cli.run("show", str(bad), check=False)
    assert show.returncode == 2 and show.stderr.count("\n") == 1

    time.sleep(1.1)  # recent finished over 1 s ago (the commands above may take less)
    assert _clean(cli, "--older-than", "1s")["jobs"] == [recent]
    assert sorted(j["id"] for j in cli.json("ls", "--all")) == [ok, waiting]
    assert _rows(cli, "dependency", ok) == 1 and runs[ok].is_dir()
    assert cli.run("clean").stdout.startswith("nothing to clean")


@pytest.mark.backends("sqlite")
def test_clean_never_follows_a_link_out_of_the_queues_folders(cli, tmp_path):
    a = cli.submit("--", "true")
    b = cli.submit("--", "true")
    c = cli.submit("--", "true")
    cli.run_until_idle()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (outside / "precious.log").write_text("keep me too")
    run_a = Path(cli.db_rows(f"SELECT run_dir FROM attempt WHERE job_id = {a}")[0][0])
    run_b = Path(cli.db_rows(f"SELECT run_dir FROM attempt WHERE job_id = {b}")[0][0])
    for p in run_a.iterdir():
        p.unlink()
    run_a.rmdir()
    run_a.symlink_to(outside)  # the run directory itself is a link
    (run_b / "escape").symlink_to(outside)  # a link inside it
    log_a = cli.home / "logs" / f"{a}.log"
    log_a.unlink()
    log_a.symlink_to(outside / "precious.log")
    # a run directory the database names outside the queue's run folder
    _sql(cli.db_url, f"UPDATE attempt SET run_dir = '{outside}' WHERE job_id = {c}")
    time.sleep(1.1)

    proc = cli.run("clean", "--older-than", "1s")
    assert "removed 3 job(s)" in proc.stdout
    assert (
        proc.stderr == f"left: {outside}: not a run directory in {cli.home / 'run'}, left alone\n"
    )
    assert (outside / "precious").read_text() == "keep me"
    assert (outside / "precious.log").read_text() == "keep me too"
    assert not os.path.lexists(run_a) and not run_b.exists() and not os.path.lexists(log_a)
    assert cli.job_count() == 0


@pytest.fixture
def queue(tmp_path, db_url):
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, fake_gpus=2, database_url=db_url)
    db = Database(db_url)
    db.ensure_schema()
    yield settings, db
    db.dispose()


def test_a_member_cleans_only_their_own_jobs(queue, tmp_path):
    settings, db = queue
    now = datetime.now(UTC)
    ids = {}
    for name, uid in (("alice", 1001), ("bob", 1002)):
        spec = build_spec({"command": ["true"], "workdir": str(tmp_path)}, now=now,
                          cwd=str(tmp_path), base_env={})  # fmt: skip
        (job,) = store.submit(db, [spec], user=User(name, uid), now=now, largest_node_gpus=2)
        store.cancel(db, [job.id], user=User(name, uid), now=now)  # finished: cancelled
        ids[name] = job.id
    time.sleep(0.01)
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True, owner_uid=0)
    args = {"older_than_s": 0.001}
    assert handle(ctx, Caller("alice", 1001), "clean", args)["jobs"] == [ids["alice"]]
    assert handle(ctx, Caller("alice", 1001), "clean", args)["jobs"] == []
    with db.read() as session:
        assert store.get_job(session, ids["bob"]).state == "cancelled"
    assert handle(ctx, Caller("root", 0), "clean", args)["jobs"] == [ids["bob"]]


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "30d", True, 1e300])
@pytest.mark.backends("sqlite")
def test_a_malformed_clean_request_is_refused(queue, bad):
    from orchestrator.errors import GridshiftError

    settings, db = queue
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True)
    with pytest.raises(GridshiftError) as err:
        handle(ctx, Caller("root", 0), "clean", {"older_than_s": bad})
    assert err.value.exit_code == 2


@pytest.mark.backends("sqlite")
def test_bad_older_than_is_one_line(cli):
    for value in ("soon", "9" * 400 + "s", "99999999999w"):
        proc = cli.run("clean", "--older-than", value, check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.backends("sqlite")
def test_no_spec_json_outlives_its_attempt(cli):
    """A spec.json the monitor never read (it died first) holds the job's environment:
    the daemon removes it when the attempt ends. Here the job plants one in its run
    directory, which it can reach through its progress file's folder."""
    job = cli.submit(
        "--",
        "sh",
        "-c",
        'echo \'{"env": {"TOKEN": "s3cret"}}\' > "$(dirname "$GRIDSHIFT_PROGRESS_FILE")/spec.json"',
    )
    cli.run_until_idle()
    run = Path(cli.db_rows(f"SELECT run_dir FROM attempt WHERE job_id = {job}")[0][0])
    assert cli.json("show", str(job))["state"] == "completed"
    assert run.is_dir() and not (run / "spec.json").exists(), sorted(os.listdir(run))


@pytest.mark.backends("sqlite")  # PostgreSQL's sequences never go back; SQLite's ids did
def test_ids_are_never_reused_after_clean_so_the_ledger_keeps_every_run(cli):
    first = cli.submit("--gpus", "1", "--", "sleep", "0.3")
    cli.run_until_idle()
    time.sleep(1.1)
    assert _clean(cli, "--older-than", "1s")["jobs"] == [first]
    second = cli.submit("--gpus", "1", "--", "sleep", "0.3")
    cli.run_until_idle()
    assert second > first
    rows = cli.db_rows("SELECT job_id, attempt_id, energy_j FROM usage ORDER BY job_id")
    assert [r[0] for r in rows] == [first, second] and rows[0][1] < rows[1][1]
    assert all(r[2] > 10 for r in rows)  # 0.3 s each on a fake GPU: joules counted
    spent_wh = cli.json("budget", "--budget", "1kWh/day")["spent_g"]  # Wh, in this unit
    assert spent_wh == pytest.approx(sum(r[2] for r in rows) / 3600, abs=2e-3)
