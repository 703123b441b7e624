"""The right-sizing review's fixes: a server running work gridshift did not start is
never powered off, a failed wake does not block a healthy server's, a job wider than one
server waits for the server it needs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.rightsize import _sizer

pytestmark = pytest.mark.backends("sqlite")


def _rec(tmp_path: Path) -> tuple[list[str], Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "rec.py"
    script.write_text(f"import sys; open({str(calls)!r}, 'a').write(sys.argv[1] + '\\n')")
    return [sys.executable, str(script)], calls


def _passes(sizer, alloc, t0: float, n: int = 4, planned=()) -> None:
    for i in range(n):
        sizer.step(alloc, list(planned), t0 + 2 * i)
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while any(p.busy for p in sizer.nodes.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    sizer.step(alloc, list(planned), t0 + 2 * n)


@pytest.mark.parametrize("case", ["discovered use", "resize hold", "backfill hold"])
def test_a_server_in_use_outside_gridshift_jobs_is_never_powered_off(tmp_path, case):
    rec, calls = _rec(tmp_path)
    use = (70000, 100.0) if case == "discovered use" else (0, 0.0)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"], use=use)
    if case == "resize hold":
        alloc.hold(("resize", 7), "a", [0])
    elif case == "backfill hold":
        alloc.hold(("backfill", 3), "a", [1])
    sizer.restore(time.time() - 60, {})  # idle since before discovery looked
    _passes(sizer, alloc, time.time())
    assert sizer.nodes["a"].state == "on" and not calls.exists()
    assert sizer.nodes["a"].idle_since_s is None


def test_no_power_off_before_a_discovery_newer_than_the_idle_start(tmp_path):
    rec, calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])
    later = time.time() + 3600  # idle from an hour after discovery's last look
    sizer.restore(later, {})
    _passes(sizer, alloc, later)
    assert sizer.nodes["a"].state == "on" and not calls.exists()


def test_the_server_asked_before_power_off_refuses_on_any_doubt(tmp_path):
    rec, calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])
    sizer.ask_idle = lambda _n: "logged in: alice"
    sizer.restore(time.time() - 60, {})  # idle since before discovery looked
    alloc.hold(("attempt", 1), "b", [0])
    _passes(sizer, alloc, time.time())
    assert sizer.nodes["a"].state == "on" and not calls.exists()
    assert "not idle: logged in: alice" in sizer.nodes["a"].error


def test_asking_the_server_itself(tmp_path):
    from executors.sshlink import RemoteError
    from orchestrator.nodes.idleask import asked_idle

    row = "0, u0, A100, 81920, {used}, {util}, 60, 400, 400, 100, 400"

    class Link:
        def __init__(self, used=0, util=0, apps="", who="", fail=False):
            self.out = {"--query-compute-apps=pid": apps, "who": who}
            self.smi, self.fail = row.format(used=used, util=util), fail

        def text(self, argv):
            if self.fail:
                raise RemoteError("h: connection refused")
            if argv[0] == "who":
                return self.out["who"]
            return self.out.get(argv[1], self.smi)

    assert asked_idle(Link()) is None
    assert "GPU in use" in asked_idle(Link(used=5000))
    assert "GPU in use" in asked_idle(Link(util=3))
    assert "compute processes: 4242" in asked_idle(Link(apps="4242\n"))
    assert "logged in: bob" in asked_idle(Link(who="bob pts/0 2026-11-24 07:00\n"))
    assert "cannot ask it" in asked_idle(Link(fail=True))
    assert "GPU use unknown" in asked_idle(Link(used="[N/A]"))


def test_idle_draw_leaves_out_gpus_discovery_saw_in_use(tmp_path):
    from orchestrator.daemon.energy.idle import IdleMeter

    _, alloc, db = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], use=(70000, 100.0))
    meter = IdleMeter(db, {"a": "ssh", "b": "ssh"}, {})
    assert meter._measure(alloc) == {}, "380 W of someone's training is not idle draw"


def test_a_failed_wake_in_back_off_does_not_block_a_healthy_servers(tmp_path):
    from orchestrator.daemon.energy.rightsizing import WAKE_FAILED

    rec, calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])
    sizer.restore(0.0, {})
    b = sizer.nodes["b"] = type(sizer.nodes["a"])(sizer.nodes["a"].cfg.model_copy(
        update={"name": "b", "power_on": [*rec, "on-b"]}))  # fmt: skip
    a = sizer.nodes["a"]
    a.state, a.retry_at_s, b.state = WAKE_FAILED, 1800.0, "off"
    a.check_at_s = 1e9  # not asked whether it answers meanwhile

    class Due:
        start_s, gpus = 0.0, 2

    class Job:
        id, gpus = 1, 2

    for i in range(3):  # passes, the job due now, a's retry 30 min away
        assert sizer.allocate(alloc, ("job", 1), 2, float(i)) is None
        sizer.step(alloc, [(Job, Due)], float(i))
    deadline = time.monotonic() + 5
    while b.state != "on" and time.monotonic() < deadline:
        time.sleep(0.05)
        sizer.step(alloc, [(Job, Due)], 4.0)
    assert b.state == "on" and a.state == WAKE_FAILED
    assert calls.read_text() == "on-b\n", "b woken, a left in its back-off"
    got = sizer.allocate(alloc, ("job", 1), 2, 5.0)
    assert got is not None and got.parts[0][0] == "b"
    assert sizer.allocate(alloc, ("job", 2), 2, 6.0) is None and a.state == WAKE_FAILED
    sizer.allocate(alloc, ("job", 2), 2, 1801.0)
    assert a.state == "waking", "retried once due"


def test_a_job_wider_than_one_server_wakes_the_server_its_repack_needs():
    """local(4), s1(2, on), s2(4, off), a 6-GPU job: on SSH servers alone it needs s2,
    so s2 is woken and the job waits (it never launches onto a server off)."""
    from types import SimpleNamespace

    from orchestrator.daemon.energy.rightsizing import Power, RightSizer
    from orchestrator.daemon.sqlqueue import SqlQueue
    from orchestrator.planning.devices.rightsizing import OFF
    from orchestrator.planning.policies.base import Decision, QueuedJob
    from orchestrator.settings.nodes import NodeConfig
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    names = {"local": ("local", 4), "s1": ("ssh", 2), "s2": ("ssh", 4)}
    topo = ClusterTopology(tuple(NodeTopology.plain(n, g) for n, (_, g) in names.items()))
    nodes = [SimpleNamespace(name=n, executor=kind) for n, (kind, _) in names.items()]
    dispatcher = SimpleNamespace(nodes=nodes, sharing=None, admitted=lambda _a, _i, got, *_r: got)
    q = SqlQueue(db=None, dispatcher=dispatcher, reaper=None,
                 suspender=None, alloc=ClusterAllocator(topo))  # fmt: skip
    cfg = NodeConfig(name="s2", executor="ssh", host="h", gpus=4, power_off=["/bin/true"],
                     power_on=["/bin/true"])  # fmt: skip
    q.power = RightSizer(db=None, nodes={"s2": Power(cfg, state=OFF)}, probe=lambda _n: None)
    woken = []
    q.power.wake = lambda name, *_a: woken.append(name)
    q.eligible = {9: SimpleNamespace(id=9, gpu_type=None, name=None, gpus_min=6)}
    q.widest = 6
    got = q.allocate(QueuedJob(9, 6, 0.0), Decision(0.0), 0.0)
    assert got is None and woken == ["s2"], got
    assert q.alloc.allocation(("job", 9)) is None and q.alloc.free_gpus == 10


def test_power_off_exit_0_is_off_only_once_the_server_stops_answering(tmp_path):
    """power_off ends at once (ipmitool power soft); the server answers 1.5 s more: it
    stays ``powering off`` (a job is not placed there) until it stops answering."""
    rec, calls = _rec(tmp_path)
    gone_at = []

    def probe(_n):  # answers until 1.5 s after power_off
        if calls.exists() and not gone_at:
            gone_at.append(time.monotonic() + 1.5)
        return "refused" if gone_at and time.monotonic() > gone_at[0] else None

    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"], probe=probe,
                               wake_timeout="10s")  # fmt: skip
    sizer.restore(time.time() - 60, {})
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.step(alloc, [], time.time())
    deadline = time.monotonic() + 2
    while not calls.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    sizer.step(alloc, [], time.time())
    assert sizer.nodes["a"].state == "powering off"
    assert sizer.allocate(alloc, ("job", 5), 2, time.time()) is None, "not placed on a"
    deadline = time.monotonic() + 10
    while sizer.nodes["a"].state != "off" and time.monotonic() < deadline:
        time.sleep(0.1)
        sizer.step(alloc, [], time.time())
    assert sizer.nodes["a"].state == "off" and time.monotonic() > gone_at[0]


def test_power_off_that_never_takes_leaves_the_server_on_with_an_error(tmp_path):
    rec, _calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"], wake_timeout="1s")
    sizer.restore(time.time() - 60, {})
    alloc.hold(("attempt", 1), "b", [0, 1])
    deadline = time.monotonic() + 10
    sizer.step(alloc, [], time.time())
    while (sizer.nodes["a"].busy or sizer.nodes["a"].state != "on") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
        sizer.step(alloc, [], time.time() - 30)  # not idle long enough to go off again
    assert sizer.nodes["a"].state == "on"
    assert "still answers 1s after power_off" in sizer.nodes["a"].error


def test_a_wake_counts_an_answer_only_once_the_server_was_down_or_booted_again(tmp_path):
    rec, _calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])
    sizer.boot = lambda _n: "same-boot"  # never went down, never rebooted
    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"  # e.g. restored off: never seen down
    alloc.hold(("attempt", 1), "b", [0, 1])
    assert sizer.allocate(alloc, ("job", 1), 2, 10.0) is None
    deadline = time.monotonic() + 10
    while sizer.nodes["a"].state == "waking" and time.monotonic() < deadline:
        time.sleep(0.1)
        sizer.step(alloc, [], 11.0)
    assert sizer.nodes["a"].state == "wake failed"
    assert sizer.nodes["a"].error == (
        "power_on: it answers but did not boot again within 2s (same boot_id)"
    )
    ids = iter(["old", None, "new"])  # down, then up again
    sizer.boot = lambda _n: next(ids, "new")
    sizer.allocate(alloc, ("job", 1), 2, 200.0)
    while sizer.nodes["a"].state == "waking" and time.monotonic() < deadline + 10:
        time.sleep(0.1)
        sizer.step(alloc, [], 201.0)
    assert sizer.nodes["a"].state == "on"


@pytest.mark.parametrize("stored", ["powering off", "waking", "wake failed"])
@pytest.mark.parametrize("answers", [True, False])
def test_a_restarted_daemon_asks_servers_whose_state_is_uncertain(
    tmp_path, stored, answers, monkeypatch
):
    rec, calls = _rec(tmp_path)
    probe = (lambda _n: None) if answers else (lambda _n: "refused")
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"], probe=probe)
    from datetime import UTC, datetime

    from orchestrator.daemon.energy import rightsizing

    monkeypatch.setattr(rightsizing, "PROBE_EVERY_S", 0.05)
    long_ago = datetime.fromtimestamp(time.time() - 3600, UTC)  # its wait is over
    sizer.restore(time.time(), {"a": {"power_state": stored, "power_since": long_ago}})
    deadline = time.monotonic() + 5
    while sizer.nodes["a"].busy and time.monotonic() < deadline:
        time.sleep(0.05)
    alloc.hold(("attempt", 1), "b", [0, 1])  # b busy, a not idle long: nothing to do
    sizer.step(alloc, [], time.time())
    gone = {"powering off": "off", "waking": "wake failed", "wake failed": "wake failed"}
    want = "on" if answers else gone[stored]
    assert sizer.nodes["a"].state == want and not calls.exists()


def test_a_server_whose_wake_failed_is_on_once_it_answers(tmp_path):
    from orchestrator.daemon.energy.rightsizing import RECHECK_S, WAKE_FAILED

    answering = []
    sizer, alloc, _db = _sizer(tmp_path, ["/bin/true"], ["/bin/true"],
                               probe=lambda _n: None if answering else "refused")  # fmt: skip
    sizer.restore(0.0, {})
    a = sizer.nodes["a"]
    a.state, a.retry_at_s, a.check_at_s = WAKE_FAILED, 1e9, 10.0
    answering.append(True)  # its power_on worked after all, late
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.step(alloc, [], 5.0)
    assert not a.busy and a.state == WAKE_FAILED, "not asked before its time"
    sizer.step(alloc, [], 10.0)
    deadline = time.monotonic() + 5
    while a.state != "on" and time.monotonic() < deadline:
        time.sleep(0.05)
        sizer.step(alloc, [], 11.0)
    assert a.state == "on" and a.check_at_s == 10.0 + RECHECK_S


def test_no_power_command_once_the_lease_is_lost(tmp_path):
    from orchestrator.daemon.lease import LeaseLost

    rec, calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])

    def lost(_session):
        raise LeaseLost("this daemon's lease expired or was taken over")

    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.lease_check = lost
    with pytest.raises(LeaseLost):
        sizer.allocate(alloc, ("job", 1), 2, 10.0)
    time.sleep(0.5)
    assert not calls.exists() and not sizer.nodes["a"].busy


def test_a_lost_lease_ends_the_waits_and_drops_their_outcome(tmp_path):
    rec, _calls = _rec(tmp_path)
    sizer, alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"],
                               probe=lambda _n: "refused", wake_timeout="30s")  # fmt: skip
    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.allocate(alloc, ("job", 1), 2, 10.0)
    assert sizer.nodes["a"].busy
    time.sleep(0.3)
    sizer.reset()  # what the daemon does when it stands by
    deadline = time.monotonic() + 5
    while sizer.nodes["a"].busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sizer.nodes["a"].busy, "the wait for an answer ended"
    assert sizer.nodes["a"].result is None, "its outcome is not this daemon's any more"


POWER = {"power_off": ["/bin/true"], "power_on": ["/bin/true"], "idle_off_after": "10m"}


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({**POWER, "wake": "10m", "wake_timeout": "5s"}, "wake_timeout 5s is shorter than wake"),
        ({**POWER, "power_timeout": "20m", "wake_timeout": "10m"}, "power_timeout 20m is longer"),
        ({"executor": "slurm", "gpu_idle_w": 40}, "gpu_idle_w is not counted on a Slurm node"),
        ({"executor": "slurm", "node_idle_w": 100}, "node_idle_w is not counted on a Slurm"),
        ({"executor": "slurm", "pue": 1.3}, "pue is not counted on a Slurm node"),
        ({**POWER, "power_off": ["/tmp/gridshift-nowhere/off.sh"]}, "No such file"),
        ({**POWER, "power_on": ["/usr"]}, "node n1: power_on '/usr': is not a regular file"),
        ({**POWER, "power_on": ["/etc/passwd"]}, "power_on '/etc/passwd': is not executable"),
        ({**POWER, "power_off": ["/bin/true/x"]}, "power_off '/bin/true/x': /bin/true/x: Not a"),
    ],
)
def test_bad_power_and_idle_settings_are_one_line_and_exit_2(cli, extra, why):
    from tests.test_rightsize_live import write_config

    node = {"name": "n1", "executor": "ssh", "host": "h", "gpus": 2, **extra}
    if node["executor"] == "slurm":
        node = {k: v for k, v in node.items() if k not in ("host",)} | {"partition": "p"}
    write_config(cli.home, [node])
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="checked when the daemon runs as root")
def test_a_power_program_or_config_others_may_write_is_refused_as_root(cli, tmp_path):
    from tests.test_rightsize_live import write_config

    open_dir = tmp_path / "anyone-can-write-here"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    script = open_dir / "off.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    node = {"name": "n1", "executor": "ssh", "host": "h", "gpus": 2, **POWER}
    for program, why in [(str(script), "writable by others than root"),
                         (str(_writable(tmp_path)), "group- or other-writable")]:  # fmt: skip
        write_config(cli.home, [{**node, "power_off": [program]}])
        proc = cli.run("nodes", check=False)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    write_config(cli.home, [node])
    assert cli.run("nodes", check=False).returncode == 0
    (cli.home / "gridshift.toml").chmod(0o666)
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and "names power commands but" in proc.stderr, proc.stderr


def test_a_power_program_no_one_can_run_is_refused_for_a_user_too(tmp_path, monkeypatch):
    from orchestrator.settings import trust

    monkeypatch.setattr(trust.os, "geteuid", lambda: 4242)  # a user's own daemon or CLI
    script = tmp_path / "on.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    assert trust.unrunnable(str(script)).startswith("is not executable")
    assert trust.unrunnable("/usr") == "is not a regular file (a directory)"
    assert "No such file" in trust.unrunnable(str(tmp_path / "nowhere"))
    script.chmod(0o755)
    assert trust.unrunnable(str(script)) is None and trust.unrunnable("/bin/true") is None


def _writable(tmp_path: Path) -> Path:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    closed.chmod(0o755)
    prog = closed / "off"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o777)
    return prog


def test_a_failed_wakes_reason_is_escaped_and_cut(tmp_path, caplog):
    from executors.sshlink import RemoteError

    sizer, alloc, _db = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], wake_timeout="1s")
    hostile = "node a: true: \x1b]0;owned\x07\x1b[2J" + "B" * 3000

    def boot(_n):
        raise RemoteError(hostile)  # a bug's exception text is no safer

    sizer.boot = boot
    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.allocate(alloc, ("job", 1), 2, 10.0)
    deadline = time.monotonic() + 10
    while sizer.nodes["a"].state == "waking" and time.monotonic() < deadline:
        time.sleep(0.05)
        sizer.step(alloc, [], 11.0)
    error = sizer.nodes["a"].error
    assert sizer.nodes["a"].state == "wake failed" and len(error) <= 220, len(error)
    assert "\x1b" not in error and "\\x1b]0;owned\\x07" in error
    assert not any("\x1b" in r.getMessage() for r in caplog.records if "wake failed" in
                   r.getMessage())  # fmt: skip


def test_right_sizing_keeps_to_the_gpu_type_a_job_asks_for(tmp_path):
    """An a100 job waits for the busy A100 server: the V100 server off is not woken for
    it; an idle A100 server is not powered off when an a100 job is due, although a V100
    server is on and free."""
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    rec, calls = _rec(tmp_path)
    sizer, _alloc, _db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"])
    sizer.restore(time.time() - 60, {})
    b = sizer.nodes["b"] = type(sizer.nodes["a"])(sizer.nodes["a"].cfg.model_copy(
        update={"name": "b"}))  # fmt: skip
    b.state, b.idle_since_s = "off", None
    b.check_at_s = time.time() + 3600  # not asked in this test whether it answers
    alloc = ClusterAllocator(ClusterTopology((NodeTopology.plain("a", 2, gpu="a100"),
                                              NodeTopology.plain("b", 2, gpu="v100"))))  # fmt: skip
    alloc.hold(("attempt", 1), "a", [0, 1])  # a (A100) busy; b (V100) off

    class Due:
        start_s, gpus = 0.0, 2

    class Job:
        id, gpus, gpu_type = 9, 2, "a100"

    _passes(sizer, alloc, time.time(), planned=[(Job, Due)])
    assert b.state == "off" and not calls.exists(), "V100 server woken for an a100 job"
    alloc.free(("attempt", 1))  # a idle now; b (V100) on and free; the a100 job due
    b.state = "on"
    sizer.nodes["a"].idle_since_s = time.time() - 60
    _passes(sizer, alloc, time.time(), planned=[(Job, Due)])
    assert sizer.nodes["a"].state == "on" and not calls.exists(), "A100 server powered off"


def test_report_since_counts_idle_energy_by_whole_utc_hour(cli):
    """``--since`` at 15:30 counts the 15:00 row (and later hours), not the 09:00 row of
    the same day, nor the day before; the text says how."""
    from datetime import UTC, datetime

    from orchestrator.queue.db import Database
    from orchestrator.queue.models import IdleUsage

    cli.run("status", check=False)  # the store exists
    db = Database(cli.db_url)
    db.ensure_schema()
    day = datetime(2026, 6, 10, tzinfo=UTC)
    kwh = {day.replace(day=9, hour=23): 1, day.replace(hour=9): 2, day.replace(hour=15): 4,
           day.replace(hour=16): 8}  # fmt: skip
    with db.write() as session:
        for hour, n in kwh.items():
            session.add(IdleUsage(node="n", hour=hour, energy_j=3.6e6 * n, carbon_g=None))
    report = cli.json("report", "--since", "2026-06-10T15:30Z")
    assert report["total"]["idle_energy_kwh"] == pytest.approx(12.0)
    assert report["idle"]["by_node"]["n"]["energy_kwh"] == pytest.approx(12.0)
    assert cli.json("report", "--since", "2026-06-10T09:00Z")["idle"]["energy_kwh"] == 14.0
    out = cli.run("report", "--since", "2026-06-10T15:30Z").stdout
    assert "idle: 12.000 kWh" in out and "by whole UTC hour" in out, out
