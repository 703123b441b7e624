"""A job across servers, the parts' bookkeeping alone (``executors.gang``): what the
attempt's state is from its parts' states, and who is told to stop."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from executors import gang
from executors.base import Handle, PollResult, RunStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING = PollResult(RunStatus.RUNNING)


def _exited(code: int, after_s: float = 0.0, sig: int | None = None) -> PollResult:
    return PollResult(RunStatus.EXITED, exit_code=code, signal=sig,
                      ended_at=T0 + timedelta(seconds=after_s))  # fmt: skip


def _gang(attempt_id: int, interruptible: bool = False) -> Handle:
    parts = [Handle(attempt_id, f"/r/part-{r}", {"node": n}) for r, n in enumerate("abc")]
    return gang.gang_handle(attempt_id, "/r", parts, interruptible)


def _poll(handle: Handle, states: dict[str, PollResult]):
    sent: list[tuple[str, int]] = []

    def signal_one(h: Handle, sig: int) -> bool:
        sent.append((h.data["node"], sig))
        return True

    return gang.poll(lambda h: states[h.data["node"]], signal_one, handle), sent


def test_a_part_that_ended_well_waits_for_the_others():
    result, sent = _poll(_gang(1), {"a": _exited(0), "b": RUNNING, "c": RUNNING})
    assert result.status is RunStatus.RUNNING and sent == []
    result, _ = _poll(_gang(1), {"a": _exited(0, 1), "b": _exited(0, 3), "c": _exited(0, 2)})
    assert (result.status, result.exit_code, result.ended_at) == (
        RunStatus.EXITED,
        0,
        T0 + timedelta(seconds=3),
    )


def test_a_part_that_fails_stops_the_others_term_then_kill(monkeypatch):
    handle = _gang(2)
    states = {"a": RUNNING, "b": _exited(3), "c": RUNNING}
    result, sent = _poll(handle, states)
    assert result.status is RunStatus.RUNNING
    assert sent == [("a", signal.SIGTERM), ("c", signal.SIGTERM)]
    assert _poll(handle, states)[1] == [], "told once; SIGKILL only after the grace"
    monkeypatch.setattr(gang, "STOP_GRACE_S", 0.0)
    assert _poll(handle, states)[1] == [("a", signal.SIGKILL), ("c", signal.SIGKILL)]
    # the others end of the signals (later): the attempt ends as the first failing part did
    states = {"a": _exited(143, 5), "b": _exited(3, 1), "c": _exited(137, 9)}
    result, _ = _poll(handle, states)
    assert (result.status, result.exit_code) == (RunStatus.EXITED, 3)
    assert result.detail == "part 1 on b: exit code 3; the other parts were stopped"


@pytest.mark.parametrize("interruptible", [False, True])
def test_a_part_killed_requeues_only_an_interruptible_job(interruptible):
    states = {"a": _exited(143, 5), "b": _exited(137, 1, signal.SIGKILL), "c": _exited(0, 2)}
    result, _ = _poll(_gang(3, interruptible), states)
    if interruptible:  # lost, so requeued: it resumes from its checkpoint
        assert result.status is RunStatus.LOST
    else:
        assert (result.status, result.exit_code) == (RunStatus.EXITED, 137)
    assert result.detail.startswith("part 1 on b: killed by SIGKILL")


@pytest.mark.parametrize("interruptible", [False, True])
def test_the_part_that_failed_first_is_the_one_the_daemon_saw_not_the_servers_clocks(
    interruptible,
):
    """a fails (its server's clock says +5 s); the daemon stops b, whose server's clock is
    30 s slow, so b's exit.json says it ended first: the job still ended as a did."""
    handle = _gang(6, interruptible)
    _poll(handle, {"a": _exited(1, 5), "b": RUNNING, "c": RUNNING})
    late = {"a": _exited(1, 5), "b": _exited(143, -25, signal.SIGTERM), "c": _exited(143, 6)}
    result, _ = _poll(handle, late)
    assert (result.status, result.exit_code) == (RunStatus.EXITED, 1)
    assert result.detail.startswith("part 0 on a: exit code 1")
    # a daemon that first sees them all ended (a restart): not the parts it stops by signal
    result, _ = _poll(_gang(7, interruptible), late)
    assert (result.status, result.exit_code) == (RunStatus.EXITED, 1)


def test_one_part_unreachable_makes_the_attempt_unreachable_and_a_failure_still_stops():
    states = {"a": RUNNING, "b": PollResult(RunStatus.UNREACHABLE, detail="node b: down"),
              "c": _exited(1)}  # fmt: skip
    result, sent = _poll(_gang(4), states)
    assert result.status is RunStatus.UNREACHABLE and result.detail == "part 1: node b: down"
    assert sent == [("a", signal.SIGTERM)], "a failed part stops what can be reached"


def test_each_part_is_metered_on_its_own_and_a_forged_log_is_bounded_by_its_gpus(tmp_path):
    import json

    from executors import runfiles
    from orchestrator.accounting.meter import MAX_GPU_W, Accountant
    from orchestrator.queue.models import Attempt

    t = T0.timestamp()
    for rank, power in enumerate([f"{t} 0\n{t + 60} 12000\n", f"{t} 0\n{t + 60} 1e12\n"]):
        part = tmp_path / f"part-{rank}"
        part.mkdir()
        start = {"pid": 4242, "start_ticks": 1, "started_at": T0.isoformat()}
        (part / runfiles.JOB).write_text(json.dumps(start))
        (part / runfiles.POWER).write_text(power)  # rank 1's job forged its log
    parts = [{"node": "a", "gpu_ids": [0, 1]}, {"node": "b", "gpu_ids": [0, 1]}]
    att = Attempt(id=9, job_id=1, number=1, state="running", node="a", gpu_ids=[0, 1],
                  run_dir=str(tmp_path), started_at=T0, parts=parts)  # fmt: skip
    acc = Accountant(lambda a, b: 0.5 * (b - a), lambda a, b: None, lambda a: 0.0)
    totals = acc.measure(att, t + 60)
    bound = MAX_GPU_W * 2 * 60  # rank 1: at most what its two GPUs can draw
    assert totals.energy_j == pytest.approx(12000 + bound)
    assert set(acc._meters) == {9, (9, 0), (9, 1)}
    acc.forget(9)
    assert acc._meters == {}, "every part's meter forgotten with its attempt"


def _claimed_run(tmp_path, monitor) -> str:
    from executors import runfiles

    run_dir = tmp_path / "attempt-5"
    run_dir.mkdir()
    assert runfiles.try_claim(run_dir, f"started {monitor.pid} {monitor.start_ticks}")
    return str(run_dir)


def test_a_fence_never_settles_while_a_claimed_monitor_may_still_start_the_job(
    tmp_path, monkeypatch
):
    """The monitor claimed the run but has not written job.json yet (it reads the GPUs'
    energy first): the job may start a moment later, so the part is not settled."""
    from executors import procs, remote

    monkeypatch.setattr(remote, "FENCE_WAIT_S", 0.2, raising=False)
    run_dir = _claimed_run(tmp_path, procs.self_id())  # this process: a live "monitor"
    assert remote.fence(run_dir)["settled"] is False


def test_a_fence_waits_for_a_starting_job_and_kills_it(tmp_path, monkeypatch):
    import json
    import subprocess
    import threading

    from executors import procs, remote, runfiles

    monkeypatch.setattr(remote, "FENCE_WAIT_S", 5.0, raising=False)
    run_dir = _claimed_run(tmp_path, procs.self_id())
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    ident = procs.identify(job.pid)
    record = {"pid": job.pid, "start_ticks": ident.start_ticks, "started_at": T0.isoformat()}
    write = threading.Timer(0.3, lambda: (tmp_path / "attempt-5" / runfiles.JOB).write_text(
        json.dumps(record)))  # fmt: skip
    write.start()
    try:
        out = remote.fence(run_dir)
        assert out == {"settled": True, "ran": True, "killed": True}
        assert job.wait(timeout=5) == -signal.SIGKILL
    finally:
        write.cancel()
        job.kill()


def test_a_fence_settles_once_the_claimed_monitor_is_gone(tmp_path):
    import subprocess

    from executors import procs, remote

    gone = subprocess.Popen(["true"])
    ident = procs.identify(gone.pid) or procs.ProcessId(gone.pid, -1)
    gone.wait()
    assert remote.fence(_claimed_run(tmp_path, ident))["settled"] is True


def _finished_across_servers(models: list[str | None]):
    from sqlmodel import Session, SQLModel, create_engine

    from orchestrator.queue.models import Attempt, Job

    eng = create_engine("sqlite://")
    SQLModel.metadata.create_all(eng)
    session = Session(eng)
    job = Job(name="train", state="completed", user="alice", uid=1000, command=["x"],
              workdir="/", gpus_min=8, gpus_max=8, submitted_at=T0)  # fmt: skip
    session.add(job)
    session.commit()
    parts = [{"node": n, "gpu_ids": [0, 1, 2, 3]} for n in ("a", "b")]
    att = Attempt(job_id=job.id, number=1, state="exited", node="a", gpu_ids=[0, 1, 2, 3],
                  run_dir="", started_at=T0, finished_at=T0 + timedelta(hours=1),
                  progress_done=1000.0, energy_j=8 * 300.0 * 3600, gpu_model=models[0],
                  parts=parts)  # fmt: skip
    session.add(att)
    session.commit()
    return session, job, att


def test_calibration_of_a_job_across_servers_counts_every_part_s_gpus():
    """8 GPUs (2 servers x 4) drawing 300 W each for an hour: 8 GPUs at 300 W, not rank
    0's 4 at 600 W; where the parts' GPU models differ (None) it learns nothing."""
    from orchestrator.accounting.calibration import learn
    from orchestrator.daemon.ops.jobpower import _run

    session, job, att = _finished_across_servers(["A100"])
    row = learn(session, job, att, T0 + timedelta(hours=1))
    assert (row.gpus, row.power_w_per_gpu) == (8, pytest.approx(300.0))
    assert _run(att)["gpus"] == 8 and _run(att)["modelled_w"] == pytest.approx(2400.0)
    session, job, att = _finished_across_servers([None])
    assert learn(session, job, att, T0 + timedelta(hours=1)) is None


def test_a_job_across_servers_has_a_gpu_model_only_where_its_parts_agree():
    from types import SimpleNamespace

    from orchestrator.daemon.dispatch import Dispatcher
    from orchestrator.nodes.inventory import ResolvedNode

    def node(name: str, model: str) -> ResolvedNode:
        return ResolvedNode(name, "ssh", (), "config", gpu_model=model)

    a, b, c = node("a", "A100"), node("b", "A100"), node("c", "H100")
    me = SimpleNamespace(nodes=[a, b, c])
    model_of = Dispatcher._model_of
    assert model_of(me, a, [0], [("a", [0, 1]), ("b", [0, 1])]) == "A100"
    assert model_of(me, a, [0], [("a", [0, 1]), ("c", [0, 1])]) is None
    assert model_of(me, c, [0], None) == "H100"


def test_the_planner_plans_a_job_across_servers_at_what_the_ssh_servers_carry():
    """Local node 4 GPUs + SSH servers 4 + 4: a --gpus 6-12 job is planned at 8 (what it
    is placed on), not 12 (every node's GPUs), or it runs 1.5 times longer than planned."""
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.queue.models import Job

    planner = LivePlanner(resolve_policy("fifo"), 900.0, curve_for("a40"))
    job = Job(id=1, state="queued", user="a", uid=1000, command=["x"], workdir="/",
              gpus_min=6, gpus_max=12, submitted_at=T0, duration_s=3600.0)  # fmt: skip
    scheduler = planner.schedule(T0, [job], {}, [], 12, 4, 0, widest=8)
    assert [view.gpus for view, _ in scheduler.planned()] == [8]


@pytest.mark.parametrize("lab_busy", [True, False])
def test_the_deadline_guard_makes_room_for_a_job_across_servers_on_ssh_servers_only(lab_busy):
    """A local node 'lab' and SSH servers 'srv-a', 'srv-b' (4 GPUs each); an 8-GPU job
    waits. Suspending the job on 'lab' (or counting lab's idle GPUs) makes no room for it:
    only the job on 'srv-a' does."""
    from types import SimpleNamespace

    from orchestrator.daemon.sqlqueue import SqlQueue
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    names = {"lab": "local", "srv-a": "ssh", "srv-b": "ssh"}
    topo = ClusterTopology(tuple(NodeTopology.plain(n, 4) for n in names))
    alloc = ClusterAllocator(topo)
    if lab_busy:
        alloc.hold(("attempt", 1), "lab", [0, 1, 2, 3])
    alloc.hold(("attempt", 2), "srv-a", [0, 1, 2, 3])
    nodes = [SimpleNamespace(name=n, executor=e) for n, e in names.items()]
    queue = SqlQueue(None, SimpleNamespace(nodes=nodes), None, None, alloc=alloc)
    movable = {("attempt", 1): "lab's", ("attempt", 2): "srv-a's"}
    assert queue.make_room(8, movable) == [("attempt", 2)]
    assert alloc.free_gpus == (4 if lab_busy else 8), "nothing held is left behind"
    if lab_busy:  # a job that fits one node: any node's jobs may make room, as before
        assert queue.make_room(4, movable) == [("attempt", 1)]


def test_cancel_reaches_the_parts_that_can_be_reached_while_rank_0_s_server_is_down(tmp_path):
    import os
    from types import SimpleNamespace

    from orchestrator.accounting.meter import Accountant
    from orchestrator.daemon.reaper import Reaper
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    handle = _gang(8)
    with db.write() as session:
        job = Job(state="running", user="u", uid=os.getuid(), command=["true"], workdir="/",
                  gpus_min=6, gpus_max=6, submitted_at=T0, attempts=1,
                  cancel_requested_at=T0)  # fmt: skip
        session.add(job)
        session.flush()
        parts = [{"node": n, "gpu_ids": [0, 1]} for n in "abc"]
        att = attempts.begin(session, at=T0, job_id=job.id, number=1, node="a",
                             gpu_ids=[0, 1], run_dir="/r", parts=parts)  # fmt: skip
        attempts.move(session, att, AttemptState.RUNNING, at=T0, handle=handle.to_dict())
        att_id = att.id
    heard: list[str] = []

    def signal_one(h: Handle, sig: int) -> bool:
        if h.data["node"] == "a":
            raise ConnectionError("node a: down")
        heard.append(h.data["node"])
        return True

    down = {"a": 0.0}
    executor = SimpleNamespace(
        unreachable_nodes=lambda: down,
        signal=lambda h, sig: gang.signal(signal_one, h, sig),
    )
    accountant = Accountant(lambda a, b: 0.0, lambda a, b: None, lambda att: 300.0)
    reaper = Reaper(db=db, executor=executor, settings=SimpleNamespace(cancel_grace_s=1.0),
                    nodes=[], accountant=accountant)  # fmt: skip
    reaper.stop_cancelled(T0)
    assert heard == ["b", "c"], "rank 0's server down: the others still hear the cancel"
    with db.read() as session:
        assert session.get(Attempt, att_id).term_sent_at is not None
    down.update(b=0.0, c=0.0)
    heard.clear()
    reaper.stop_cancelled(T0 + timedelta(seconds=5))
    assert heard == [], "every server down: nothing to tell"


def test_the_modelled_power_of_a_job_across_servers_counts_every_part_s_gpus():
    from orchestrator.accounting.meter import modelled_power
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.queue.models import Attempt

    parts = [{"node": n, "gpu_ids": [0, 1, 2, 3]} for n in "ab"]
    att = Attempt(id=3, job_id=1, number=1, state="running", node="a", gpu_ids=[0, 1, 2, 3],
                  run_dir="/r", parts=parts)  # fmt: skip
    curve = curve_for("a40")
    assert modelled_power([], curve)(att) == pytest.approx(8 * curve.power_w(1.0))


def test_rank_0_s_rendezvous_addr_is_master_addr_where_it_is_set(tmp_path):
    """MASTER_ADDR is rank 0's ``rendezvous_addr`` (the address the other servers reach,
    e.g. the cluster network), else its SSH ``host`` (which may be an alias or a tunnel);
    each part logs to its own file."""
    import os

    from pydantic import ValidationError

    from executors.gpu import GpuInfo
    from orchestrator.daemon.launchspec import part_specs
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.settings import NodeConfig, Settings

    settings = Settings(home=tmp_path)
    job = Job(id=7, state="planned", user="u", uid=os.getuid(), command=["x"], workdir="/",
              gpus_min=4, gpus_max=4, submitted_at=T0)  # fmt: skip
    parts = [{"node": n, "gpu_ids": [0, 1]} for n in "ab"]
    att = Attempt(id=9, job_id=7, number=1, state="launching", node="a", gpu_ids=[0, 1],
                  run_dir=str(tmp_path / "r"), parts=parts)  # fmt: skip
    gpus = tuple(GpuInfo(index=i, uuid=f"g{i}", model="m") for i in range(2))

    def nodes(addr: str | None) -> list[ResolvedNode]:
        extra = {"rendezvous_addr": addr} if addr else {}
        return [ResolvedNode(n, "ssh", gpus, "config", host=f"{n}-tunnel",
                             config=NodeConfig(name=n, executor="ssh", host=f"{n}-tunnel",
                                               gpus=2, **(extra if n == "a" else {})))
                for n in "ab"]  # fmt: skip

    specs = part_specs(settings, job, att, nodes("10.1.0.1"))
    assert [s.env["MASTER_ADDR"] for s in specs] == ["10.1.0.1", "10.1.0.1"]
    assert [os.path.basename(s.log_path) for s in specs] == ["7.log", "7.part-1.log"]
    specs = part_specs(settings, job, att, nodes(None))
    assert [s.env["MASTER_ADDR"] for s in specs] == ["a-tunnel", "a-tunnel"]
    with pytest.raises(ValidationError):
        NodeConfig(name="a", executor="ssh", rendezvous_addr="10.0.0.1; rm -rf /")


def test_a_part_that_missed_its_sigterm_is_told_again_before_the_grace_ends():
    """Part a's job had not started when the others were told to stop (its monitor
    between its claim and job.json): it hears SIGTERM at the next poll, not SIGKILL only."""
    handle = _gang(10)
    states = {"a": RUNNING, "b": _exited(3), "c": RUNNING}
    sent: list[tuple[str, int]] = []

    def signal_one(h: Handle, sig: int) -> bool:
        sent.append((h.data["node"], sig))
        return h.data["node"] != "a" or len(sent) > 2

    gang.poll(lambda h: states[h.data["node"]], signal_one, handle)
    gang.poll(lambda h: states[h.data["node"]], signal_one, handle)
    gang.poll(lambda h: states[h.data["node"]], signal_one, handle)
    assert sent == [("a", signal.SIGTERM), ("c", signal.SIGTERM), ("a", signal.SIGTERM)]
