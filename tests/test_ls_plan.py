"""``ls``'s content, answered by the op both the daemon and single-user mode run: why a
job waits (a dependency, GPUs busy, low carbon, the budget), GPUS as a count (a requeued
job shows no old GPUs nor an old exit code), run time without suspensions, filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.cli.output.jobtext import gpus, ls_row, plan
from orchestrator.daemon.ops import handle
from orchestrator.daemon.ops.base import Caller, OpContext
from orchestrator.errors import GridshiftError
from orchestrator.queue import store
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, AttemptEvent, Health, Job
from orchestrator.queue.ownership import User
from orchestrator.queue.spec import build_spec
from orchestrator.settings import Settings

pytestmark = pytest.mark.backends("sqlite")
ROOT_CALLER = Caller("root", 0)
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def queue(tmp_path, db_url):
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, fake_gpus=4, database_url=db_url)
    db = Database(db_url)
    db.ensure_schema()
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: False, owner_uid=0)
    yield ctx, db, tmp_path
    db.dispose()


def _submit(db, tmp_path, user=("alice", 1001), **raw) -> int:
    raw = {"command": ["python", "train.py", "--lr", "0.1"], "workdir": str(tmp_path), **raw}
    spec = build_spec(raw, now=T0, cwd=str(tmp_path), base_env={})
    (job,) = store.submit(db, [spec], user=User(*user), now=T0, largest_node_gpus=4)
    return job.id


def _set(db, job_id: int, **fields) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        for key, value in fields.items():
            setattr(job, key, value)
        session.add(job)


def _note(kind: str, policy: str = "fifo") -> str:
    """The daemon's own words (``daemon.guard._why``) for a job that is due but finds no
    GPUs (``busy``), one shifted to a greener hour (``green``), or one planned later at
    the same intensity (``flat``)."""
    from types import SimpleNamespace as NS

    from orchestrator.daemon.guard import _why
    from orchestrator.planning.policies.base import Decision

    now_s = T0.timestamp()

    class Series:
        def integral(self, a: float, b: float) -> float:
            green = kind == "green" and a >= now_s + 3600
            return (100.0 if green else 300.0) * (b - a)

    planner = NS(mode="plan", mode_reason=None, policy=NS(name=policy))
    feed = NS(series=lambda: Series())
    view = NS(id=1)
    decision = Decision(start_s=now_s + 5 * 3600, end_s=now_s + 7 * 3600)
    blocked = view if kind == "busy" else None
    return _why(planner, feed, view, decision, T0, blocked)


def _ls(ctx, caller=ROOT_CALLER, **args) -> dict[int, dict]:
    return {j["id"]: j for j in handle(ctx, caller, "ls", args)["jobs"]}


def test_plan_says_why_each_job_waits(queue):
    ctx, db, tmp = queue
    first = _submit(db, tmp)
    after = _submit(db, tmp, after=first)
    busy = _submit(db, tmp)
    green = _submit(db, tmp)
    planned = _submit(db, tmp)
    at = T0 + timedelta(hours=5)
    # the daemon's notes (daemon.guard.note_plans) for a job due and one shifted
    _set(db, busy, plan_note=_note("busy"), planned_start=T0)
    _set(db, green, planned_start=at, plan_note=_note("green"))
    _set(db, planned, planned_start=at, plan_note=_note("flat"))
    jobs = _ls(ctx)
    assert [jobs[i]["wait_reason"] for i in (first, after, busy, green, planned)] == [
        None, "dependency", "capacity", "low carbon", "planned"]  # fmt: skip
    assert jobs[after]["waits_for"] == [first]
    assert plan(jobs[after]) == f"after job {first}"  # a dependency is explained, daemon or not
    assert plan(jobs[busy]) == "GPUs busy"
    assert plan(jobs[green]).startswith("low carbon ") and ":00" in plan(jobs[green])
    assert plan(jobs[first]) == "-"  # queued, no daemon has planned it yet
    _set(db, first, state="completed", exit_code=0)
    assert _ls(ctx)[after]["wait_reason"] is None  # its dependency is done


def test_plan_names_the_budget_when_the_daemon_has_one(queue):
    ctx, db, tmp = queue
    job = _submit(db, tmp)
    _set(db, job, planned_start=T0 + timedelta(hours=3), plan_note=_note("flat", "budget"))
    assert _ls(ctx)[job]["wait_reason"] == "planned"
    with db.write() as session:  # a daemon started with --budget says so in its health row
        session.add(Health(pid=1, started_at=T0, last_tick=T0, data={"budget": {"budget": "1kg"}}))
    assert _ls(ctx)[job]["wait_reason"] == "budget"
    assert plan(_ls(ctx)[job]).startswith("budget ")


def test_a_requeued_job_shows_its_request_not_its_old_gpus_nor_exit_code(queue, capsys):
    from orchestrator.cli.output.showtext import show

    ctx, db, tmp = queue
    job = _submit(db, tmp, gpus="2-4")
    _set(db, job, node="vm", gpu_ids=[1, 2, 3], exit_code=0, attempts=1)  # ran, suspended, requeued
    data = _ls(ctx)[job]
    assert data["gpus"] == 4 and gpus(data) == "2-4"
    row = ls_row(data)
    assert row[4] == "2-4" and row[8] == "", row
    capsys.readouterr()
    show(handle(ctx, ROOT_CALLER, "show", {"job_id": job}))
    text = capsys.readouterr().out
    assert "2-4 (asks for)" in text and "exit code" not in text and "GPU 1" not in text
    _set(db, job, state="running", exit_code=None)
    assert gpus(_ls(ctx)[job]) == "3"  # a count, never GPU ids


def test_runtime_leaves_out_suspensions(queue):
    ctx, db, tmp = queue
    stopped = _submit(db, tmp)  # --suspend stop: one attempt, stopped 2 h in the middle
    requeued = _submit(db, tmp)  # --suspend signal: two attempts 10 h apart
    h = timedelta(hours=1)
    with db.write() as session:
        a = Attempt(job_id=stopped, number=1, state="exited", node="vm", run_dir="/x",
                    started_at=T0, finished_at=T0 + 5 * h)  # fmt: skip
        session.add(a)
        session.flush()
        for at, src, dst in ((T0 + h, "running", "stopped"), (T0 + 3 * h, "stopped", "running")):
            session.add(AttemptEvent(attempt_id=a.id, job_id=stopped, at=at, from_state=src,
                                     to_state=dst))  # fmt: skip
        session.add(Attempt(job_id=requeued, number=1, state="exited", node="vm", run_dir="/y",
                            started_at=T0, finished_at=T0 + h))  # fmt: skip
        session.add(Attempt(job_id=requeued, number=2, state="exited", node="vm", run_dir="/z",
                            started_at=T0 + 11 * h, finished_at=T0 + 13 * h))  # fmt: skip
    for job in (stopped, requeued):
        _set(db, job, state="completed", attempts=2, started_at=T0, exit_code=0,
             finished_at=T0 + 13 * h)  # fmt: skip
    jobs = _ls(ctx, all=True)
    assert jobs[stopped]["runtime_s"] == 3 * 3600.0  # 5 h less 2 h stopped
    assert jobs[requeued]["runtime_s"] == 3 * 3600.0  # 1 h + 2 h, not the 12 h between
    assert ls_row(jobs[stopped])[7] == "3h"
    shown = handle(ctx, ROOT_CALLER, "show", {"job_id": stopped})
    assert shown["runtime_s"] == 3 * 3600.0


def test_filters_by_state_user_and_label(queue):
    ctx, db, tmp = queue
    a = _submit(db, tmp, label="exp1")
    b = _submit(db, tmp, user=("bob", 1002), label="exp1")
    c = _submit(db, tmp, user=("bob", 1002))
    _set(db, c, state="failed")
    assert set(_ls(ctx)) == {a, b}
    assert set(_ls(ctx, states=["failed"])) == {c}  # a finished state needs no --all
    assert handle(ctx, ROOT_CALLER, "ls", {"states": ["queued"]})["hidden"] == 0
    assert handle(ctx, ROOT_CALLER, "ls", {"users": ["alice"]})["hidden"] == 0
    assert handle(ctx, ROOT_CALLER, "ls", {"users": ["bob"]})["hidden"] == 1
    assert set(_ls(ctx, states=["queued,failed"])) == {a, b, c}
    assert set(_ls(ctx, users=["bob"], all=True)) == {b, c}
    assert set(_ls(ctx, labels=["exp1"])) == {a, b}
    # another member sees no one's private labels, so a label filter never reveals them
    assert set(_ls(ctx, Caller("alice", 1001), labels=["exp1"])) == {a}
    with pytest.raises(GridshiftError) as err:
        _ls(ctx, states=["queued,runing"])
    assert err.value.exit_code == 2 and "unknown state 'runing'" in str(err.value)
    for empty in ([""], [",,"], [" , "]):  # an empty list is a mistake, not "every state"
        with pytest.raises(GridshiftError) as err:
            _ls(ctx, states=empty)
        assert err.value.exit_code == 2 and "--state names no state" in str(err.value)
