"""The daemon killed with SIGKILL at any moment loses no job and never runs one twice."""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from datetime import datetime

from executors.local import LocalExecutor
from orchestrator.daemon.service import Daemon
from orchestrator.queue.db import Database
from orchestrator.settings import load_settings
from tests.conftest import E2E

pytestmark = E2E


def test_sigkill_at_random_moments_loses_nothing_and_runs_nothing_twice(cli, tmp_path):
    ran = tmp_path / "ran"
    jobs = 16
    script = (
        f'echo "$GRIDSHIFT_JOB_ID start" >> {ran}; sleep 0.4; echo "$GRIDSHIFT_JOB_ID end" >> {ran}'
    )
    sweep = tmp_path / "jobs.jsonl"  # one submit command for the 16 jobs, ids 1 to 16
    row = json.dumps({"gpus": 1, "command": ["sh", "-c", script]})
    sweep.write_text(f"{row}\n" * jobs)
    assert [j["id"] for j in cli.json("submit", "--file", str(sweep))] == list(range(1, jobs + 1))
    rng = random.Random(7)
    for _ in range(10):
        daemon = cli.daemon("--interval", "0.05")
        time.sleep(rng.uniform(0.3, 1.2))  # start-up takes about 0.8 s: kills land anywhere
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    cli.run_until_idle(timeout=120)
    lines = ran.read_text().split("\n")
    starts = [line.split()[0] for line in lines if line.endswith("start")]
    ends = [line.split()[0] for line in lines if line.endswith("end")]
    assert sorted(starts, key=int) == [str(i) for i in range(1, jobs + 1)], "each ran once"
    assert sorted(ends, key=int) == sorted(starts, key=int), "each ran to its end"
    for job in cli.json("ls", "--all"):
        assert job["state"] == "completed" and job["exit_code"] == 0, job
    running_twice = cli.db_rows(
        "SELECT job_id FROM attempt WHERE state != 'abandoned' GROUP BY job_id HAVING count(*) > 1"
    )
    assert running_twice == []


def test_job_that_ends_while_the_daemon_is_down_keeps_its_exit_code_and_end_time(cli):
    job_id = cli.submit("--", "sh", "-c", "sleep 2.5; exit 3")
    daemon = cli.daemon("--interval", "0.05")
    cli.wait_state(job_id, {"running"})
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    assert cli.json("show", str(job_id))["state"] == "running", "killed mid-run"
    exit_file = next((cli.home / "run").glob("attempt-*")) / "exit.json"
    deadline = time.monotonic() + 10
    while not exit_file.exists():
        assert time.monotonic() < deadline, "the monitor never recorded the exit"
        time.sleep(0.05)
    real_end = datetime.fromisoformat(json.loads(exit_file.read_text())["ended_at"])
    time.sleep(1.0)  # the daemon stays down a while after the job ended
    restarted_at = time.time()
    cli.run_until_idle()
    job = cli.json("show", str(job_id))
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["attempts"] == 1
    assert datetime.fromisoformat(job["finished_at"]) == real_end
    assert real_end.timestamp() < restarted_at


def test_daemon_restart_reattaches_to_a_running_job(cli, tmp_path):
    # The job outlives the polling below (each CLI call takes most of a second).
    job_id = cli.submit("--", "sh", "-c", "sleep 3; echo done")
    daemon = cli.daemon("--interval", "0.05")
    cli.wait_state(job_id, {"running"})
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    assert cli.json("show", str(job_id))["state"] == "running", "killed mid-run"
    cli.run_until_idle()
    job = cli.json("show", str(job_id))
    assert job["state"] == "completed" and job["attempts"] == 1
    assert cli.run("logs", str(job_id)).stdout == "done\n"


def test_sigterm_stops_the_daemon_and_leaves_jobs_running(cli):
    job_id = cli.submit("--", "sh", "-c", "sleep 3; echo survived")
    daemon = cli.daemon("--interval", "0.05")
    cli.wait_state(job_id, {"running"})
    daemon.terminate()
    assert daemon.wait(timeout=10) == 0
    assert cli.json("show", str(job_id))["state"] == "running"
    cli.run_until_idle()
    assert cli.json("show", str(job_id))["state"] == "completed"
    assert cli.run("logs", str(job_id)).stdout == "survived\n"


class _Crash(BaseException):
    """Stands for the daemon dying at one exact point."""


class _CrashingExecutor(LocalExecutor):
    def __init__(self, after_launch: bool) -> None:
        super().__init__()
        self.after_launch = after_launch

    def _do_launch(self, spec):
        if not self.after_launch:
            raise _Crash
        super()._do_launch(spec)
        raise _Crash


def _daemon(cli, monkeypatch, executor=None) -> Daemon:
    for key, value in cli.env.items():
        if key.startswith("GRIDSHIFT_"):
            monkeypatch.setenv(key, value)
    settings = load_settings()
    db = Database(settings.db_url)
    db.ensure_schema()
    daemon = Daemon(settings=settings, db=db, executor=executor or LocalExecutor())
    if daemon.lease is not None:  # PostgreSQL: only the lease holder may launch
        assert daemon.lease.try_acquire() is None
    return daemon


def _crash_between_launch_transactions(cli, tmp_path, monkeypatch, after_launch: bool):
    marker = tmp_path / "ran"
    job_id = cli.submit("--", sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')")
    crashing = _daemon(cli, monkeypatch, _CrashingExecutor(after_launch))
    try:
        crashing.tick(crashing.clock.now())
        raise AssertionError("expected the simulated crash")
    except _Crash:
        pass
    if crashing.lease is not None:  # gone with the crashed process (same pid as ours here)
        crashing.lease.release()
    assert cli.json("show", str(job_id))["state"] == "planned"
    time.sleep(0.5)  # a monitor, if one started, claims its run directory meanwhile
    cli.run_until_idle()
    job = cli.json("show", str(job_id))
    assert job["state"] == "completed", job
    assert marker.read_text() == "x", "the job ran exactly once"
    return job, cli.db_rows("SELECT state FROM attempt ORDER BY id")


def test_crash_before_the_monitor_started_requeues_the_job(cli, tmp_path, monkeypatch):
    job, attempts = _crash_between_launch_transactions(
        cli, tmp_path, monkeypatch, after_launch=False
    )
    assert attempts == [("abandoned",), ("exited",)] and job["attempts"] == 2


def test_crash_after_the_monitor_started_reattaches(cli, tmp_path, monkeypatch):
    job, attempts = _crash_between_launch_transactions(
        cli, tmp_path, monkeypatch, after_launch=True
    )
    assert attempts == [("exited",)] and job["attempts"] == 1
