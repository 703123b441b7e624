"""Co-location moves that empty a server on the live daemon (``daemon.moves =
"empty-servers"``, ``daemon.energy.emptying``): while no job waits, the jobs of a server
right-sizing may power off, all alone and movable, are checkpointed and restart next to
jobs alone on other servers when that pays, idle draw included; then the server is
powered off. End to end on a real sshd server (its ``power_off`` records its calls), and
the rules it never breaks on a real store, each beside the same case that does move."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.daemon.energy.moves import Mover
from orchestrator.daemon.energy.sharing import Sharing
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.queue.models import Job
from tests.conftest import E2E
from tests.helpers.waiting import wait_for
from tests.test_colocation_moves_guards import _node as _guards_node
from tests.test_colocation_moves_guards import db as db  # the fixture
from tests.test_colocation_moves_live import FIRST, JOB, SECOND
from tests.test_rightsize_live import _calls, _kill_server, _power_node, write_config

A100 = "NVIDIA A100-SXM4-80GB"  # the test servers' fake nvidia-smi's


# -- end to end ------------------------------------------------------------------------------
@E2E
@pytest.mark.backends("sqlite")
def test_a_server_whose_job_moves_next_to_another_is_powered_off(cli, ssh_servers, tmp_path):
    srv = ssh_servers(gpus=1)
    node_b, calls = _power_node(srv, ssh_servers, tmp_path, share="time-slice")
    node_a = {"name": "box", "executor": "local", "fake_gpus": 1, "gpu_model": A100,
              "share": "time-slice"}  # fmt: skip
    write_config(cli.home, [node_a, node_b], top={"daemon_interval_s": 0.2})
    cli.env.update({"GRIDSHIFT_DAEMON__MOVE_AFTER": "0.3s",  # it may move 0.7 s after start
                    "GRIDSHIFT_DAEMON__DISCOVERY": "1s",  # B seen idle soon after it empties
                    "GRIDSHIFT_DAEMON__MOVES": "empty-servers"})  # fmt: skip
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ids = []  # the host first (placed on box), then the job on B, which may be interrupted
    jobs = ((SECOND, 3.5, ["--priority", "1"]),
            (FIRST, 1.5, ["--interruptible", "--checkpoint-cost", "0.2s"]))  # fmt: skip
    for name, run_s, extra in jobs:
        out = tmp_path / f"{name.split()[-1].rstrip(')')}.env"
        ids.append(cli.submit(
            "--name", name, "--share", *extra, "--duration", "60s",
            "--", sys.executable, str(script), str(out), str(run_s), "checkpoints",
        ))  # fmt: skip
    host, mover = ids
    daemon = cli.daemon()
    try:
        for job in ids:
            done = cli.wait_state(job, {"completed", "failed"}, timeout=30)
            assert done["state"] == "completed", done
        wait_for(lambda: [w for w, _ in _calls(calls)] == ["off"], timeout_s=10,
                 what="server B powered off once emptied")  # fmt: skip
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        _kill_server(srv, node_b)
    jh, jm = cli.json("show", str(host)), cli.json("show", str(mover))
    (on_a,), (first, again) = jh["runs"], jm["runs"]
    assert on_a["node"] == "box" and first["node"] == "gpu1", "each started alone"
    assert again["node"] == "box" and again["gpu_ids"] == on_a["gpu_ids"], "next to the host"
    assert (tmp_path / "16.env").read_text().split() == ["0", "0"], "one GPU each time"
    why = [e.get("reason") or "" for e in jm["events"]]
    note = f"moved to share GPU 0 on box with job {host} to empty server gpu1"
    assert any(w.startswith(note) for w in why), why


# -- the rules, on a real store --------------------------------------------------------------
NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)


def _node(name: str, users: str = "same", gpus: int = 2):
    return _guards_node(name, gpus, "ssh", users)


def _add(db, node: str, gpu: int, ran_s: float = 3600.0, **job) -> int:
    """A running attempt of a new job on ``gpu`` of ``node``; the job's id."""
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState

    started = NOW - timedelta(seconds=ran_s)
    fields = {"name": "LM", "state": "running", "user": "u", "uid": 1000, "command": ["x"],
              "workdir": "/", "gpus_min": 1, "gpus_max": 1, "duration_s": 7200.0,
              "interruptible": True, "share": True, "submitted_at": NOW} | job  # fmt: skip
    with db.write() as session:
        row = Job(**fields)
        session.add(row)
        session.flush()
        att = attempts.begin(session, at=started, job_id=row.id, number=1, node=node,
                             gpu_ids=[gpu], run_dir="")  # fmt: skip
        attempts.move(session, att, AttemptState.RUNNING, at=started, started_at=started)
        return row.id


def _mover(db, nodes=None, moves="empty-servers", emptiable=("b",), idle_w=300.0, waiting=None):
    told: list[int] = []
    mover = Mover(
        Sharing(db, nodes=nodes or [_node("a"), _node("b")]),
        lambda att, now: told.append(att.job_id) or True,
        300.0,
        600.0,
        waiting=lambda: waiting,
        waiting_jobs=moves in (True, "waiting-jobs"),
        empty_servers=moves in (True, "empty-servers"),
        emptiable=lambda: set(emptiable),
        idle_w=lambda name, gpus, busy: idle_w * (gpus - busy) / gpus,
    )
    return mover, told


def _step(db, **kw) -> list[int]:
    mover, told = _mover(db, **kw)
    mover.step(NOW.timestamp())
    return told


def test_the_jobs_of_a_server_move_when_that_empties_it_and_each_gets_its_own_host(db):
    hosts = [_add(db, "a", 0, interruptible=False), _add(db, "a", 1, interruptible=False)]
    b1, b2 = _add(db, "b", 0), _add(db, "b", 1)
    mover, told = _mover(db)
    move = mover.step(NOW.timestamp())
    assert sorted(told) == [b1, b2] and mover.moves == 2, "all of its jobs, in one pass"
    booked = mover.sharing.booked
    assert {booked[b1].host_job, booked[b2].host_job} == set(hosts), "distinct hosts"
    assert move.server == "b"
    with db.read() as session:
        reason = session.get(Job, b1).reason
    gpu, host = booked[b1].gpu, booked[b1].host_job
    assert reason == (
        f"moved to share GPU {gpu} on a with job {host} to empty server b: SIGTERM to checkpoint"
    )
    assert mover.step(NOW.timestamp()) is None, "none while they are in flight"


def test_the_emptiest_server_goes_first_and_one_server_a_pass(db):
    _add(db, "a", 0, interruptible=False)
    _add(db, "a", 1, interruptible=False)
    _add(db, "b", 0)
    _add(db, "b", 1)  # b could be emptied too (two hosts on a), but holds more
    c = _add(db, "c", 0)
    nodes = [_node("a"), _node("b"), _node("c")]
    assert _step(db, nodes=nodes, emptiable=("b", "c")) == [c]


def test_the_idle_draw_saved_makes_a_move_pay_that_the_pair_alone_would_not(db):
    # 20 min left each: LM next to LM (2/3 each) saves less than twice a 5 min checkpoint
    _add(db, "a", 0, interruptible=False, duration_s=4800.0)
    b = _add(db, "b", 0, duration_s=4800.0)
    assert _step(db, idle_w=0.0) == [], "the pair alone does not pay"
    assert _step(db, idle_w=300.0) == [b], "with B's idle GPU's and its own draw, it does"


def test_no_move_to_empty_a_server_unless_the_lab_says_so(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    assert _step(db, moves="waiting-jobs") == [], "only for a job waiting"
    assert _step(db, moves=False) == []
    assert _step(db, moves=True) == [b]
    waits = QueuedJob(id=99, gpus=4, submitted_s=0.0)  # a job waits: the other kind only
    assert _step(db, moves="empty-servers", waiting=waits) == []


def test_no_move_from_a_server_right_sizing_may_not_power_off(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    assert _step(db, emptiable=()) == []
    assert _step(db, emptiable=("b",)) == [b]


def test_a_job_that_may_not_be_interrupted_or_has_a_partner_keeps_its_server_on(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    assert _step(db) == [b]
    _add(db, "b", 1, interruptible=False)  # may not move: b cannot be emptied
    assert _step(db) == []


def test_a_job_in_a_pair_keeps_its_server_on(db):
    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    assert _step(db) == [b]
    _add(db, "b", 1)
    _add(db, "b", 1)  # two on one GPU: a pair never moves
    assert _step(db) == []


def test_a_reservation_or_block_the_pass_holds_there_keeps_the_server_on(db):
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    _add(db, "a", 0, interruptible=False)
    b = _add(db, "b", 0)
    alloc = ClusterAllocator(
        ClusterTopology((NodeTopology.plain("a", 2), NodeTopology.plain("b", 2)))
    )
    mover, told = _mover(db)
    mover.alloc = lambda: alloc
    mover.step(NOW.timestamp())
    assert told == [b]
    alloc.hold(("backfill", 7), "b", [1])  # the pass keeps b's other GPU for a job
    mover, told = _mover(db)
    mover.alloc = lambda: alloc
    assert mover.step(NOW.timestamp()) is None and told == []


def test_another_users_job_is_joined_only_where_the_node_says_any(db):
    _add(db, "a", 0, interruptible=False, uid=1001, user="v")
    b = _add(db, "b", 0)
    assert _step(db) == []
    assert _step(db, nodes=[_node("a", users="any"), _node("b")]) == [b]


def test_no_host_on_the_server_emptied_nor_on_a_server_down(db):
    b1, b2 = _add(db, "b", 0), _add(db, "b", 1)  # alone each: neither hosts the other
    assert _step(db) == []
    _add(db, "a", 0, interruptible=False)
    assert _step(db) == [], "one host for two jobs: b cannot be emptied"
    _add(db, "a", 1, interruptible=False)
    mover, told = _mover(db)
    mover.down = lambda: {"a"}
    assert mover.step(NOW.timestamp()) is None and told == [], "a does not answer"
    assert sorted(_step(db)) == [b1, b2]


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("value", ['"sometimes"', "1", '"empty"', '"empty_servers"'])
def test_a_bad_moves_setting_is_one_line_and_exit_2(cli, value):
    (cli.home / "gridshift.toml").write_text(f"[daemon]\nmoves = {value}\n")
    proc = cli.run("nodes", check=False)
    message = 'moves is true, false, "empty-servers" or "waiting-jobs"'
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    "value", ["empty-servers", "waiting-jobs", "true", "false", " Empty-Servers "]
)
def test_each_moves_setting_is_taken(cli, value):
    cli.env["GRIDSHIFT_DAEMON__MOVES"] = value
    assert cli.run("nodes", check=False).returncode == 0
