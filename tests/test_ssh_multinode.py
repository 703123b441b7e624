"""Jobs across servers, end to end: the real CLI and daemon, two real sshd servers on
127.0.0.1 with fake GPUs (``tests/helpers/sshd.py``), a job wider than either."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from executors import runfiles
from executors.base import LaunchSpec
from tests.conftest import E2E
from tests.helpers.waiting import wait_for
from tests.test_ssh_daemon import _alive, ssh_node, write_config

pytestmark = [pytest.mark.slow, E2E, pytest.mark.backends("sqlite")]

# Each part writes what it was given (and its pid) to OUT.<NODE_RANK>, then sleeps.
RANK = (
    "import json, os, sys, time\n"
    "keys = ['MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'NODE_RANK', 'NPROC_PER_NODE',\n"
    "        'NNODES', 'CUDA_VISIBLE_DEVICES']\n"
    "got = {k: os.environ[k] for k in keys}\n"
    "got['pid'] = os.getpid()\n"
    "path = sys.argv[1] + '.' + os.environ['NODE_RANK']\n"
    "json.dump(got, open(path + '.tmp', 'w')); os.replace(path + '.tmp', path)\n"
    "print('rank', os.environ['NODE_RANK'], flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def _two_servers(cli, ssh_servers, shared_home: bool = False):
    """Two 2-GPU servers; ``shared_home``: one remote_dir for both (an NFS home)."""
    a, b = ssh_servers(gpus=2), ssh_servers(gpus=2)
    home = {"remote_dir": str(a.root / "home")} if shared_home else {}
    write_config(cli.home, [ssh_node(a, ssh_servers, "a"), ssh_node(b, ssh_servers, "b", **home)],
                 top={"daemon_interval_s": 0.2})  # fmt: skip
    return a, b


def _parts(out: Path) -> list[dict]:
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


def test_a_job_wider_than_a_server_runs_on_both_with_one_rendezvous(cli, ssh_servers, tmp_path):
    _two_servers(cli, ssh_servers)
    out = tmp_path / "rank"
    job = cli.submit("--gpus", "4", "--", sys.executable, "-c", RANK, str(out), "1.5")
    cli.run_until_idle(timeout=60)
    shown = cli.json("show", str(job))
    assert shown["state"] == "completed", shown
    zero, one = _parts(out)
    assert zero["MASTER_ADDR"] == one["MASTER_ADDR"] == "127.0.0.1"
    assert zero["MASTER_PORT"] == one["MASTER_PORT"]
    assert (zero["NODE_RANK"], one["NODE_RANK"]) == ("0", "1")
    for part in (zero, one):
        assert (part["WORLD_SIZE"], part["NNODES"], part["NPROC_PER_NODE"]) == ("4", "2", "2")
        assert part["CUDA_VISIBLE_DEVICES"] == "0,1"
    ((parts_json, run_dir, energy_j),) = cli.db_rows(
        f"SELECT parts, run_dir, energy_j FROM attempt WHERE job_id = {job}"
    )
    assert [p["node"] for p in json.loads(parts_json)] == ["a", "b"]
    # the attempt's energy is both parts' (each part's power log, mirrored from its server)
    part_j = []
    for rank in (0, 1):
        samples, _ = runfiles.read_power_log(Path(run_dir, f"part-{rank}", runfiles.POWER), 0)
        part_j.append(samples[-1][1] - samples[0][1] if len(samples) > 1 else 0.0)
    assert all(j > 0 for j in part_j), part_j
    assert energy_j == pytest.approx(sum(part_j), rel=0.05)
    assert shown["energy_modelled"] is False
    assert (shown["node"], shown["gpus"]) == ("a+b", 4)
    assert shown["runs"][0]["parts"] == [{"node": "a", "gpu_ids": [0, 1]},
                                         {"node": "b", "gpu_ids": [0, 1]}]  # fmt: skip
    assert cli.run("logs", str(job)).stdout == "rank 0\nrank 1\n", "each part's log, by rank"


@pytest.mark.parametrize("interruptible", [False, True])
def test_killing_one_part_stops_the_other_and_ends_the_job(
    cli, ssh_servers, tmp_path, interruptible
):
    _two_servers(cli, ssh_servers, shared_home=True)  # each part's run dir its own there
    out = tmp_path / "rank"
    flags = ["--interruptible"] if interruptible else []
    job = cli.submit("--gpus", "4", *flags, "--", sys.executable, "-c", RANK, str(out), "60")
    daemon = cli.daemon()
    try:
        wait_for(lambda: all(Path(f"{out}.{r}").exists() for r in (0, 1)), timeout_s=30,
                 what="both parts started")  # fmt: skip
        zero, one = _parts(out)
        os.kill(one["pid"], signal.SIGKILL)  # rank 1 dies
        wait_for(lambda: not _alive(zero["pid"]), timeout_s=15, what="rank 0 stopped")
        if interruptible:  # resumes from its checkpoint: requeued, as if lost
            states = wait_for(lambda: "lost" in (s := _states(cli, job)) and s, timeout_s=15,
                              what="the job requeued")  # fmt: skip
            assert states[states.index("lost") + 1] == "queued", states
            assert "failed" not in states, states
        else:
            shown = cli.wait_state(job, {"failed"}, timeout=15)
            assert "part 1 on b" in shown["reason"] and "SIGKILL" in shown["reason"], shown
    finally:
        cli.run("cancel", str(job), check=False)
        cli.wait_state(job, {"failed", "cancelled", "completed"}, timeout=20)
        daemon.terminate()
        daemon.wait(timeout=30)


def _states(cli, job: int) -> list[str]:
    return [s for (s,) in cli.db_rows(f"SELECT to_state FROM event WHERE job_id = {job} "
                                      "ORDER BY id")]  # fmt: skip


def test_a_server_gone_mid_launch_leaves_no_part_running(ssh_servers, tmp_path):
    from executors.gang import PartsNotStarted, part_dir
    from executors.local import LocalExecutor
    from executors.router import NodeRouter
    from executors.ssh import SshExecutor
    from executors.sshlink import SshLink
    from orchestrator.nodes.ssh import ssh_target
    from orchestrator.settings import NodeConfig

    a, b = ssh_servers(gpus=2), ssh_servers(gpus=2)
    links = {
        name: SshLink(ssh_target(NodeConfig(**ssh_node(srv, ssh_servers, name))))
        for name, srv in (("a", a), ("b", b))
    }
    out = tmp_path / "rank"

    class GoesAway(NodeRouter):  # b goes away once part 0 runs, before part 1 starts
        def launch(self, spec):
            if spec.node == "b":
                wait_for(lambda: Path(f"{out}.0").exists(), what="part 0 running")
                b.stop()
            return super().launch(spec)

    router = GoesAway(dict.fromkeys(links, SshExecutor(links)), default=LocalExecutor())
    run_dir = str(tmp_path / "run-7")
    env = {
        "PATH": os.environ["PATH"],
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "20007",
        "WORLD_SIZE": "4",
        "NPROC_PER_NODE": "2",
        "NNODES": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    specs = [
        LaunchSpec(7, 7, [sys.executable, "-c", RANK, str(out), "60"], str(tmp_path),
                   {**env, "NODE_RANK": str(rank)}, [0, 1],
                   str(tmp_path / "7.log"), part_dir(run_dir, rank), node=node)
        for rank, node in enumerate(["a", "b"])
    ]  # fmt: skip
    try:
        with pytest.raises(PartsNotStarted) as caught:
            router.launch_parts(specs, run_dir)
        assert caught.value.unreachable and not caught.value.fenced
        zero = _parts_0(out)
        wait_for(lambda: not _alive(zero["pid"]), timeout_s=5, what="part 0 killed")
        assert not router.fence(caught.value.handle), "b cannot be fenced while it is away"
        b.start()
        wait_for(lambda: router.fence(caught.value.handle), timeout_s=15, every_s=0.5,
                 what="fenced once b answers (its link retried)")  # fmt: skip
        claim = Path(b.root, "home", "run", "attempt-7-part-1", "claim")
        assert claim.read_text() == "abandoned", "a monitor arriving late never starts it"
    finally:
        router.close()


def _parts_0(out: Path) -> dict:
    return json.loads(Path(f"{out}.0").read_text())


# Each part appends its pid to OUT.<NODE_RANK>; rank 0's first start runs FIRST_S seconds.
STARTS = (
    "import os, sys, time\n"
    "rank = os.environ['NODE_RANK']; path = sys.argv[1] + '.' + rank\n"
    "first = not os.path.exists(path)\n"
    "open(path, 'a').write(f'{os.getpid()}\\n')\n"
    "time.sleep(float(sys.argv[2]) if first and rank == '0' else 0.5)\n"
)


@pytest.mark.parametrize("every_part_started", [False, True])
def test_a_crash_mid_launch_reattaches_every_part_or_fences_them_all(
    cli, ssh_servers, tmp_path, monkeypatch, every_part_started
):
    from executors.router import NodeRouter
    from tests.test_crash_recovery import _Crash, _daemon

    _two_servers(cli, ssh_servers)
    out = tmp_path / "rank"
    first_s = "1" if every_part_started else "60"
    job = cli.submit("--gpus", "4", "--", sys.executable, "-c", STARTS, str(out), first_s)

    def crash(self, specs, run_dir):  # the daemon dies after starting some parts
        for spec in specs if every_part_started else specs[:1]:
            self.launch(spec)
        raise _Crash

    monkeypatch.setattr(NodeRouter, "launch_parts", crash)
    crashing = _daemon(cli, monkeypatch)
    with pytest.raises(_Crash):
        crashing.tick(crashing.clock.now())
    crashing.executor.close()
    if crashing.lease is not None:
        crashing.lease.release()
    wait_for(lambda: Path(f"{out}.0").exists(), what="part 0 started")
    cli.run_until_idle(timeout=60)
    shown = cli.json("show", str(job))
    assert shown["state"] == "completed", shown
    states = [s for (s,) in cli.db_rows(f"SELECT state FROM attempt WHERE job_id = {job}")]
    starts = [Path(f"{out}.{r}").read_text().split() for r in (0, 1)]
    if every_part_started:  # found started on both servers: followed to its end
        assert states == ["exited"] and [len(s) for s in starts] == [1, 1]
    else:  # part 1 never started: part 0 killed, the job requeued and run again
        assert states == ["abandoned", "exited"] and [len(s) for s in starts] == [2, 1]
        assert not _alive(int(starts[0][0])), "the part started before the crash was killed"


def test_a_part_not_started_orphans_the_attempt_until_every_part_is_fenced(tmp_path):
    """The daemon's side: a server gone mid-launch leaves the attempt orphaned with every
    part's handle (its servers held, the job requeued) until each part is fenced."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from sqlmodel import select

    from executors.base import Executor, Handle, PollResult, RunStatus
    from executors.gang import PartsNotStarted, gang_handle
    from executors.gpu import GpuInfo
    from orchestrator.accounting.meter import Accountant
    from orchestrator.daemon.dispatch import Dispatcher
    from orchestrator.daemon.reaper import Reaper
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.queue.ownership import current_user
    from orchestrator.settings import NodeConfig, Settings

    now = datetime(2026, 1, 1, tzinfo=UTC)

    class GoneMidLaunch(Executor):
        def __init__(self) -> None:
            self.fenced: list[Handle] = []

        def launch_parts(self, specs, run_dir):
            assert [s.env["NODE_RANK"] for s in specs] == ["0", "1"]
            hs = [Handle(s.attempt_id, s.run_dir, {"node": s.node}) for s in specs]
            raise PartsNotStarted("b went away", gang_handle(specs[0].attempt_id, run_dir, hs,
                                  False), fenced=False, unreachable=True)  # fmt: skip

        def fence(self, handle):
            self.fenced.append(handle)
            return True

        def _do_launch(self, spec):
            raise AssertionError("a job across servers starts through launch_parts")

        def _do_poll(self, handle):
            return PollResult(RunStatus.RUNNING)

        def _do_signal(self, handle, sig):
            return False

        def _do_recover(self, attempt_id, run_dir, node):
            return None

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="queued", user="u", uid=os.getuid(), command=["true"],
                  workdir=str(tmp_path), gpus_min=4, gpus_max=4, submitted_at=now)  # fmt: skip
        session.add(job)
        session.flush()
        session.expunge(job)
    gpus = tuple(GpuInfo(index=i, uuid=f"gpu{i}", model="m") for i in range(2))
    nodes = [
        ResolvedNode(n, "ssh", gpus, "config", host="127.0.0.1",
                     config=NodeConfig(name=n, executor="ssh", host="127.0.0.1", gpus=2))
        for n in ("a", "b")
    ]  # fmt: skip
    ex = GoneMidLaunch()
    d = Dispatcher(settings=Settings(home=tmp_path / "home"), db=db, executor=ex, nodes=nodes,
                   user=current_user())  # fmt: skip
    assert not d.launch(job, "a", [0, 1], now, parts=[("a", [0, 1]), ("b", [0, 1])])
    with db.read() as session:
        att = session.exec(select(Attempt)).one()
        assert att.state == "orphaned" and len(att.handle["data"]["parts"]) == 2
        assert session.get(Job, job.id).state == "planned", "not requeued while b may run it"
        alloc = d.allocator(session)
    assert alloc.free_gpus == 0, "both servers held until every part is fenced"
    reaper = Reaper(db=db, executor=ex, settings=SimpleNamespace(cancel_grace_s=10.0),
                    nodes=nodes, accountant=Accountant(lambda a, b: None, lambda a, b: None,
                                                       lambda a: 0.0))  # fmt: skip
    ex.unreachable_nodes = lambda: {"b": now.timestamp()}
    ex.fence = lambda handle: ex.fenced.append(handle) and False  # b away: not settled
    reaper.fence_orphans(now + timedelta(seconds=299))
    with db.read() as session:
        assert session.get(Job, job.id).state == "planned", "b away less than lost_after"
    reaper.fence_orphans(now + timedelta(seconds=301))
    with db.read() as session:  # as a single-server launch: given up after lost_after
        assert session.exec(select(Attempt)).one().state == "orphaned"
        assert session.get(Job, job.id).state == "queued"
        assert "node b lost" in session.get(Job, job.id).reason
    ex.fenced.clear()
    ex.unreachable_nodes = lambda: {}
    del ex.fence  # b is back: every part fenced
    reaper.fence_orphans(now + timedelta(seconds=400))
    assert len(ex.fenced) == 1 and len(ex.fenced[0].data["parts"]) == 2
    with db.read() as session:
        assert session.exec(select(Attempt)).one().state == "lost"


def test_the_width_is_spread_as_evenly_as_the_servers_allow():
    from orchestrator.daemon.energy.across import spread

    assert spread(4, [2, 2]) == [2, 2]
    assert spread(6, [4, 4]) == [3, 3]
    assert spread(7, [4, 4]) == [4, 3]
    assert spread(10, [8, 4]) == [6, 4], "even would give the 4-GPU server 5"
    assert spread(12, [4, 8, 2]) == [4, 6, 2]


def test_submit_refuses_only_what_neither_a_node_nor_the_ssh_servers_together_carry():
    from orchestrator.nodes.inventory import job_gpu_limit
    from orchestrator.queue.checks import too_wide

    four_ssh = job_gpu_limit({f"s{i}": ("ssh", 8) for i in range(4)} | {"here": ("local", 2)})
    assert four_ssh == 32 and too_wide(32, four_ssh) is None
    assert too_wide(40, four_ssh) == (
        "needs 40 GPUs; the largest node has 8 and the 4 SSH servers together 32"
    )
    one_ssh = job_gpu_limit({"s": ("ssh", 8), "here": ("local", 4), "c": ("slurm", 16)})
    assert too_wide(17, one_ssh) == "needs 17 GPUs; the largest node has 16", "as before"
    assert too_wide(5, 4) == "needs 5 GPUs; the largest node has 4", "a plain count: as before"
    assert too_wide(5, None) is None, "not known yet: the daemon checks it"


def test_show_names_every_part_of_a_run():
    from orchestrator.cli.output.showtext import _run

    run = {"attempt": 1, "state": "exited", "node": "a", "gpu_ids": [0, 1],
           "parts": [{"node": "a", "gpu_ids": [0, 1]}, {"node": "b", "gpu_ids": [0, 1]}],
           "started_at": None, "finished_at": None, "exit_code": 0, "cap": None,
           "energy_kwh": None, "energy_modelled": None, "carbon_g": None}  # fmt: skip
    assert _run(run).startswith("#1 exited on a GPU 0, 1 + b GPU 0, 1, exit 0")
    assert _run(run | {"parts": None}).startswith("#1 exited on a, GPU 0, 1, exit 0")


def test_a_job_across_servers_is_packed_on_ssh_servers_alone():
    from types import SimpleNamespace

    from orchestrator.daemon.energy.across import across_servers
    from orchestrator.daemon.sqlqueue import SqlQueue
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    names = {"here": "local", "a": "ssh", "b": "ssh"}
    topo = ClusterTopology(tuple(NodeTopology(n, (0, 1, 2, 3)) for n in names))
    nodes = [SimpleNamespace(name=n, executor=kind) for n, kind in names.items()]
    q = SqlQueue(db=None, dispatcher=SimpleNamespace(nodes=nodes), reaper=None,
                 suspender=None, alloc=ClusterAllocator(topo))  # fmt: skip
    first = q.alloc.allocate(("job", 1), 8)  # network packing alone takes "here" and "a"
    assert [n for n, _ in first.parts] == ["here", "a"]
    node, gpus, parts = across_servers(q.alloc, q._ssh_nodes(), ("job", 1), first.parts, 8, None)
    assert parts == [("a", [0, 1, 2, 3]), ("b", [0, 1, 2, 3])] and (node, gpus) == (
        "a",
        parts[0][1],
    )
    assert q.alloc.free_on("here") == [0, 1, 2, 3], "this host's GPUs are free again"
    assert q.alloc.free_gpus == 4


def test_a_range_wider_than_every_ssh_server_is_planned_at_what_they_carry():
    from orchestrator.planning.snapshot import across_servers_width

    assert across_servers_width(2, 16, 8) == 8, "fits one server: on one, as before"
    assert across_servers_width(12, 16, 8) == 16
    assert across_servers_width(12, 64, 8, 32) == 32, "not more than the servers carry"


# Each part appends its pid to OUT.<NODE_RANK>; a rank's first start runs a minute.
AGAIN = (
    "import os, sys, time\n"
    "path = sys.argv[1] + '.' + os.environ['NODE_RANK']\n"
    "first = not os.path.exists(path)\n"
    "open(path, 'a').write(f'{os.getpid()}\\n')\n"
    "time.sleep(60 if first else 0.5)\n"
)


def test_rank_0s_server_gone_the_job_is_requeued_and_no_part_left_running(
    cli, ssh_servers, tmp_path
):
    a, _ = _two_servers(cli, ssh_servers)
    out = tmp_path / "rank"
    job = cli.submit("--gpus", "4", "--interruptible", "--", sys.executable, "-c", AGAIN, str(out))
    daemon = cli.daemon()
    try:
        wait_for(lambda: all(Path(f"{out}.{r}").exists() for r in (0, 1)), timeout_s=30,
                 what="both parts started")  # fmt: skip
        first = [int(Path(f"{out}.{r}").read_text().split()[0]) for r in (0, 1)]
        a.stop()  # rank 0's server goes off the network; its part runs on there, unseen
        wait_for(lambda: "lost" in _states(cli, job), timeout_s=20, what="the job lost")
        wait_for(lambda: not _alive(first[1]), timeout_s=10,
                 what="rank 1 fenced while rank 0's server is away")  # fmt: skip
        assert _alive(first[0]), "out of reach: killed once its server is back"
        a.start()
        done = cli.wait_state(job, {"completed"}, timeout=40)
        assert done["attempts"] == 2 and not _alive(first[0])
        states = [s for (s,) in cli.db_rows(f"SELECT state FROM attempt WHERE job_id = {job} "
                                            "ORDER BY number")]  # fmt: skip
        assert states == ["lost", "exited"]
    finally:
        cli.run("cancel", str(job), check=False)
        daemon.terminate()
        daemon.wait(timeout=30)
