"""A SIGTERM counts only once it reached the job. The planner may end a piece while the
job's monitor is still starting it (seconds on a loaded machine: no ``job.json`` yet);
the signal then reaches nothing, and stamping it anyway started the grace period, so
the SIGKILL came first and the job, which never heard its SIGTERM, failed (seen in
``test_daemon_live[postgresql]`` under load)."""

from __future__ import annotations

import signal
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


def _running(db, run_dir, **attempt):
    from orchestrator.queue.models import Attempt, Job

    with db.write() as session:
        job = Job(user="u", uid=1, command=["python", "t.py"], workdir="/", gpus_min=1,
                  gpus_max=1, state="running", interruptible=True, gpu_ids=[0], attempts=1,
                  submitted_at=T0 - timedelta(hours=1), started_at=T0)  # fmt: skip
        session.add(job)
        session.flush()
        handle = {"attempt_id": 1, "run_dir": str(run_dir), "data": {}}
        att = Attempt(job_id=job.id, number=1, state="running", node="local", gpu_ids=[0],
                      run_dir=str(run_dir), started_at=T0, handle=handle, **attempt)  # fmt: skip
        session.add(att)
        session.flush()
        return att.id


def _attempt(db, att_id):
    from orchestrator.queue.models import Attempt

    with db.read() as session:
        return session.get(Attempt, att_id)


def _start_job(run_dir) -> subprocess.Popen:
    """What the monitor does once the job runs: a process leading its own group, and its
    start record."""
    from executors import procs, runfiles

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ident = procs.identify(proc.pid)
    runfiles.write_json(
        run_dir / runfiles.JOB,
        {"pid": proc.pid, "start_ticks": ident.start_ticks, "started_at": T0.isoformat()},
    )
    return proc


@pytest.mark.backends("sqlite")  # the daemon's signalling, not the store's backend
def test_a_suspend_that_reached_nothing_is_sent_again_and_its_grace_starts_then(tmp_path, db_url):
    from executors.local import LocalExecutor
    from orchestrator.daemon.guard import Suspender
    from orchestrator.queue.db import Database

    db = Database(db_url)
    db.ensure_schema()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    att_id = _running(db, run_dir, planned_until=T0)
    suspender = Suspender(db=db, executor=LocalExecutor(), grace_s=3.0)

    assert suspender.suspend_due(T0 + timedelta(seconds=1)) == 0, "no process to signal yet"
    assert _attempt(db, att_id).suspend_sent_at is None
    later = T0 + timedelta(seconds=10)  # past the grace, had the first try counted
    assert suspender.suspend_due(later) == 0
    assert _attempt(db, att_id).kill_sent_at is None, "no SIGKILL before any SIGTERM"

    proc = _start_job(run_dir)
    try:
        assert suspender.suspend_due(later) == 1
        assert _attempt(db, att_id).suspend_sent_at.replace(tzinfo=UTC) == later
        assert proc.wait(timeout=10) == -signal.SIGTERM, "the job heard its SIGTERM"
        assert _attempt(db, att_id).kill_sent_at is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.backends("sqlite")
def test_a_cancel_that_reached_nothing_is_sent_again_before_any_sigkill(tmp_path, db_url):
    from orchestrator.daemon.service import Daemon
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Job
    from orchestrator.settings import Settings

    db = Database(db_url)
    db.ensure_schema()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    att_id = _running(db, run_dir)
    with db.write() as session:
        job = session.get(Job, 1)
        job.cancel_requested_at = T0
        session.add(job)
    settings = Settings(home=tmp_path / "home", fake_gpus=1, cancel_grace_s=3,
                        daemon={"policy": "fifo", "grid": ["synthetic:days=2"]})  # fmt: skip
    reaper = Daemon(settings=settings, db=db).reaper  # the local executor, fake GPUs

    reaper.stop_cancelled(T0 + timedelta(seconds=1))
    reaper.stop_cancelled(T0 + timedelta(seconds=10))
    att = _attempt(db, att_id)
    assert att.term_sent_at is None and att.kill_sent_at is None
    proc = _start_job(run_dir)
    try:
        reaper.stop_cancelled(T0 + timedelta(seconds=11))
        assert _attempt(db, att_id).term_sent_at is not None
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert _attempt(db, att_id).kill_sent_at is None
    finally:
        proc.kill()
        proc.wait()
