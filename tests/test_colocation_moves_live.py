"""Co-location moves on the live daemon (``daemon.energy.moves``): a running ``--share
--interruptible`` job alone on its GPU is checkpointed and restarts next to another such
job alone when ``interference.move_gain_j`` says it pays; the rules it never breaks, each
beside the same case that does move."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from orchestrator.daemon.energy.moves import Mover, _work_left
from orchestrator.daemon.energy.sharing import Booking, Sharing
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.queue.models import Attempt, Job
from tests.conftest import E2E

POWER_W = 200.0  # each fake GPU's draw
NODE = '[[nodes]]\nname = "box"\nexecutor = "local"\nfake_gpus = 2\nshare = "time-slice"\n'
FIRST, SECOND = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"  # no slowdown
JOB = """import os, signal, sys, time
with open(sys.argv[1], "a") as out:
    out.write(os.environ.get("CUDA_VISIBLE_DEVICES", "") + "\\n")
if sys.argv[3] == "checkpoints":  # its checkpoint is instant
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(float(sys.argv[2]))
"""


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _live(cli, tmp_path, move_after: str, seconds: float = 2.5, first="checkpoints", moves=True):
    cli.home.joinpath("gridshift.toml").write_text(NODE)
    cli.env.update({"GRIDSHIFT_FAKE_GPU_POWER_W": str(POWER_W),
                    "GRIDSHIFT_DAEMON__POWER_SAMPLE": "0.2s",
                    "GRIDSHIFT_DAEMON__MOVE_AFTER": move_after,
                    "GRIDSHIFT_DAEMON__MOVES": str(moves).lower()})  # fmt: skip
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ids = []
    # the second (the host) runs a second longer: a restart on a loaded machine finds it
    for name, on_term, run_s in ((FIRST, first, seconds), (SECOND, "checkpoints", seconds + 1)):
        out = tmp_path / f"{name.split()[-1].rstrip(')')}.env"
        ids.append(cli.submit(
            "--name", name, "--share", "--interruptible", "--checkpoint-cost", "0.2s",
            "--duration", "60s", "--", sys.executable, str(script), str(out), str(run_s), on_term,
        ))  # fmt: skip
    # a job that may not share waits for a GPU: what a move frees one for
    ids.append(cli.submit("--name", "waiting", "--", sys.executable, "-c", "pass"))
    return ids


@E2E
@pytest.mark.backends("sqlite")  # the pass's decisions, not the store's
def test_a_job_alone_moves_next_to_another_and_both_are_accounted(cli, tmp_path):
    a, b, c = _live(cli, tmp_path, move_after="0.3s")  # may move 0.7 s after its start
    cli.run_until_idle(timeout=60)
    ja, jb = cli.json("show", str(a)), cli.json("show", str(b))
    assert ja["state"] == jb["state"] == "completed"
    (first, again), (host,) = ja["runs"], jb["runs"]
    assert first["gpu_ids"] != host["gpu_ids"], "each started alone on its own GPU"
    assert again["gpu_ids"] == host["gpu_ids"] and again["node"] == host["node"] == "box"
    assert (tmp_path / "16.env").read_text().split() == [
        str(g) for g in (*first["gpu_ids"], *host["gpu_ids"])
    ]
    assert _ts(again["started_at"]) < _ts(host["finished_at"]), "it restarted next to it"
    (freed,) = cli.json("show", str(c))["runs"]  # the waiting job got the GPU it freed
    assert freed["gpu_ids"] == first["gpu_ids"] and _ts(freed["started_at"]) < _ts(
        host["finished_at"]
    )
    began = next(_ts(e["at"]) for e in ja["events"] if e["to"] == "running")  # as launched
    assert began + 0.7 <= _ts(first["finished_at"]), "not before 0.7 s"
    why = [e.get("reason") or "" for e in ja["events"]]
    note = f"moved to share GPU {host['gpu_ids'][0]} on box with job {b}"
    assert any(w.startswith(note) and "requeued" in w for w in why), why
    # every run charged: the two GPUs' energy, never the shared one twice
    runs = [first, again, host]
    assert all(r["energy_kwh"] > 0 and r["energy_modelled"] is False for r in runs)
    alone_s = _ts(first["finished_at"]) - _ts(first["started_at"])
    shared_s = max(_ts(r["finished_at"]) for r in (again, host)) - _ts(host["started_at"])
    total_j = sum(r["energy_kwh"] for r in runs) * 3.6e6
    assert total_j == pytest.approx(POWER_W * (alone_s + shared_s), rel=0.1)


@E2E
@pytest.mark.backends("sqlite")
def test_no_move_unless_the_lab_turns_moves_on(cli, tmp_path):
    a, b, _ = _live(cli, tmp_path, move_after="0.3s", seconds=1.5, moves=False)
    cli.run_until_idle(timeout=60)
    (ra,), (rb,) = cli.json("show", str(a))["runs"], cli.json("show", str(b))["runs"]
    assert ra["gpu_ids"] != rb["gpu_ids"]


@E2E
@pytest.mark.backends("sqlite")
def test_a_job_just_started_does_not_move(cli, tmp_path):
    a, b, _ = _live(cli, tmp_path, move_after="10m", seconds=1.0)  # the default
    cli.run_until_idle(timeout=60)
    (ra,), (rb,) = cli.json("show", str(a))["runs"], cli.json("show", str(b))["runs"]
    assert ra["gpu_ids"] != rb["gpu_ids"]


@E2E
@pytest.mark.backends("sqlite")
def test_a_moved_job_that_ignores_its_sigterm_is_killed_after_the_grace(cli, tmp_path):
    cli.env["GRIDSHIFT_CANCEL_GRACE_S"] = "1"
    a, b, _ = _live(cli, tmp_path, move_after="0.3s", seconds=4.0, first="ignores")
    cli.run_until_idle(timeout=60)  # no planner: the grace is kept all the same
    ja, jb = cli.json("show", str(a)), cli.json("show", str(b))
    assert ja["state"] == "failed" and "after SIGTERM to suspend it" in ja["reason"]
    assert jb["state"] == "completed" and len(jb["runs"]) == 1
    (ra,) = ja["runs"]
    # its grace: its checkpoint's cost (0.2 s) on top of the lab's (1 s)
    assert _ts(ra["finished_at"]) - _ts(ra["started_at"]) < 3.9, "killed before its end"
    why = [e.get("reason") or "" for e in ja["events"]]
    assert any(w.startswith("moved to share GPU") for w in why), "its history says it moved"


def test_a_moved_job_restarts_at_once_whatever_the_plan():
    from orchestrator.daemon.sqlqueue import SqlQueue
    from orchestrator.planning.policies.base import Decision, QueuedJob
    from orchestrator.planning.policies.baselines import Fifo
    from orchestrator.planning.scheduler import Scheduler

    for booked, start in (({}, 3600.0), ({1: Booking("box", 1, 12, 2, 11)}, 0.0)):
        queue = SqlQueue.__new__(SqlQueue)
        queue.resize_to, queue.resize_from, queue.eligible = {}, {}, {1: object()}
        queue.dispatcher = SimpleNamespace(sharing=SimpleNamespace(booked=booked))
        scheduler = Scheduler(Fifo())
        scheduler.add_planned(QueuedJob(id=1, gpus=1, submitted_s=0.0), Decision(3600.0))
        queue._restart_resized(scheduler, set(), 0.0)
        assert scheduler.decision_of(1).start_s == start


# -- the rules, on the decision alone ------------------------------------------------------
NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)


def _node(name="box", users="same", executor="local", share="time-slice"):
    config = SimpleNamespace(share=share, share_users=users)
    return SimpleNamespace(name=name, executor=executor, config=config, gpu_count=2,
                           model_of=lambda gpus: "Tesla V100-SXM2")  # fmt: skip


def _row(i: int, gpu: int, node="box", ran_s=3600.0, **job):
    fields = {"name": "LM", "state": "running", "user": "u", "uid": 1000, "command": ["x"],
              "workdir": "/", "gpus_min": 1, "gpus_max": 1, "duration_s": 7200.0,
              "interruptible": True, "share": True, "submitted_at": NOW} | job  # fmt: skip
    att = Attempt(id=10 + i, job_id=i, number=1, state="running", node=node, gpu_ids=[gpu],
                  run_dir="", started_at=NOW - timedelta(seconds=ran_s))  # fmt: skip
    return att, Job(id=i, **fields)


def _mover(rows, nodes=None, down=(), checkpoint_s=300.0):
    class Stub(Sharing):
        def _alone(self, nodes):  # the store's query: running alone on sharing nodes
            return [(att, job) for att, job in rows if att.node in nodes]

        def earlier_s(self, atts):  # each its first attempt
            return {}

    class Bare(Mover):
        def _free(self, nodes):
            return {n: 0 for n in nodes}

    sharing = Stub(db=None, nodes=nodes or [_node()])
    mover = Bare(sharing, lambda att, now: True, checkpoint_s, 600.0, lambda: set(down))
    return lambda: mover.pick(NOW.timestamp()), mover


def _moved(rows, **kw):
    move = _mover(rows, **kw)[0]()
    return None if move is None else (move.job.id, move.host.id)


def test_it_moves_where_the_pair_saves_more_than_twice_the_checkpoint():
    assert _moved([_row(1, 0), _row(2, 1)]) == (1, 2)


def test_it_never_moves_while_no_job_waits_for_gpus():
    _, mover = _mover([_row(1, 0), _row(2, 1)])
    mover.waiting = lambda: None
    assert mover.step(NOW.timestamp()) is None and mover.moves == 0
    # the saving is the model's (LM next to LM: 2/3 each): a short overlap does not pay
    assert _moved([_row(1, 0), _row(2, 1, duration_s=3700.0)]) is None


def test_it_never_moves_a_job_that_may_not_be_suspended():
    assert _moved([_row(1, 0, interruptible=False), _row(2, 1)]) == (2, 1)
    assert _moved([_row(1, 0, interruptible=False), _row(2, 1, interruptible=False)]) is None


def test_it_never_joins_another_users_job_unless_the_node_says_any():
    rows = [_row(1, 0), _row(2, 1, uid=1001)]
    assert _moved(rows) is None
    assert _moved(rows, nodes=[_node(users="any")]) == (1, 2)


def test_it_never_moves_a_job_just_started():
    # 2 x its checkpoint (5 min) + move_after (10 min) = 20 min
    assert _moved([_row(1, 0, ran_s=1190.0), _row(2, 1, ran_s=1190.0)]) is None
    assert _moved([_row(1, 0, ran_s=1210.0), _row(2, 1, ran_s=1190.0)]) == (1, 2)
    own = [_row(1, 0, ran_s=700.0, checkpoint_s=10.0), _row(2, 1, ran_s=700.0)]
    assert _moved(own) == (1, 2)  # its own --checkpoint-cost: 20 s + 10 min


def test_it_never_moves_where_the_pairs_speed_would_break_a_deadline():
    # 2 h of work, 1 h done: 1 h left at 2/3 speed is 90 min, 97.5 min with its restart
    tight, loose = NOW + timedelta(minutes=92), NOW + timedelta(minutes=100)
    assert _moved([_row(1, 0, deadline=tight), _row(2, 1)]) == (2, 1)  # the host keeps it
    assert _moved([_row(1, 0, deadline=tight), _row(2, 1, interruptible=False)]) is None
    assert _moved([_row(1, 0, deadline=loose), _row(2, 1, interruptible=False)]) == (1, 2)
    host = NOW + timedelta(minutes=85)  # 60 min alone, 90 min paired
    assert _moved([_row(1, 0), _row(2, 1, deadline=host, interruptible=False)]) is None
    assert _moved([_row(1, 0), _row(2, 1, deadline=tight, interruptible=False)]) == (1, 2)


def test_it_never_moves_on_slurm_a_server_down_or_next_to_a_booked_host():
    rows = [_row(1, 0), _row(2, 0, node="other")]
    nodes = [_node(), _node("other")]
    assert _moved(rows, nodes=nodes) == (1, 2)
    assert _moved(rows, nodes=nodes, down={"other"}) is None  # either one's server
    assert _moved(rows, nodes=nodes, down={"box"}) is None
    assert _moved(rows, nodes=[_node(), _node("other", executor="slurm")]) is None
    choose, mover = _mover([_row(1, 0), _row(2, 1), _row(3, 0, node="other")], nodes=nodes)
    mover.sharing.booked[9] = Booking("box", 1, 12, 2, 19)  # job 9 restarts next to job 2
    assert (choose().job.id, choose().host.id) == (1, 3)


def test_its_own_progress_reports_never_make_a_move_look_better():
    att, job = _row(1, 0)  # 7200 s of work, ran 3600 s
    assert _work_left(job, att, NOW.timestamp()) == pytest.approx(3600.0)
    att.progress_done, att.progress_total = 0.0, 1.0  # says nothing is done
    assert _work_left(job, att, NOW.timestamp()) == pytest.approx(3600.0)
    att.progress_done = 0.75  # says more is done: believed (only it is slowed)
    assert _work_left(job, att, NOW.timestamp()) == pytest.approx(1800.0)


def test_a_booked_gpu_is_kept_for_the_moved_job():
    host_att, host = _row(2, 1)

    class Stub(Sharing):
        def _alone(self, nodes):
            return [(host_att, host)]

        def earlier_s(self, atts):
            return {}

    sharing = Stub(db=None, nodes=[_node()])
    sharing.booked[1] = Booking("box", 1, host_att.id, 2, 11)
    newcomer = SimpleNamespace(id=5, name=FIRST, uid=1000, share=True, attempts=0,
                               deadline=None, duration_s=None, gpu_type=None)  # fmt: skip
    assert sharing.place(newcomer, 1, 0.0) is None, "nobody else joins it meanwhile"
    moved = SimpleNamespace(id=1, attempts=1)
    assert sharing.place(moved, 1, 0.0) == ("box", [1]) and not sharing.booked
    sharing.booked[1] = Booking("box", 1, host_att.id, 2, 11)
    assert sharing.place(moved, 1, 1.0, down={"box"}) is None, "as usual: it does not answer"
    assert sharing.place(newcomer, 1, 1.0) == ("box", [1]), "spent: the GPU is free to join"


@pytest.fixture
def db(request, db_backend, tmp_path):
    from orchestrator.queue.db import Database
    from tests.conftest import new_db_url

    database = Database(new_db_url(request, db_backend, tmp_path / "moves.db"))
    database.ensure_schema()
    return database


def test_the_store_a_move_is_read_from_and_written_to(db):
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState
    from orchestrator.queue.states import JobState

    started = NOW - timedelta(hours=1)
    with db.write() as session:
        for gpu in (0, 1):
            _, job = _row(0, gpu)
            job.id = None
            session.add(job)
            session.flush()
            att = attempts.begin(session, at=started, job_id=job.id, number=1, node="box",
                                 gpu_ids=[gpu], run_dir="")  # fmt: skip
            attempts.move(session, att, AttemptState.RUNNING, at=started, started_at=started)
    told = []
    sharing = Sharing(db, nodes=[_node()])
    mover = Mover(sharing, lambda att, now: told.append(att.job_id) or True, 300.0, 600.0)
    mover.waiting = lambda: QueuedJob(id=9, gpus=1, submitted_s=0.0)  # a job waits for a GPU
    move = mover.step(NOW.timestamp())
    assert (move.job.id, move.host.id, told) == (1, 2, [1]) and mover.moves == 1
    assert sharing.booked[1].gpu == 1 and sharing.notes[1].startswith("moved to share GPU 1")
    with db.write() as session:
        job = session.get(Job, 1)
        assert job.reason == "moved to share GPU 1 on box with job 2: SIGTERM to checkpoint"
        att = session.get(Attempt, move.att.id)
        att.suspend_sent_at = NOW  # as the suspender stamps it
        session.add(att)
    assert mover.step(NOW.timestamp()) is None, "a job leaving its GPU neither moves nor hosts"
    newcomer = SimpleNamespace(id=5, name=FIRST, uid=1000, share=True, attempts=0,
                               deadline=None, duration_s=None, gpu_type=None)  # fmt: skip
    assert sharing.place(newcomer, 1, 0.0) is None, "job 2's GPU is kept for job 1"
    with db.write() as session:
        job = session.get(Job, 1)
        job.state = JobState.FAILED.value  # it did not checkpoint: killed after its grace
        session.add(job)
    mover.step(NOW.timestamp())
    assert not sharing.booked and not sharing.notes, "a booking for a job that ended is let go"
    assert sharing.place(newcomer, 1, 1.0) == ("box", [1])


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("value", ["0s", "soon", "-5m"])
def test_a_bad_move_after_is_one_line(cli, value):
    cli.env["GRIDSHIFT_DAEMON__MOVE_AFTER"] = value
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and "move_after" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_it_moves_only_a_job_whose_gpu_lets_the_waiting_job_start():
    from types import SimpleNamespace as NS

    rows = [_row(1, 0), _row(2, 1)]
    _, mover = _mover(rows)
    pick = mover.pick
    assert pick(NOW.timestamp(), NS(gpus=1, min_gpus=1, gpu_type=None)) is not None
    assert pick(NOW.timestamp(), NS(gpus=2, min_gpus=2, gpu_type=None)) is None  # frees 1
    assert pick(NOW.timestamp(), NS(gpus=1, min_gpus=1, gpu_type="a100")) is None  # typed
