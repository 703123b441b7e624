"""An elastic job's work left when its attempts ran at other widths than its widest
(review finding 6): each attempt's time counts at its width's speed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import Session, SQLModel, create_engine

from orchestrator.accounting.estimates import _from_progress
from orchestrator.planning.resize import width_rate
from orchestrator.queue.attempts import remaining_run_s
from orchestrator.queue.models import Attempt, Job

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H = 3600.0
ON_2_OF_8 = 2 * 0.9 / (8 * 0.9**3)  # the default scaling: 2 GPUs do this share of 8's work


def test_time_on_fewer_gpus_counts_at_their_speed_in_the_run_left():
    engine = create_engine("sqlite://")
    SQLModel.metadata.create_all(engine)
    with Session(engine) as s:
        job = Job(name="e", state="running", user="u", uid=1, command=["x"], workdir="/",
                  gpus_min=2, gpus_max=8, duration_s=8 * H, interruptible=True,
                  submitted_at=T0)  # fmt: skip
        s.add(job)
        s.commit()
        s.refresh(job)
        # 4 h on 2 GPUs (a narrow start), then grown: its 8-GPU attempt begins
        s.add(Attempt(job_id=job.id, number=1, state="exited", node="n", gpu_ids=[0, 1],
                      run_dir="", started_at=T0, finished_at=T0 + timedelta(hours=4)))  # fmt: skip
        grown = T0 + timedelta(hours=4)
        s.add(Attempt(job_id=job.id, number=2, state="running", node="n",
                      gpu_ids=list(range(8)), run_dir="", started_at=grown))  # fmt: skip
        s.commit()
        now = T0 + timedelta(hours=4)
        left = remaining_run_s(s, job, now, None, width_rate(8))
        assert left == pytest.approx(8 * H - 4 * H * ON_2_OF_8)
        assert remaining_run_s(s, job, now, None) == pytest.approx(4 * H)  # as before


def test_a_progress_estimate_on_fewer_gpus_is_at_the_jobs_widest():
    # 1 h on 2 of its 8 GPUs, 10 % done: 10 h on 2 GPUs, 10 h * ON_2_OF_8 on 8
    att = Attempt(job_id=1, number=1, state="running", node="n", gpu_ids=[0, 1], run_dir="",
                  started_at=T0, progress_done=10, progress_total=100,
                  progress_at=T0 + timedelta(hours=1))  # fmt: skip
    est = _from_progress([att], T0 + timedelta(hours=1), widest=8)
    assert est.run_s == pytest.approx(10 * H * ON_2_OF_8)
    assert _from_progress([att], T0 + timedelta(hours=1)).run_s == pytest.approx(10 * H)


def test_the_daemon_does_not_resize_a_job_being_cancelled_or_under_a_planned_cap():
    """Findings 9 and 1: a job whose cancel was asked for, or that runs under a power cap
    its plan chose, is not resizable in the daemon's view of it."""
    from types import SimpleNamespace

    from orchestrator.daemon.sqlqueue import SqlQueue
    from orchestrator.planning.onepass import Running
    from orchestrator.planning.policies.base import QueuedJob

    queue = SimpleNamespace(
        alloc=SimpleNamespace(max_node_gpus=8),
        dispatcher=SimpleNamespace(nodes=[SimpleNamespace(name="n", executor="local")]),
        planner=None,
    )
    job = Job(id=1, name="e", state="running", user="u", uid=1, command=["x"], workdir="/",
              gpus_min=2, gpus_max=8, duration_s=8 * H, interruptible=True,
              submitted_at=T0)  # fmt: skip
    att = Attempt(id=3, job_id=1, number=1, state="running", node="n", gpu_ids=[0, 1],
                  run_dir="", started_at=T0)  # fmt: skip
    run = Running(("attempt", 3), QueuedJob(1, 2, 0.0, interruptible=True), 4 * H, age_s=H)

    def elastic(job, att):
        return SqlQueue._elastic(queue, run, job, att, T0.timestamp() + H).elastic

    assert elastic(job, att)
    assert not elastic(job.model_copy(update={"cancel_requested_at": T0}), att)
    assert not elastic(job, att.model_copy(update={"cap": 0.75}))


def test_a_pending_resize_is_read_back_from_the_database():
    """Finding 3: the width a resize asked for is kept on the attempt (``resize_to``), so
    a daemon restarted meanwhile starts the job on it (and holds the GPUs it grows into)
    instead of planning it afresh and resizing it again."""
    from types import SimpleNamespace

    from orchestrator.daemon.sqlqueue import SqlQueue

    engine = create_engine("sqlite://")
    SQLModel.metadata.create_all(engine)

    def job(i, state):
        return Job(id=i, name=f"e{i}", state=state, user="u", uid=1, command=["x"],
                   workdir="/", gpus_min=2, gpus_max=8, submitted_at=T0)  # fmt: skip

    def att(i, job_id, number, state, resize_to=None):
        return Attempt(id=i, job_id=job_id, number=number, state=state, node="n",
                       gpu_ids=[0, 1], run_dir="", resize_to=resize_to)  # fmt: skip

    with Session(engine) as s:
        s.add_all([job(1, "queued"), job(2, "running"), job(3, "running"), job(4, "completed")])
        s.commit()
        s.add_all([
            att(11, 1, 1, "exited", resize_to=4),  # left its GPUs: starts again on 4
            att(21, 2, 1, "running", resize_to=8),  # still checkpointing
            att(31, 3, 1, "exited", resize_to=4), att(32, 3, 2, "running"),  # started since
            att(41, 4, 1, "exited", resize_to=4),  # ended
        ])  # fmt: skip
        s.commit()
        queue = SimpleNamespace(resize_to={}, resize_from={})
        SqlQueue._pending_resizes(queue, s)
    assert queue.resize_to == {1: 4, 2: 8}
    assert queue.resize_from == {2: ("attempt", 21)}
