"""The deadline guard knows how long a running job without --duration has left: the
same estimate the planner uses (``accounting.estimates``: here its earlier runs), so
its planned end is known and, with slack to spare, it may be moved for an urgent job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


@pytest.mark.backends("sqlite")  # the daemon's guard, not the store's backend
def test_the_guard_plans_a_running_job_by_its_earlier_runs(tmp_path, db_url):
    from orchestrator.daemon.service import Daemon
    from orchestrator.planning.onepass import may_make_room
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.settings import Settings

    settings = Settings(home=tmp_path / "home", fake_gpus=4,
                        daemon={"policy": "fifo", "grid": ["synthetic:days=2"]})  # fmt: skip
    db = Database(db_url)
    db.ensure_schema()
    base = dict(user="u", uid=1, command=["python", "train.py"], workdir="/", gpus_min=2,
                gpus_max=2, name="bert", submitted_at=T0 - timedelta(days=1))  # fmt: skip
    with db.write() as session:
        for n in range(3):  # three earlier runs of "bert" on 2 GPUs: an hour each
            job = Job(state="completed", gpu_ids=[0, 1], attempts=1, **base)
            session.add(job)
            session.flush()
            start = T0 - timedelta(hours=10 - 2 * n)
            session.add(Attempt(job_id=job.id, number=1, state="exited", node="local",
                                gpu_ids=[0, 1], run_dir="/x", started_at=start,
                                finished_at=start + timedelta(hours=1)))  # fmt: skip
        running = Job(state="running", interruptible=True, deadline=T0 + timedelta(hours=6),
                      gpu_ids=[0, 1], attempts=1, started_at=T0 - timedelta(minutes=10),
                      **base)  # fmt: skip
        session.add(running)
        session.flush()
        session.add(Attempt(job_id=running.id, number=1, state="running", node="local",
                            gpu_ids=[0, 1], run_dir="/x",
                            started_at=T0 - timedelta(minutes=10)))  # fmt: skip
        running_id = running.id
    queue = Daemon(settings=settings, db=db).queue
    now_s = T0.timestamp()
    queue.plan(now_s)
    (run,) = queue.running(now_s)
    assert run.job.id == running_id
    assert run.job.duration_s == pytest.approx(3600.0), "its estimate, from 3 earlier runs"
    assert run.remaining_s == pytest.approx(3000.0, abs=1.0), "an hour less the 10 min it ran"
    assert may_make_room(run.job, run.remaining_s, now_s, 900.0, 86400.0), (
        "5 h of slack to its deadline: the guard may move it"
    )


@pytest.mark.backends("sqlite")
def test_the_lab_default_is_no_known_run_time_for_the_guard(tmp_path, db_url):
    """A running deadline job with no --duration, no progress and no earlier runs is
    planned by the lab default (4 h), but the guard does not know when it ends: it has no
    slack and is never moved for another job (as before estimates)."""
    from orchestrator.daemon.service import Daemon
    from orchestrator.planning.onepass import may_make_room
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.settings import Settings

    settings = Settings(home=tmp_path / "home", fake_gpus=4,
                        daemon={"policy": "fifo", "grid": ["synthetic:days=2"]})  # fmt: skip
    db = Database(db_url)
    db.ensure_schema()
    started = T0 - timedelta(hours=1)
    with db.write() as session:
        running = Job(state="running", interruptible=True, deadline=T0 + timedelta(hours=24),
                      gpu_ids=[0, 1], attempts=1, started_at=started, user="u", uid=1,
                      command=["python", "train.py"], workdir="/", gpus_min=2, gpus_max=2,
                      name="fresh", submitted_at=started)  # fmt: skip
        session.add(running)
        session.flush()
        session.add(Attempt(job_id=running.id, number=1, state="running", node="local",
                            gpu_ids=[0, 1], run_dir="/x", started_at=started))  # fmt: skip
    queue = Daemon(settings=settings, db=db).queue
    now_s = T0.timestamp()
    queue.plan(now_s)
    assert queue.known[running.id].source == "default", "planned by the lab default"
    (run,) = queue.running(now_s)
    assert (run.job.duration_s, run.remaining_s) == (None, None), "its end is unknown"
    assert not may_make_room(run.job, run.remaining_s, now_s, 900.0, 86400.0)
