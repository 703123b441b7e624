"""A job started by backfill starts on its promise to give its GPUs back by its run time
(and a grace); past it, while a job it passed waits, it is checkpointed if it may be
suspended, else stopped (issue 23 review, finding 1)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.planning.backfill import EASY, Cluster, job_key, promise_s
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.planning.scheduler import Scheduler
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


def test_a_backfilled_job_gets_a_promise_a_job_in_its_turn_does_not():
    a = ClusterAllocator(ClusterTopology((NodeTopology.plain("n0", 8),)))
    a.allocate(("attempt", 1), 4)
    s = Scheduler(Fifo(), backfill=EASY)
    s.add([QueuedJob(10, 8, 0.0, duration_s=3600.0), QueuedJob(11, 4, 1.0, duration_s=60.0)])
    s.plan(5.0)
    ends = {("attempt", 1): 100.0}
    take = lambda j, d: a.allocate(job_key(j.id), j.gpus)  # noqa: E731
    got = s.launchable(5.0, take, lambda: Cluster(a, ends))
    assert [j.id for j, _, _ in got] == [11]
    assert s.promises == {11: promise_s(5.0, 65.0)} == {11: 365.0}  # 60 s and 5 minutes


class _Signals:
    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    def signal(self, handle, sig) -> bool:
        self.sent.append((handle.attempt_id, sig))
        return True


def _running(db, interruptible: bool, started: datetime) -> int:
    from orchestrator.queue.models import Attempt, Job

    with db.write() as session:
        job = Job(user="u", uid=1, command=["sleep", "1"], workdir="/", gpus_min=1, gpus_max=1,
                  state="running", interruptible=interruptible, gpu_ids=[0], attempts=1,
                  submitted_at=started, started_at=started)  # fmt: skip
        session.add(job)
        session.flush()
        att = Attempt(job_id=job.id, number=1, state="running", node="local", gpu_ids=[0],
                      run_dir="/nonexistent", started_at=started, handle={})  # fmt: skip
        session.add(att)
        session.flush()
        att.handle = {"attempt_id": att.id, "run_dir": "/nonexistent", "data": {}}
        session.add(att)
        job_id = job.id
    return job_id


@pytest.mark.backends("sqlite")
def test_a_broken_promise_checkpoints_or_stops_the_job_while_one_it_passed_waits(db_url):
    from sqlmodel import select

    from orchestrator.daemon.guard import Suspender
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt

    db = Database(db_url)
    db.ensure_schema()
    ex = _Signals()
    sus = Suspender(db=db, executor=ex, grace_s=30.0)
    start = T0 + timedelta(minutes=1)  # after the head (submitted at T0) was queued
    elastic = _running(db, True, start)
    rigid = _running(db, False, start)
    kept = _running(db, False, start)  # promise not broken yet
    early = _running(db, False, T0 - timedelta(hours=1))  # did not pass the head
    for job_id, until in ((elastic, 600), (rigid, 600), (kept, 7200), (early, 600)):
        sus.promised(job_id, start + timedelta(seconds=until))
    now = start + timedelta(seconds=900)
    assert sus.overran(now, T0) == 2
    with db.read() as session:
        att = {a.job_id: a for a in session.exec(select(Attempt)).all()}
    assert att[elastic].suspend_sent_at is not None and att[elastic].term_sent_at is None
    assert att[rigid].term_sent_at is not None and att[rigid].suspend_sent_at is None
    assert att[kept].term_sent_at is None and att[early].term_sent_at is None
    assert {sig for _, sig in ex.sent} == {signal.SIGTERM}
    # the rigid one ignores it: SIGKILL once the grace has passed
    assert sus.overran(now + timedelta(seconds=31), T0) == 1
    assert ex.sent[-1] == (att[rigid].id, signal.SIGKILL)


@pytest.mark.backends("sqlite")
def test_a_job_stopped_for_its_broken_promise_fails_with_that_reason(tmp_path):
    import os
    from types import SimpleNamespace

    from executors.base import PollResult, RunStatus
    from orchestrator.accounting.meter import Accountant
    from orchestrator.daemon.reaper import Reaper
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Job

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="running", user="u", uid=os.getuid(), command=["true"], workdir="/",
                  gpus_min=1, gpus_max=1, submitted_at=T0, attempts=1)  # fmt: skip
        session.add(job)
        session.flush()
        att = attempts.begin(session, at=T0, job_id=job.id, number=1, node="local",
                             gpu_ids=[0], run_dir=str(tmp_path / "run"))  # fmt: skip
        attempts.move(session, att, AttemptState.RUNNING, at=T0,
                      handle={"attempt_id": att.id, "run_dir": "", "data": {}},
                      backfilled_until=T0 + timedelta(minutes=6),
                      term_sent_at=T0 + timedelta(minutes=7))  # fmt: skip
        session.flush()
        from orchestrator.queue.models import Attempt

        running = Attempt.model_validate(att.model_dump())
        job_id = job.id
    end = T0 + timedelta(minutes=7, seconds=1)
    executor = SimpleNamespace(
        poll=lambda handle: PollResult(RunStatus.EXITED, exit_code=143, ended_at=end),
        progress=lambda handle: None,
    )
    accountant = Accountant(carbon=lambda a, b: 0.0, price=lambda a, b: None,
                            modelled_power_w=lambda att: 300.0)  # fmt: skip
    reaper = Reaper(db=db, executor=executor, settings=SimpleNamespace(cancel_grace_s=1.0),
                    nodes=[], accountant=accountant)  # fmt: skip
    assert reaper._reap_one(running, end) == 1
    with db.read() as session:
        job = session.get(Job, job_id)
    assert job.state == "failed"
    assert job.reason == "ran past the run time it was backfilled on (exit code 143)"
