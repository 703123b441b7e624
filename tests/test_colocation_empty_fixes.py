"""Moves that empty a server on the live daemon, as the reviews found them wanting: the
server that receives a job counts (it may stay on longer), a move never outlasts its
grace (nor after a daemon restart), one basis for the energy (no PUE on one side only),
no more checkpoints once one is not delivered, no server right-sizing will not power off,
and the setting's words whatever their case."""

from __future__ import annotations

import signal
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlmodel import select

from orchestrator.daemon.energy.idle import IdleMeter
from orchestrator.daemon.energy.levers import Levers
from orchestrator.daemon.energy.rightsizing import Power, RightSizer
from orchestrator.daemon.guard import Suspender
from orchestrator.queue.models import Attempt, Gpu, Job, Node
from orchestrator.settings import DaemonSettings
from tests.test_colocation_empty_live import NOW, _add, _mover, _node, _step
from tests.test_colocation_empty_live import db as db  # the fixture


# -- A: the server that receives a job ------------------------------------------------------
def test_a_move_next_to_a_host_that_ends_soon_only_swaps_which_server_stays_on(db):
    _add(db, "a", 0, interruptible=False, duration_s=3600.0 + 300.0)  # ends in 5 min
    b = _add(db, "b", 0, duration_s=3600.0 + 5 * 3600.0)  # 5 h left
    assert _step(db, emptiable=("b",)) == [b], "a is never powered off: b's idle draw is saved"
    # a may be powered off in 5 min; with b's job it stays on 5 h more: nothing saved
    assert _step(db, emptiable=("a", "b")) == []


def test_the_cost_to_the_receiving_server_is_its_idle_draw_while_kept_on_longer(db):
    from orchestrator.daemon.energy.emptying import _KeptOn

    _add(db, "a", 0, interruptible=False, duration_s=3600.0 + 300.0)
    _add(db, "b", 0, duration_s=3600.0 + 5 * 3600.0)
    mover, _ = _mover(db, emptiable=("a", "b"), idle_w=300.0)
    nodes = {n.name: n for n in mover.sharing.nodes}
    alone = mover.sharing._alone(nodes)
    (att, job), now_s = next(r for r in alone if r[0].node == "b"), NOW.timestamp()
    move = mover.best_host(att, job, alone, nodes, now_s, set(), {}, set(), {"b"})
    kept = _KeptOn(mover, nodes, now_s, {"a": 1})
    speed_x, speed_h = move.speeds
    both_s = 300.0 / speed_h  # the host, slowed, ends; the moved job goes on alone
    mover_end = both_s + (5 * 3600.0 + 300.0 - speed_x * both_s)
    assert kept(move) == pytest.approx(150.0 * (mover_end - 300.0))
    mover.emptiable = lambda: {"b"}
    assert _KeptOn(mover, nodes, now_s, {"a": 1})(move) == 0.0, "a is not right-sized"


# -- B: a move's grace ----------------------------------------------------------------------
def test_a_job_whose_checkpoint_outlasts_the_grace_cap_never_moves(db):
    _add(db, "a", 0, interruptible=False, duration_s=36 * 3600.0)
    b = _add(db, "b", 0, duration_s=36 * 3600.0, checkpoint_s=3600.0, ran_s=3 * 3600.0)
    assert _step(db) == [], "a 1 h checkpoint with a 30 min grace: killed, failed"
    with db.write() as session:  # the same job, with a 20 min checkpoint
        row = session.get(Job, b)
        row.checkpoint_s = 1200.0
        session.add(row)
    assert _step(db) == [b]


class _Signals:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []

    def signal(self, handle, sig) -> bool:
        self.sent.append((handle.attempt_id, signal.Signals(sig).name))
        return True


def _told_to_checkpoint(db, checkpoint_s: float | None, moved: bool = True) -> int:
    """A running attempt a move (or, ``moved`` False, the deadline guard) told to
    checkpoint at NOW, by a daemon since restarted."""
    job = _add(db, "b", 0, checkpoint_s=checkpoint_s)
    with db.write() as session:
        if moved:
            row = session.get(Job, job)
            row.reason = "moved to share GPU 0 on a with job 1: SIGTERM to checkpoint"
            session.add(row)
        att = session.exec(select(Attempt)
                           .where(Attempt.job_id == job)).one()  # fmt: skip
        att.handle = {"attempt_id": att.id, "run_dir": "", "data": {}}
        att.suspend_sent_at = NOW
        session.add(att)
        return att.id


def test_after_a_restart_mid_checkpoint_the_job_has_its_checkpoints_cost_before_sigkill(db):
    att = _told_to_checkpoint(db, 300.0)
    signals = _Signals()
    fresh = Suspender(db, signals, 10.0)  # the daemon restarted: no grace in memory
    fresh.suspend_due(NOW + timedelta(seconds=30))
    fresh.suspend_due(NOW + timedelta(seconds=305))
    assert signals.sent == [], "30 s, then 305 s into a 300 s checkpoint (+10 s grace)"
    fresh.suspend_due(NOW + timedelta(seconds=311))
    assert signals.sent == [(att, "SIGKILL")]


def test_after_a_restart_a_job_without_its_own_cost_has_the_labs(db):
    att = _told_to_checkpoint(db, None)
    signals = _Signals()
    fresh = Suspender(db, signals, 10.0, checkpoint_s=120.0)
    fresh.suspend_due(NOW + timedelta(seconds=125))
    assert signals.sent == []
    fresh.suspend_due(NOW + timedelta(seconds=131))
    assert signals.sent == [(att, "SIGKILL")]


def test_after_a_restart_a_job_the_guard_told_to_checkpoint_keeps_the_labs_grace(db):
    """Review: after a restart every job told to checkpoint got a move's long grace, so a
    job whose owner set a 1-day checkpoint cost and ignores SIGTERM kept another user's
    deadline job waiting 30 min. Only a moved job (its reason says so) gets it."""
    att = _told_to_checkpoint(db, 86400.0, moved=False)
    signals = _Signals()
    fresh = Suspender(db, signals, 10.0)
    fresh.suspend_due(NOW + timedelta(seconds=11))
    assert signals.sent == [(att, "SIGKILL")]


def test_a_sigterm_this_daemon_sent_keeps_its_grace(db):
    """Not a restart: a planned piece's SIGTERM this daemon sent is killed after
    cancel_grace_s, as before."""
    job = _add(db, "b", 0, checkpoint_s=300.0)
    with db.write() as session:
        att = session.exec(select(Attempt)
                           .where(Attempt.job_id == job)).one()  # fmt: skip
        att.handle = {"attempt_id": att.id, "run_dir": "", "data": {}}
        att.planned_until = NOW
        session.add(att)
    signals = _Signals()
    guard = Suspender(db, signals, 10.0)
    guard.suspend_due(NOW)
    guard.suspend_due(NOW + timedelta(seconds=11))
    assert [s for _, s in signals.sent] == ["SIGTERM", "SIGKILL"]


# -- C: one basis, and the checkpoints' time ------------------------------------------------
@pytest.mark.parametrize("pue", [1.0, 3.0])
def test_the_idle_draw_saved_is_counted_as_the_gains_are_without_pue(db, pue):
    # 20 min left each, a 10 min checkpoint: with the idle draw at PUE 1 it does not pay
    _add(db, "a", 0, interruptible=False, duration_s=4800.0)
    _add(db, "b", 0, duration_s=4800.0, checkpoint_s=600.0)
    meter = IdleMeter(db, {"a": "ssh", "b": "ssh"}, {}, pue)  # the real meter
    levers = Levers(None, meter)
    assert levers.it_idle_w("b", 2, 1) == pytest.approx(meter.draw_w("b", 2, 1) / pue)
    mover, told = _mover(db)
    mover.idle_w = levers.it_idle_w  # as the daemon wires it
    mover.step(NOW.timestamp())
    assert told == [], "the same answer at any PUE"


def test_the_server_stays_on_while_its_jobs_checkpoint(db):
    # 20 min left, a 5 min checkpoint: the pair loses 26.6 kJ; 25 W of idle draw saved
    # for 20 min would pay (30 kJ), for the 15 min after the checkpoint it does not
    _add(db, "a", 0, interruptible=False, duration_s=4800.0)
    b = _add(db, "b", 0, duration_s=4800.0)
    assert _step(db, idle_w=50.0) == []
    assert _step(db, idle_w=80.0) == [b], "36 kJ over 15 min: it pays"


# -- D: one SIGTERM not delivered -----------------------------------------------------------
def test_no_more_checkpoints_once_one_of_a_servers_moves_is_not_delivered(db):
    for gpu in range(3):
        _add(db, "a", gpu, interruptible=False)
    moved = [_add(db, "b", gpu) for gpu in range(3)]
    nodes = [_node("a", gpus=3), _node("b", gpus=3)]
    mover, _ = _mover(db, nodes=nodes)
    calls: list[int] = []
    mover.checkpoint = lambda att, now: calls.append(att.job_id) or len(calls) != 2
    first = mover.step(NOW.timestamp())
    assert len(calls) == 2, "the second fails: the third is never told"
    assert mover.moves == 1 and list(mover.sharing.booked) == [first.job.id] == calls[:1]
    assert set(calls) <= set(moved)


# -- E: servers right-sizing will not power off ---------------------------------------------
def _levers(**power) -> Levers:
    cfg = SimpleNamespace(idle_off_after=power.pop("idle_off_after", "10m"))
    return Levers(RightSizer(None, {"b": Power(cfg, **power)}, probe=lambda n: None), None)


def test_emptiable_is_what_right_sizing_may_power_off():
    assert _levers().emptiable() == {"b"}
    assert _levers(error="power_off: not idle: alice is logged in").emptiable() == set()
    assert _levers(error="power_off: still answers 5m after power_off").emptiable() == set()
    assert _levers(state="off").emptiable() == set()
    assert _levers(busy=True).emptiable() == set(), "a power command under way"
    assert _levers(idle_off_after=None).emptiable() == set()
    assert Levers(None, None).emptiable() == set(), "no right-sizing"


def test_a_gpu_in_use_that_no_attempt_holds_keeps_the_server_on(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    with db.write() as session:
        session.add(Node(name="b", executor="ssh", gpus=2, gpu_source="config", updated_at=NOW))
        session.flush()
        for index in (0, 1):  # b's job on GPU 0; GPU 1 idle
            session.add(Gpu(node="b", index=index, uuid=f"u{index}", model="V100",
                            memory_used_mb=9000 if index == 0 else 0,
                            utilization_pct=90.0 if index == 0 else 0.0))  # fmt: skip
    assert _step(db) == [b]
    with db.write() as session:
        gpu = session.get(Gpu, ("b", 1))
        gpu.memory_used_mb, gpu.utilization_pct = 4000, 50.0  # someone else's process
        session.add(gpu)
    assert _step(db) == []


# -- F, G: the setting ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "taken"),
    [("Empty-Servers", "empty-servers"), (" WAITING-JOBS ", "waiting-jobs"),
     ("empty-servers", "empty-servers"), ("ON", True), (" no ", False), (True, True)],
)  # fmt: skip
def test_the_moves_words_are_taken_whatever_their_case(value, taken):
    assert DaemonSettings(moves=value).moves == taken


@pytest.mark.parametrize("value", ["both", "empty", "empty servers", "", 1, None])
def test_other_moves_values_are_refused(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match='moves is true, false, "empty-servers"'):
        DaemonSettings(moves=value)


def test_each_moves_value_makes_its_moves():
    from orchestrator.settings import move_kinds  # as the daemon maps them (``service``)

    assert move_kinds(True) == {"waiting_jobs": True, "empty_servers": True}
    assert move_kinds("waiting-jobs") == {"waiting_jobs": True, "empty_servers": False}
    assert move_kinds("empty-servers") == {"waiting_jobs": False, "empty_servers": True}
    assert move_kinds(False) == {"waiting_jobs": False, "empty_servers": False}


@pytest.mark.backends("sqlite")  # the daemon's wiring, not the store's backend
@pytest.mark.parametrize(
    ("value", "flags"),
    [("waiting-jobs", (True, False)), ("Empty-Servers", (False, True)), ("true", (True, True)),
     ("false", None)],
)  # fmt: skip
def test_the_daemon_wires_each_moves_value(tmp_path, db_url, value, flags):
    from orchestrator.daemon.service import Daemon
    from orchestrator.queue.db import Database
    from orchestrator.settings import Settings

    box = {"name": "box", "executor": "local", "fake_gpus": 2, "share": "time-slice",
           "gpu_model": "NVIDIA A100-SXM4-80GB"}  # fmt: skip
    settings = Settings(home=tmp_path / "home", nodes=[box],
                        daemon={"policy": "fifo", "grid": ["synthetic:days=2"], "moves": value,
                                "pue": 2.0, "checkpoint_cost": "4m"})  # fmt: skip
    db = Database(db_url)
    db.ensure_schema()
    daemon = Daemon(settings=settings, db=db)
    assert daemon.suspender.checkpoint_s == 240.0, "a restart mid-checkpoint: the lab's cost"
    if flags is None:
        assert daemon.mover is None
        return
    mover = daemon.mover
    assert (mover.waiting_jobs, mover.empty_servers) == flags
    facility = daemon.levers.idle.draw_w("box", 2, 1)
    assert facility > 0 and mover.idle_w("box", 2, 1) == pytest.approx(facility / 2.0), "IT"


def test_a_part_of_a_job_across_servers_keeps_the_server_on(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    across = _add(db, "c", 0, share=False)
    nodes = [_node("a"), _node("b"), _node("c")]
    assert _step(db, nodes=nodes) == [b]
    with db.write() as session:
        att = session.exec(select(Attempt).where(Attempt.job_id == across)).one()
        att.parts = [{"node": "c", "gpu_ids": [0]}, {"node": "b", "gpu_ids": [1]}]
        session.add(att)
    assert _step(db, nodes=nodes) == []
