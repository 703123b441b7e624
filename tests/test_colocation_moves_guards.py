"""Co-location moves (``daemon.energy.moves``) on a real store: what a move waits for, the
work left it counts, the hosts it never picks, the room it frees, and the daemon around it
(each found by a review, each beside the case that does move)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlmodel import select

from orchestrator.daemon.energy.moves import Mover
from orchestrator.daemon.energy.sharing import Booking, Sharing
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.models import Attempt, Job

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)
HEAD = QueuedJob(id=99, gpus=1, submitted_s=0.0)  # the job waiting for a GPU


def _node(name="box", gpus=2, executor="local", users="same"):
    config = SimpleNamespace(share="time-slice", share_users=users)
    return SimpleNamespace(name=name, executor=executor, config=config, gpu_count=gpus,
                           model_of=lambda g: "Tesla V100-SXM2")  # fmt: skip


@pytest.fixture
def db(request, db_backend, tmp_path):
    from orchestrator.queue.db import Database
    from tests.conftest import new_db_url

    database = Database(new_db_url(request, db_backend, tmp_path / "moves.db"))
    database.ensure_schema()
    return database


def _run(db, node, gpus, ran_s=3600.0, job=None, att=None, earlier_s=()):
    """A running job (``earlier_s``: its earlier attempts' run times); its attempt's id."""
    fields = {"name": "LM", "state": "running", "user": "u", "uid": 1000, "command": ["x"],
              "workdir": "/", "gpus_min": len(gpus), "gpus_max": len(gpus),
              "duration_s": 7200.0, "interruptible": True, "share": True,
              "submitted_at": NOW - timedelta(days=1)} | (job or {})  # fmt: skip
    with db.write() as session:
        row = Job(**fields)
        session.add(row)
        session.flush()
        for n, ran in enumerate(earlier_s, start=1):
            t0 = NOW - timedelta(hours=10 - n)
            a = attempts.begin(session, at=t0, job_id=row.id, number=n, node=node,
                               gpu_ids=gpus, run_dir="")  # fmt: skip
            a.started_at, a.finished_at = t0, t0 + timedelta(seconds=ran)
            a.state = AttemptState.EXITED.value
            session.add(a)
        started = NOW - timedelta(seconds=ran_s)
        a = attempts.begin(session, at=started, job_id=row.id, number=len(earlier_s) + 1,
                           node=node, gpu_ids=gpus, run_dir="", **(att or {}))  # fmt: skip
        attempts.move(session, a, AttemptState.RUNNING, at=started, started_at=started)
        return a.id


def _stamp(db, att_id, **fields):
    with db.write() as session:
        row = session.get(Attempt, att_id)
        for name, value in fields.items():
            setattr(row, name, value)
        session.add(row)


def _mover(db, nodes, told=None, head=HEAD, stamp=True):
    def checkpoint(att, now):
        if told is not None:
            told.append(att.job_id)
        if stamp:  # as the suspender stamps it
            _stamp(db, att.id, suspend_sent_at=now)
        return True

    mover = Mover(Sharing(db, nodes=nodes), checkpoint, 300.0, 600.0)
    mover.waiting = lambda: head
    return mover


@pytest.mark.parametrize("stamped", [True, False])
def test_one_waiting_job_gets_one_move_while_the_checkpoint_is_under_way(db, stamped):
    """Its GPU counts as taken until the moved job exits: the head stays blocked, and
    the next passes must not move others for it (stamped or not: the booking holds)."""
    nodes = [_node(n) for n in "abcd"]
    for n in "abcd":
        _run(db, n, [0])
        _run(db, n, [1])
    told = []
    mover = _mover(db, nodes, told, stamp=stamped)
    for i in range(4):
        mover.step(NOW.timestamp() + i)
    assert len(told) == 1, f"one waiting job, several SIGTERMs: {told}"


def test_no_move_while_any_job_checkpoints_for_the_guard(db):
    nodes = [_node("a"), _node("b")]
    _run(db, "a", [0])
    _run(db, "a", [1])
    other = _run(db, "b", [0], job={"interruptible": False})
    _stamp(db, other, suspend_sent_at=NOW)  # the guard told it to checkpoint
    assert _mover(db, nodes).step(NOW.timestamp()) is None
    _stamp(db, other, suspend_sent_at=None)
    assert _mover(db, nodes).step(NOW.timestamp()) is not None


def test_its_work_left_counts_its_earlier_attempts(db):
    """Two pieces of 45 min, then 25 min of this one: 5 min of its 2 h left, not 95 min
    (a move then costs more than it saves); the host's earlier attempts count too."""
    nodes = [_node()]
    _run(db, "box", [0], ran_s=1500.0, earlier_s=(2700.0, 2700.0))
    _run(db, "box", [1], ran_s=1800.0, job={"interruptible": False})
    assert _mover(db, nodes).step(NOW.timestamp()) is None


def test_the_hosts_earlier_attempts_count_toward_its_deadline(db):
    """The host: 2 h of work, 50 min in an earlier attempt and 30 min in this one: 40 min
    left alone, 60 paired, within its deadline in 65 min (not 90 min paired)."""
    _run(db, "box", [0])
    deadline = {"interruptible": False, "deadline": NOW + timedelta(minutes=65)}
    _run(db, "box", [1], ran_s=1800.0, job=deadline, earlier_s=(3000.0,))
    move = _mover(db, [_node()]).step(NOW.timestamp())
    assert move is not None and (move.job.id, move.host.id) == (1, 2)


@pytest.mark.parametrize(
    "leaving",
    [
        {"job": {"cancel_requested_at": NOW}},
        {"att": {"term_sent_at": NOW}},
        {"att": {"planned_until": NOW + timedelta(seconds=60)}},
    ],
    ids=["cancelled", "sigterm", "piece"],
)
def test_a_host_about_to_leave_is_no_host(db, leaving):
    """Neither for a move, nor for the booked restart, nor for a newcomer."""
    nodes = [_node()]
    _run(db, "box", [0])
    host = {"job": {"interruptible": False}, "att": {}}
    for key, fields in leaving.items():
        host[key] = host[key] | fields
    host_att = _run(db, "box", [1], **host)
    mover = _mover(db, nodes)
    assert mover.step(NOW.timestamp()) is None
    sharing = mover.sharing
    assert [job.id for _, job in sharing._alone({"box": nodes[0]})] == [1]
    sharing.booked[1] = Booking("box", 1, host_att, 2, 1)  # booked before it began to leave
    assert sharing.place(SimpleNamespace(id=1, attempts=1), 1, NOW.timestamp()) is None


def test_the_room_a_move_frees_is_the_allocators_answer(db):
    """y's GPU 0 is a part of a job across servers (its attempt is on x): the count of
    y's attempts says a move from y leaves 2 GPUs free there; the allocator says 1."""
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    nodes = [_node(n, executor="ssh") for n in "xyz"]
    alloc = ClusterAllocator(ClusterTopology(tuple(NodeTopology.plain(n, 2) for n in "xyz")))
    alloc.hold(("attempt", 99), "x", [0, 1])
    alloc.hold(("attempt", 99), "y", [0])
    for node, gpu in (("y", 1), ("z", 0), ("z", 1)):
        alloc.hold(("attempt", _run(db, node, [gpu])), node, [gpu])
    before = {key: alloc.allocation(key) for key in alloc.allocations()}
    two = QueuedJob(id=98, gpus=2, submitted_s=0.0)
    mover = _mover(db, nodes, head=two)
    mover.alloc = lambda: alloc
    assert mover.step(NOW.timestamp()) is None, "it would free no room for the 2-GPU job"
    assert {key: alloc.allocation(key) for key in alloc.allocations()} == before, "undone"
    mover.waiting = lambda: HEAD  # one GPU: any move frees one
    assert mover.step(NOW.timestamp()) is not None


def test_a_failing_move_step_is_logged_once_and_the_pass_goes_on(db, caplog):
    nodes = [_node()]
    _run(db, "box", [0])
    _run(db, "box", [1])

    def broken(att, now):
        raise RuntimeError("the store went away")

    mover = _mover(db, nodes)
    mover.checkpoint = broken
    with caplog.at_level("ERROR", logger="orchestrator.daemon.energy.moves"):
        assert mover.step(NOW.timestamp()) is None
        assert mover.step(NOW.timestamp() + 1) is None
    said = [r for r in caplog.records if "the store went away" in r.getMessage()]
    assert len(said) == 1, "logged once"
    assert not mover.sharing.booked and not mover.sharing.notes, "nothing left booked"
    mover.checkpoint = lambda att, now: True
    assert mover.step(NOW.timestamp() + 2) is not None


def test_a_job_that_ignores_its_sigterm_is_killed_on_any_daemon():
    """No planner, no sharing node: a backfilled --interruptible job past its promise got
    SIGTERM to checkpoint (``Suspender.overran``); its SIGKILL after the grace is
    ``suspend_due``'s, which every daemon's pass runs."""
    from orchestrator.daemon.sqlqueue import SqlQueue

    calls = []
    queue = SqlQueue.__new__(SqlQueue)
    queue.planner, queue.dispatcher = None, SimpleNamespace(sharing=None)
    queue.suspender = SimpleNamespace(suspend_due=calls.append)
    queue.suspend_due(NOW.timestamp())
    assert calls == [NOW]


def test_a_moved_jobs_grace_is_its_checkpoints_cost_and_its_history_says_so(db):
    from orchestrator.daemon.guard import Suspender
    from orchestrator.queue.models import Event

    handle = {"attempt_id": 1, "run_dir": "", "data": {}}
    _run(db, "box", [0], job={"checkpoint_s": 600.0}, att={"handle": handle})  # 10 min
    _run(db, "box", [1], job={"interruptible": False})
    executor = SimpleNamespace(signal=lambda handle, sig: sent.append(sig) or True)
    sent = []
    suspender = Suspender(db, executor, grace_s=30.0)
    mover = _mover(db, [_node()])
    mover.checkpoint, mover.grace, mover.grace_s = suspender.checkpoint, suspender.grant, 30.0
    move = mover.step(NOW.timestamp())
    assert move is not None and len(sent) == 1  # its SIGTERM
    with db.read() as session:
        events = session.exec(select(Event).where(Event.job_id == move.job.id)).all()
    assert any((e.reason or "").startswith("moved to share GPU 1") for e in events)
    suspender.suspend_due(NOW + timedelta(minutes=5))  # past the lab's 30 s: not yet
    assert len(sent) == 1, "killed while it checkpoints"
    suspender.suspend_due(NOW + timedelta(minutes=11))  # 10 min + 30 s later
    assert len(sent) == 2


@pytest.mark.parametrize("delivered", [True, False])
def test_a_moves_reason_is_written_before_its_sigterm(db, delivered):
    """Review: written after the signal, a daemon dying in between left the moved job
    only the lab's grace after a restart (``kill_after_s`` reads the reason). Written
    first now; put back when the signal is not delivered."""
    from orchestrator.queue.models import Job

    _run(db, "box", [0])
    _run(db, "box", [1], job={"interruptible": False})
    seen = []

    def checkpoint(att, now):
        with db.read() as session:
            seen.append((att.job_id, session.get(Job, att.job_id).reason))
        return delivered

    mover = _mover(db, [_node()])
    mover.checkpoint = checkpoint
    mover.step(NOW.timestamp())
    assert seen and seen[0][1].startswith("moved to share GPU")
    with db.read() as session:
        now_reason = session.get(Job, seen[0][0]).reason
    assert (now_reason == seen[0][1]) is delivered
