"""A job waiting for a right-sized server to wake says so (``show``'s why, ``ls`` PLAN,
``wait_reason`` "wake"): the server, its wake's failure (escaped, cut) and when it is
tried again; the note is cleared once the job no longer waits for that server."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace as NS

import pytest

from tests.helpers.rightsize import _sizer

pytestmark = pytest.mark.backends("sqlite")
NOW = datetime(2026, 11, 24, 19, 30, tzinfo=UTC).timestamp()


def _levers(tmp_path):
    from orchestrator.daemon.energy.levers import Levers
    from orchestrator.queue.models import Job

    sizer, alloc, db = _sizer(tmp_path, ["/bin/true"], ["/bin/true"])
    with db.write() as session:
        for i in (1, 2, 3):
            session.add(Job(id=i, state="queued", user="u", uid=1, workdir="/", gpus_min=2,
                            gpus_max=2, submitted_at=datetime.now(UTC)))  # fmt: skip
    return Levers(sizer, idle=None), sizer, alloc, db


def _notes(db) -> dict[int, str | None]:
    from orchestrator.queue.models import Job

    with db.read() as session:
        return {j: session.get(Job, j).plan_note for j in (1, 2, 3)}


def _set(db, job_id: int, **values) -> None:
    from orchestrator.queue.models import Job

    with db.write() as session:
        row = session.get(Job, job_id)
        for k, v in values.items():
            setattr(row, k, v)
        session.add(row)


def test_a_job_waiting_for_a_failed_wake_says_why_until_it_no_longer_waits(tmp_path):
    from orchestrator.cli.output.jobtext import plan
    from orchestrator.daemon.ops.views import wait_reason

    levers, sizer, _alloc, db = _levers(tmp_path)
    a = sizer.nodes["a"]
    a.state, a.since_s, a.waiters = "waking", NOW - 5, {("job", 1), ("job", 2)}
    levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db)[1] == "due; waiting for a to wake: woken at 19:29:55 UTC"
    a.state, a.retry_at_s = "wake failed", NOW + 120
    a.error = "power_on: off.sh: exit 7: \x1b[2J" + "B" * 400  # escaped and cut
    notes = levers.wake_notes(NOW, refused={2: "waking a would exceed the site limit"})
    assert set(notes) == {1}, "the site limit's note says why job 2 waits"
    levers.write_wake_notes(notes)
    note = _notes(db)[1]
    assert note.startswith("due; waiting for a to wake: its wake failed (power_on: off.sh: "
                           "exit 7: \\x1b[2JBBB")  # fmt: skip
    assert note.endswith("B); tried again at 19:32:00 UTC") and len(note) < 300, note
    assert _notes(db)[2] is None
    job = NS(state="queued", plan_note=note, planned_start=None)
    assert wait_reason(job, []) == "wake"
    assert plan({"wait_reason": "wake", "state": "queued", "plan_note": note}) == ("a wake failed")
    _set(db, 1, state="running")  # it started (elsewhere): its note goes, it is forgotten
    levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db)[1] is None and a.waiters == {("job", 2)}
    a.waiters.add(("job", 3))
    levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db)[2] and _notes(db)[3]
    _set(db, 3, plan_note="due; waiting for GPUs")  # the planner's own note since
    a.state = "on"  # it answers: nobody waits for it to wake
    levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db) == {1: None, 2: None, 3: "due; waiting for GPUs"} and not a.waiters


def test_the_plans_jobs_due_within_a_wake_wait_for_that_server(tmp_path):
    """A wake right-sizing made for the plan (no job's allocation asked for it): the jobs
    due within its wake that fit there wait for it; one too wide or later does not."""
    from orchestrator.daemon.energy.levers import _plan_waits
    from orchestrator.planning.policies.base import Decision

    _, sizer, alloc, _db = _levers(tmp_path)
    sizer.nodes["a"].state = "wake failed"
    alloc.hold(("down", "a"), "a", alloc.free_on("a"))  # as right-sizing holds it
    planned = [(NS(id=1, gpus=2, gpu_type=None), Decision(start_s=NOW)),
               (NS(id=2, gpus=4, gpu_type=None), Decision(start_s=NOW)),
               (NS(id=3, gpus=1, gpu_type=None), Decision(start_s=NOW + 3600))]  # fmt: skip
    # b, on, is free: job 1 starts there in its turn; it waits for no wake
    assert _plan_waits(sizer, alloc, planned, NOW) == {"a": set()}
    alloc.hold(("job", 9), "b", [0, 1])  # b busy: job 1 waits for a
    assert _plan_waits(sizer, alloc, planned, NOW) == {"a": {1}}


@pytest.mark.parametrize("name", ["GPUs", "power"])
def test_a_server_named_like_another_reason_is_still_a_wake(name):
    from orchestrator.daemon.ops.views import wait_reason

    note = f"due; waiting for {name} to wake: woken at 19:29:55 UTC"
    assert wait_reason(NS(state="queued", plan_note=note, planned_start=None), []) == "wake"


def test_where_the_daemon_plans_the_wake_note_is_the_plan_note(tmp_path):
    """``note_plans`` writes the wake note for a job waiting for a server (not its own
    ``due; waiting for GPUs``), so the two writers agree and nothing flaps."""
    from orchestrator.daemon.guard import note_plans
    from orchestrator.planning.policies.base import Decision
    from orchestrator.queue.models import Job

    db = _levers(tmp_path)[3]
    with db.read() as session:
        jobs = {j: session.get(Job, j) for j in (1, 2)}
    views = [NS(id=1), NS(id=2)]
    scheduler = NS(blocked=lambda: views[0], planned=lambda: [(v, Decision(NOW)) for v in views])
    planner = NS(feed=None, ahead=[], after={}, mode="plan", mode_reason=None,
                 policy=NS(name="fifo"))  # fmt: skip
    wake = "due; waiting for a to wake: woken at 19:29:55 UTC"
    now = datetime.fromtimestamp(NOW, UTC)
    note_plans(db, planner, scheduler, jobs, now, None, None, {1: wake})
    assert _notes(db)[1] == wake and _notes(db)[2] == "due now"


def test_a_failing_store_or_server_leaves_the_notes_and_the_pass_goes_on(tmp_path, caplog):
    """Notes are words no job waits on: a failure reading the servers or writing the notes
    is logged once and swallowed, so the daemon's pass (launches, wakes) goes on."""
    levers, sizer, _alloc, db = _levers(tmp_path)
    a = sizer.nodes["a"]
    a.state, a.since_s, a.waiters = "waking", NOW - 5, {("job", 1)}

    class Broken:
        def write(self, *_a):
            raise RuntimeError("database is locked")

    good, levers._notes = levers._notes, Broken()
    for _ in range(3):
        levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db)[1] is None and a.waiters == {("job", 1)}
    assert sum("database is locked" in r.getMessage() for r in caplog.records) == 1
    a.since_s = "not a time"  # a broken server record: no note, no raise
    assert levers.wake_notes(NOW) == {}
    levers._notes, a.since_s = good, NOW - 5  # it works again: the note is written
    levers.write_wake_notes(levers.wake_notes(NOW))
    assert _notes(db)[1] == "due; waiting for a to wake: woken at 19:29:55 UTC"
