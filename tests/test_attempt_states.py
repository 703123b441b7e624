"""The attempt state machine: every attempt write goes through ``queue.attempts``; legal
moves succeed with one event each, illegal ones raise and change nothing, and no module
writes an attempt's state by hand."""

from __future__ import annotations

import ast
import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import select

from orchestrator.errors import StateError
from orchestrator.queue import attempts
from orchestrator.queue.attempts import ALLOWED, FINAL, AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, AttemptEvent, Job
from tests.conftest import ROOT

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def db(request, db_backend, tmp_path_factory) -> Database:
    from tests.conftest import new_db_url

    path = tmp_path_factory.mktemp("db") / "attempts.db"
    database = Database(new_db_url(request, db_backend, path))
    database.ensure_schema()
    return database


def _attempt(session, state: AttemptState = AttemptState.LAUNCHING) -> Attempt:
    job = Job(state="planned", user="u", uid=1000, command=["true"], workdir="/", gpus_min=1,
              gpus_max=1, submitted_at=NOW)  # fmt: skip
    session.add(job)
    session.flush()
    att = attempts.begin(session, at=NOW, job_id=job.id, number=1, node="local", gpu_ids=[0],
                         run_dir="")  # fmt: skip
    att.state = state.value  # the starting point of the case under test
    return att


@pytest.mark.parametrize("src,dst", list(itertools.product(AttemptState, AttemptState)))
def test_every_pair_is_either_allowed_or_refused(db, src, dst):
    with db.write() as session:
        att = _attempt(session, src)
        if dst in ALLOWED[src]:
            event = attempts.move(session, att, dst, at=NOW, detail="why")
            assert att.state == dst and att.detail == "why"
            assert (event.from_state, event.to_state, event.attempt_id) == (src, dst, att.id)
        else:
            with pytest.raises(StateError, match="illegal transition"):
                attempts.move(session, att, dst, at=NOW, detail="why")
            assert att.state == src and att.detail is None


def test_the_lifecycles_the_daemon_uses_are_present():
    s = AttemptState
    for path in [
        (s.LAUNCHING, s.RUNNING, s.STOPPED, s.RUNNING, s.EXITED),  # stop mode
        (s.LAUNCHING, s.SUBMITTED, s.RUNNING, s.EXITED),  # Slurm
        (s.LAUNCHING, s.ABANDONED),  # a launch cut short, never started
        (s.LAUNCHING, s.FAILED),  # the launch failed
        (s.LAUNCHING, s.RUNNING, s.ORPHANED, s.LOST),  # its server went away, then fenced
        (s.LAUNCHING, s.RUNNING, s.LOST),  # vanished
    ]:
        for a, b in itertools.pairwise(path):
            assert b in ALLOWED[a], f"{a} → {b}"
    assert {s.EXITED, s.FAILED, s.LOST, s.ABANDONED} == FINAL
    assert set(attempts.HOLDING) >= set(attempts.LIVE) >= set(attempts.ON_GPU)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(AttemptState)), max_size=10))
def test_random_walks_record_exactly_the_legal_moves(db, targets):
    with db.write() as session:
        att = _attempt(session)
        legal = 0
        for target in targets:
            before = att.state
            try:
                attempts.move(session, att, target, at=NOW)
                legal += 1
            except StateError:
                assert att.state == before
        events = session.exec(
            select(AttemptEvent).where(AttemptEvent.attempt_id == att.id).order_by(AttemptEvent.id)
        ).all()
        assert len(events) == legal + 1  # begin() records the launching one
        assert events[0].from_state is None and events[0].to_state == "launching"
        for a, b in itertools.pairwise(events):
            assert a.to_state == b.from_state


def test_no_module_writes_an_attempts_state_by_hand():
    """``att.state = ...`` outside queue/attempts.py would skip the check and the event
    (a copy kept for the rest of one pass is marked so)."""
    offenders = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        if path.name == "attempts.py" and path.parent.name == "queue":
            continue
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                for elt in elts:
                    if (
                        isinstance(elt, ast.Attribute)
                        and elt.attr == "state"
                        and isinstance(elt.value, ast.Name)
                        and elt.value.id in ("att", "attempt", "row", "a")
                        and "this pass's copy" not in lines[node.lineno - 1]
                    ):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
