"""The job state machine: legal moves succeed with one event each, illegal ones raise."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import select

from orchestrator.errors import StateError
from orchestrator.queue.db import Database
from orchestrator.queue.models import Event, Job
from orchestrator.queue.states import ALLOWED, FINAL, JobState, transition

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _job(state: JobState = JobState.QUEUED) -> Job:
    return Job(
        state=state.value,
        user="u",
        uid=1000,
        command=["true"],
        workdir="/",
        gpus_min=1,
        gpus_max=1,
        submitted_at=NOW,
    )


@pytest.fixture(scope="module")
def db(request, db_backend, tmp_path_factory) -> Database:
    from tests.conftest import new_db_url

    path = tmp_path_factory.mktemp("db") / "states.db"
    database = Database(new_db_url(request, db_backend, path))
    database.ensure_schema()
    return database


@pytest.mark.parametrize("src,dst", list(itertools.product(JobState, JobState)))
def test_every_pair_is_either_allowed_or_refused(db, src, dst):
    with db.write() as session:
        job = _job(src)
        session.add(job)
        session.flush()
        if dst in ALLOWED[src]:
            event = transition(session, job, dst, at=NOW, reason="r")
            assert job.state == dst and event.from_state == src and event.to_state == dst
        else:
            with pytest.raises(StateError, match="illegal transition"):
                transition(session, job, dst, at=NOW)
            assert job.state == src


def test_design_card_transitions_are_present():
    s = JobState
    for src, dst in [
        (s.QUEUED, s.PLANNED),
        (s.PLANNED, s.RUNNING),
        (s.RUNNING, s.COMPLETED),
        (s.RUNNING, s.FAILED),
        (s.RUNNING, s.SUSPENDED),
        (s.SUSPENDED, s.QUEUED),
        (s.RUNNING, s.LOST),
        (s.LOST, s.QUEUED),
    ]:
        assert dst in ALLOWED[src]
    for state in s:
        if state not in FINAL:
            assert s.CANCELLED in ALLOWED[state], f"{state} must be cancellable"
        else:
            assert not ALLOWED[state], f"{state} is final"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(JobState)), max_size=12))
def test_random_walks_record_exactly_the_legal_moves(db, targets):
    with db.write() as session:
        job = _job()
        session.add(job)
        session.flush()
        legal = 0
        for target in targets:
            before = job.state
            try:
                transition(session, job, target, at=NOW)
                legal += 1
            except StateError:
                assert job.state == before
        events = session.exec(select(Event).where(Event.job_id == job.id)).all()
        assert len(events) == legal
        for a, b in itertools.pairwise(events):
            assert a.to_state == b.from_state
        if events and JobState(job.state) in FINAL:
            assert job.finished_at is not None


def test_a_failed_write_leaves_no_event(db):
    with db.write() as session:
        job = _job()
        session.add(job)
    with pytest.raises(RuntimeError), db.write() as session:
        fresh = session.get(Job, job.id)
        transition(session, fresh, JobState.CANCELLED, at=NOW)
        raise RuntimeError("boom before commit")
    with db.read() as session:
        assert session.get(Job, job.id).state == "queued"
        assert session.exec(select(Event).where(Event.job_id == job.id)).all() == []
