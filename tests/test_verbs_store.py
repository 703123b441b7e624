"""pueue's verbs in the store (``queue.changes``) and as requests (``ops.verbs``): hold and
release, edit, restart; each all or none, on the owner's jobs only (root's on all), and
every hostile request refused with nothing written. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select

from orchestrator.daemon.ops import handle
from orchestrator.daemon.ops.base import Caller, OpContext
from orchestrator.errors import (
    NotFoundError,
    PermissionDenied,
    PlacementError,
    SpecError,
    UserError,
)
from orchestrator.queue import changes, retention, store
from orchestrator.queue.db import Database
from orchestrator.queue.models import Job
from orchestrator.queue.ownership import User
from orchestrator.queue.spec import build_spec
from orchestrator.settings import Settings

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
ALICE, BOB, ROOT = User("alice", 1001), User("bob", 1002), User("root", 0)


@pytest.fixture
def db(db_url) -> Database:
    database = Database(db_url)
    database.ensure_schema()
    return database


def _submit(db: Database, user: User = ALICE, at: datetime = NOW, **raw) -> int:
    spec = build_spec({"command": ["true"], "workdir": "/", **raw}, now=at, cwd="/", base_env={})
    (job,) = store.submit(db, [spec], user=user, now=at, largest_node_gpus=4)
    return job.id


def _set(db: Database, job_id: int, state: str) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        job.state = state
        session.add(job)


def _job(db: Database, job_id: int) -> Job:
    with db.read() as session:
        return session.get(Job, job_id)


def _events(db: Database, job_id: int) -> list[tuple]:
    with db.read() as session:
        return [(e.from_state, e.to_state, e.reason) for e in store.events(session, job_id)]


def test_hold_and_release_only_waiting_jobs_of_their_owner_all_or_none(db):
    a, b = _submit(db), _submit(db)
    with pytest.raises(PermissionDenied, match="belongs to alice"):
        changes.hold(db, [a], user=BOB, now=NOW)
    assert changes.hold(db, [a, b], user=ALICE, now=NOW) == [(a, "held"), (b, "held")]
    assert changes.hold(db, [a], user=ALICE, now=NOW) == [(a, "already held")]
    assert _events(db, a)[-1] == ("queued", "held", "held by alice")
    assert changes.release(db, [a], user=ROOT, now=NOW) == [(a, "released")]
    assert _job(db, a).state == "queued" and _events(db, a)[-1][2] == "released by root"
    with pytest.raises(UserError, match=f"job {a} is not held \\(it is queued\\)"):
        changes.release(db, [b, a], user=ALICE, now=NOW)  # b stays held: all or none
    with pytest.raises(NotFoundError, match="no job 999"):
        changes.hold(db, [a, 999], user=ALICE, now=NOW)
    assert (_job(db, a).state, _job(db, b).state) == ("queued", "held")
    _set(db, a, "running")
    with pytest.raises(UserError, match=f"job {a} is running: only a queued job can be held"):
        changes.hold(db, [a], user=ALICE, now=NOW)
    with pytest.raises(SpecError):
        changes.hold(db, [], user=ALICE, now=NOW)
    assert store.cancel(db, [b], user=ALICE, now=NOW) == [(b, "cancelled")]  # held: at once


def test_edit_checks_as_submit_does_and_a_bad_value_writes_nothing(db):
    job_id = _submit(db, duration="1h", within="10h", priority=1, name="x")
    fields = {"priority": 5, "gpus": "2-3", "duration": "2h", "name": "y"}
    done = changes.edit(db, job_id, fields, user=ALICE, now=NOW, largest_node_gpus=4)
    assert (done["priority"], done["gpus_min"], done["gpus_max"]) == (5, 2, 3)
    assert (done["duration_s"], done["name"]) == (7200.0, "y")
    assert _events(db, job_id)[-1] == (
        "queued", "queued", "edited by alice: name, priority, duration, gpus"
    )  # fmt: skip
    before = _job(db, job_id).model_dump()
    bad = [
        ({"duration": "1x"}, "invalid duration"),
        ({"duration": "-5h"}, "invalid duration"),
        ({"duration": "0s"}, "duration"),
        ({"duration": "20h"}, "could never meet it"),  # the deadline stays 10 h away
        ({"within": "1h"}, "could never meet it"),  # the run time stays 2 h
        ({"deadline": "2020-01-01T00:00"}, "in the past"),
        ({"deadline": "tomorrow"}, "invalid deadline"),
        ({"deadline": "2026-03-03T00:00", "within": "5h"}, "either a deadline or --within"),
        ({"gpus": "0-99999999"}, "at most 65536"),
        ({"gpus": "3-2"}, "maximum is below the minimum"),
        ({"gpus": "8"}, "largest node has 4"),
        ({"priority": 1.5}, "whole number"),
        ({"priority": 2**70}, "out of range"),
        ({"name": "a\x00b"}, "NUL"),
        ({"command": ["rm", "-rf", "/"]}, "cannot edit command"),
        ({}, "nothing to change"),
    ]
    for fields, message in bad:
        with pytest.raises(SpecError, match=message):
            changes.edit(db, job_id, fields, user=ALICE, now=NOW, largest_node_gpus=4)
    assert _job(db, job_id).model_dump() == before
    with pytest.raises(PermissionDenied):
        changes.edit(db, job_id, {"priority": 9}, user=BOB, now=NOW, largest_node_gpus=4)
    done = changes.edit(db, job_id, {"within": "3h"}, user=ROOT, now=NOW, largest_node_gpus=4)
    assert done["deadline"] == (NOW + timedelta(hours=3)).isoformat()
    for state in ("running", "completed", "planned"):
        _set(db, job_id, state)
        with pytest.raises(UserError, match=f"is {state}: only a queued or held job"):
            changes.edit(db, job_id, {"priority": 2}, user=ALICE, now=NOW, largest_node_gpus=4)
    _set(db, job_id, "held")
    assert changes.edit(db, job_id, {"priority": 2}, user=ALICE, now=NOW,
                        largest_node_gpus=4)["state"] == "held"  # fmt: skip


def test_restart_queues_a_copy_of_a_finished_job_for_its_owner(db):
    then = NOW - timedelta(days=1)
    old = _submit(db, at=then, within="10h", duration="1h", gpus="1-2", priority=3,
                  labels=["sweep"], env={"LR": "0.1"}, name="train")  # fmt: skip
    with pytest.raises(UserError, match=f"job {old} is queued: only a finished job"):
        changes.restart(db, [old], user=ALICE, now=NOW)
    _set(db, old, "failed")
    with pytest.raises(PermissionDenied):
        changes.restart(db, [old], user=BOB, now=NOW)
    with pytest.raises(NotFoundError):
        changes.restart(db, [old, 12345], user=ALICE, now=NOW)
    ((was, new, note),) = changes.restart(db, [old], user=ROOT, now=NOW)
    a, b = _job(db, old), _job(db, new)
    assert (
        was == old
        and new > old
        and note is None
        and b.state == "queued"
        and (b.user, b.uid) == ("alice", 1001)
    )
    same = ("name", "command", "workdir", "env", "gpus_min", "gpus_max", "duration_s",
            "priority", "labels", "interruptible", "checkpoint_s")  # fmt: skip
    assert all(getattr(a, k) == getattr(b, k) for k in same)
    assert b.deadline == NOW + timedelta(hours=10) and b.submitted_at == NOW
    assert _events(db, new) == [(None, "queued", f"restart of job {old} by root")]
    assert a.state == "failed"  # the old one stays as it ended


def test_restart_keeps_dependencies_or_takes_the_new_copies(db):
    first = _submit(db)
    second = _submit(db, after=[first])
    _set(db, first, "cancelled")
    _set(db, second, "failed")
    with pytest.raises(UserError, match=f"restart them together \\(gridshift restart {first}"):
        changes.restart(db, [second], user=ALICE, now=NOW)
    pairs = {old: new for old, new, _ in changes.restart(db, [second, first], user=ALICE, now=NOW)}
    with db.read() as session:
        assert store.dependencies(session, [pairs[second]]) == {pairs[second]: [pairs[first]]}
    _set(db, first, "completed")
    (_, again, _), = changes.restart(db, [second], user=ALICE, now=NOW)  # fmt: skip
    with db.read() as session:
        assert store.dependencies(session, [again]) == {again: [first]}


def test_requests_refuse_hostile_ids_and_others_jobs(db, tmp_path):
    ctx = OpContext(Settings(home=tmp_path), open_db=lambda: db, daemon_running=lambda: False)
    mine = _submit(db, user=ALICE)
    alice, bob = Caller("alice", 1001, (1001,)), Caller("bob", 1002, (1002,))
    for op, args in [
        ("hold", {"job_ids": [2**63]}),
        ("hold", {"job_ids": [-(2**64)]}),
        ("edit", {"job_id": 2**64, "changes": {"priority": 1}}),
        ("restart", {"job_ids": ["1"]}),
        ("states", {"job_ids": [True]}),
        ("edit", {"job_id": mine, "changes": "priority=1"}),
    ]:
        with pytest.raises(UserError) as err:
            handle(ctx, alice, op, args)
        assert err.value.exit_code == 2
    with pytest.raises(NotFoundError):
        handle(ctx, alice, "release", {"job_ids": [-5]})
    for op, args in [("hold", {"job_ids": [mine]}), ("release", {"job_ids": [mine]}),
                     ("restart", {"job_ids": [mine]}),
                     ("edit", {"job_id": mine, "changes": {"priority": 1}})]:  # fmt: skip
        with pytest.raises(PermissionDenied, match="belongs to alice"):
            handle(ctx, bob, op, args)
    assert _job(db, mine).state == "queued" and len(_events(db, mine)) == 1
    # anyone sees a job's state (as in ls); its reason only its owner
    _set(db, mine, "failed")
    with db.write() as session:
        session.get(Job, mine).reason = "exit code 3"
    seen = handle(ctx, bob, "states", {"job_ids": [mine, 777]})["jobs"]
    assert seen == [[mine, {"state": "failed", "exit_code": None, "reason": None}], [777, None]]
    assert handle(ctx, alice, "states", {"job_ids": [mine]})["jobs"][0][1]["reason"] == (
        "exit code 3"
    )


def test_the_live_planner_plans_an_edited_job_again_within_the_same_slot():
    """The plan is kept while nothing it depends on changed (same jobs, same slot): an
    edit of a job's deadline (or priority, GPUs) is such a change."""
    from types import SimpleNamespace

    import numpy as np

    from grid.steps import StepSeries
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy

    now_s = NOW.timestamp()
    values = np.full(3 * 96, 400.0)
    values[24 + 48 : 24 + 58] = 100.0  # low only from +12 h to +14.5 h
    series = StepSeries(now_s - 6 * 3600, 900.0, values)
    feed = SimpleNamespace(series=lambda: series, age_s=lambda now: 0.0, version=1, last_error=None)
    job = Job(id=1, state="queued", user="alice", uid=1001, command=["true"], workdir="/",
              gpus_min=1, gpus_max=1, submitted_at=NOW, duration_s=7200.0,
              deadline=NOW + timedelta(hours=20))  # fmt: skip
    planner = LivePlanner(resolve_policy("lowest-window"), 900.0, curve_for(None), feed=feed)
    planner.schedule(NOW, [job], {}, [], 4, 4, 0.0)
    assert planner._plan[1].start_s >= now_s + 11 * 3600  # waits for the low window
    edited = job.model_copy(update={"deadline": NOW + timedelta(hours=3)})
    planner.schedule(NOW + timedelta(seconds=1), [edited], {}, [], 4, 4, 0.0)
    assert planner._plan[1].start_s <= now_s + 3600  # the new deadline leaves no wait


def test_restart_checks_as_submit_does_and_says_what_clean_removed(db):
    wide = _submit(db, gpus="4")
    late = _submit(db, within="3h", duration="1h")
    first = _submit(db)
    second = _submit(db, after=[first])
    with db.write() as session:
        session.get(Job, late).duration_s = 5 * 3600.0  # a row no check saw
    for i in (wide, late, first, second):
        _set(db, i, "completed")
    with pytest.raises(PlacementError, match=f"^job {wide}: needs 4 GPUs; the largest node has 2$"):
        changes.restart(db, [wide], user=ALICE, now=NOW, largest_node_gpus=2)
    with pytest.raises(SpecError, match=f"^job {late}: the job runs 5h .* could never meet it"):
        changes.restart(db, [late], user=ALICE, now=NOW)
    with db.read() as session:  # nothing queued by the refusals
        assert len(session.exec(select(Job)).all()) == 4
    with db.write() as session:
        retention.remove(session, [first])
    assert "no longer waits on job" in _events(db, second)[-1][2]
    ((_, new, note),) = changes.restart(db, [second], user=ALICE, now=NOW)
    assert note == f"not waiting on job {first}, which clean removed"
    with db.read() as session:
        assert store.dependencies(session, [new]) == {new: []}
