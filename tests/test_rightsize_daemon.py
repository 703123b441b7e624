"""Right-sizing and idle energy on the live daemon, without servers: the power command
runner (a command that hangs, fails, prints garbage), the ``RightSizer``'s transitions on
a real store with a stand-in for the server's answer, the idle-energy ledger by hand,
and the config's bad power settings (one line, exit 2; the CLI never runs them)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.daemon.energy.powercmd import run_power_command
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology
from tests.helpers.rightsize import _row, _settle, _sizer

pytestmark = pytest.mark.backends("sqlite")
PY = sys.executable


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return [PY, str(path)]


# -- the command runner ----------------------------------------------------------------
def test_a_command_that_works_runs_with_the_daemons_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = tmp_path / "env"
    argv = _script(
        tmp_path, "env", f"import os, json; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    )
    got = run_power_command(argv, 10)
    assert got.ok and got.detail == "exit 0"
    import json

    env = json.loads(out.read_text())
    assert env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin" and "LD_PRELOAD" not in env


def test_a_failing_command_says_why_in_one_escaped_line_of_its_output(tmp_path):
    garbage = (
        "import sys; sys.stdout.buffer.write(b'\\x00\\xff' * 5000 + b'\\n' * 3"
        " + b'x\\x1b[2J' * 100 + b'\\n'); sys.exit(3)"
    )
    got = run_power_command(_script(tmp_path, "bad", garbage), 10)
    assert not got.ok and got.detail.startswith("python") and "exit 3: x\\x1b[2J" in got.detail
    assert "\n" not in got.detail and "\x1b" not in got.detail and len(got.detail) < 250


def test_a_command_that_hangs_is_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "child"
    body = (
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    got = run_power_command(_script(tmp_path, "hang", body), 1.0)
    assert time.monotonic() - t0 < 8
    assert not got.ok and "still running after 1s: killed" in got.detail
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    )


def test_a_command_that_cannot_run_is_a_failure_not_a_crash(tmp_path):
    got = run_power_command([str(tmp_path / "missing")], 5)
    assert not got.ok and got.detail.startswith("cannot run")


# -- the RightSizer on a real store ------------------------------------------------------
def test_idle_server_off_then_packing_prefers_servers_on_and_wakes_one_only_when_needed(tmp_path):
    calls = tmp_path / "calls"
    rec = _script(
        tmp_path, "rec", f"import sys; open({str(calls)!r}, 'a').write(sys.argv[1] + '\\n')"
    )

    def probe(_name):  # the server answers while on
        return "refused" if calls.exists() and calls.read_text().endswith("off\n") else None

    sizer, alloc, db = _sizer(tmp_path, [*rec, "off"], [*rec, "on"], probe=probe)
    sizer.restore(100.0, {})
    alloc.hold(("attempt", 1), "b", [0])  # b is busy: only a may go off
    sizer.step(alloc, [], 100.0)
    assert sizer.nodes["a"].state == "on", "idle for less than idle_off_after"
    t0 = time.monotonic()
    sizer.step(alloc, [], 101.5)
    assert time.monotonic() - t0 < 0.5, "the pass does not wait for the command"
    _settle(sizer, alloc, 101.6, "off")
    assert calls.read_text() == "off\n" and _row(db, "a") == ("off", None)
    got = sizer.allocate(alloc, ("job", 7), 1, 102.0)  # fits on b, which is on
    assert got is not None and got.parts[0][0] == "b"
    assert sizer.nodes["a"].state == "off" and calls.read_text() == "off\n"
    assert sizer.allocate(alloc, ("job", 8), 2, 102.0) is None, "only a holds 2: it waits"
    assert sizer.nodes["a"].state == "waking"
    _settle(sizer, alloc, 103.0, "on")
    assert calls.read_text() == "off\non\n" and _row(db, "a") == ("on", None)
    assert sizer.allocate(alloc, ("job", 8), 2, 103.1).parts[0][0] == "a"


def test_a_wake_that_hangs_or_fails_marks_the_node_and_is_retried_later(tmp_path):
    hang = _script(tmp_path, "hang", "import time; time.sleep(60)")
    ok = _script(tmp_path, "ok", "pass")
    sizer, alloc, db = _sizer(tmp_path, ok, hang)
    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"
    alloc.hold(("attempt", 1), "b", [0, 1])
    assert sizer.allocate(alloc, ("job", 1), 2, 10.0) is None
    t0 = time.monotonic()
    _settle(sizer, alloc, 12.0, "wake failed")
    assert time.monotonic() - t0 < 8
    state, error = _row(db, "a")
    assert state == "wake failed" and "still running after 1s: killed" in error
    assert sizer.allocate(alloc, ("job", 1), 2, 13.0) is None
    assert sizer.nodes["a"].state == "wake failed", "not retried before its back-off"
    sizer.allocate(alloc, ("job", 1), 2, 12.0 + 61.0)
    assert sizer.nodes["a"].state == "waking", "retried after it"


def test_a_woken_server_that_never_answers_is_a_failed_wake(tmp_path):
    ok = _script(tmp_path, "ok", "pass")
    sizer, alloc, db = _sizer(tmp_path, ok, ok, probe=lambda _n: "connection refused")
    sizer.restore(0.0, {})
    sizer.nodes["a"].state = "off"
    alloc.hold(("attempt", 1), "b", [0, 1])
    sizer.allocate(alloc, ("job", 1), 1, 10.0)
    _settle(sizer, alloc, 20.0, "wake failed")
    assert _row(db, "a")[1] == "power_on: no answer within 2s", "said once"


def test_a_resumed_wake_that_gets_no_answer_says_why_once(tmp_path):
    from datetime import UTC, datetime

    ok = _script(tmp_path, "ok", "pass")
    refused = "ssh: connect to host h: Connection refused"  # the probe's words, once
    sizer, alloc, db = _sizer(tmp_path, ok, ok, probe=lambda _n: refused)
    since = datetime(2026, 1, 1, tzinfo=UTC)  # a wake a previous daemon sent, long over
    sizer.restore(since.timestamp() + 100, {"a": {"power_state": "waking", "power_since": since}})
    _settle(sizer, alloc, since.timestamp() + 101, "wake failed")
    assert _row(db, "a")[1] == f"power_on: no answer within 2s ({refused})"


def test_a_power_off_that_fails_leaves_the_server_on(tmp_path):
    bad = _script(tmp_path, "bad", "print('ipmi: \\x07 no route'); raise SystemExit(1)")
    sizer, alloc, db = _sizer(tmp_path, bad, bad)
    sizer.restore(0.0, {})
    sizer.step(alloc, [], 0.0)
    sizer.step(alloc, [], 5.0)
    deadline = time.monotonic() + 10
    while sizer.nodes["a"].busy or sizer.nodes["a"].state != "on":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        sizer.step(alloc, [], 5.0)
    assert _row(db, "a") == ("on", f"power_off: {Path(PY).name}: exit 1: ipmi: \\x07 no route")


# -- idle energy -------------------------------------------------------------------------
def test_idle_energy_by_hand(tmp_path):
    from datetime import UTC, datetime

    from orchestrator.accounting.reports import idle_energy
    from orchestrator.daemon.energy.idle import IdleMeter
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Node
    from orchestrator.settings.nodes import NodeConfig

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        for name in ("a", "b", "s"):
            session.add(Node(name=name, executor="ssh", gpus=4, gpu_source="config",
                             updated_at=datetime.now(UTC)))  # fmt: skip
    configs = {
        "a": NodeConfig(
            name="a", executor="ssh", host="h", gpu_idle_w=40, node_idle_w=100, pue=1.5
        ),
        "b": NodeConfig(name="b", executor="ssh", host="h", gpu_idle_w=40, node_idle_w=100),
    }
    meter = IdleMeter(db, {"a": "ssh", "b": "ssh", "s": "slurm"}, configs, pue=1.2,
                      carbon=lambda a, b: 200.0 * (b - a))  # 200 g/kWh  # fmt: skip
    topo = ClusterTopology(tuple(NodeTopology.plain(n, 4) for n in ("a", "b", "s")))
    alloc = ClusterAllocator(topo)
    alloc.hold(("attempt", 1), "a", [0])  # a: 3 idle GPUs, busy server
    t0 = 1_700_000_000.0
    meter.step(alloc, t0)
    meter.step(alloc, t0 + 10)
    # a: (3 x 40 W + 100 W x 3/4) x 1.5 = 292.5 W; b: (4 x 40 + 100) x 1.2 = 312 W;
    # s (Slurm): not counted
    got = idle_energy(db.read().__enter__(), None)
    assert got["by_node"]["a"]["energy_kwh"] == pytest.approx(2925 / 3.6e6, abs=2e-6)
    assert got["by_node"]["b"]["energy_kwh"] == pytest.approx(3120 / 3.6e6, abs=2e-6)
    assert "s" not in got["by_node"]
    assert got["carbon_kg"] == pytest.approx((6045 / 3.6e6) * 200 / 1e3, abs=2e-6)
    meter.step(alloc, t0 + 10 + 3600)  # a daemon away for an hour: 5 minutes at most
    got = idle_energy(db.read().__enter__(), None)
    assert got["by_node"]["a"]["energy_kwh"] == pytest.approx(292.5 * 310 / 3.6e6, abs=2e-6)


def _one_idle_ssh_node(tmp_path):
    """A store with one SSH server "a" (one GPU idle at 100 W, no draw of its own), and
    its config."""
    from datetime import UTC, datetime

    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Node
    from orchestrator.settings.nodes import NodeConfig

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        session.add(Node(name="a", executor="ssh", gpus=1, gpu_source="config",
                         updated_at=datetime.now(UTC)))  # fmt: skip
    return db, {"a": NodeConfig(name="a", executor="ssh", host="h", gpu_idle_w=100, node_idle_w=0)}


def test_a_stretch_over_an_hours_end_is_split_between_the_two_hours(tmp_path):
    """The ledger is per node and UTC hour: 4 s before 15:00 and 6 s after go to the
    14:00 and 15:00 rows, each with its own energy and carbon; a stretch over several
    hours is cut at each hour."""
    from datetime import UTC, datetime

    from sqlmodel import select

    from orchestrator.daemon.energy.idle import IdleMeter, _hours
    from orchestrator.queue.models import IdleUsage

    db, cfg = _one_idle_ssh_node(tmp_path)
    meter = IdleMeter(db, {"a": "ssh"}, cfg, carbon=lambda a, b: 200.0 * (b - a))
    alloc = ClusterAllocator(ClusterTopology((NodeTopology.plain("a", 1),)))
    three = datetime(2026, 11, 24, 15, tzinfo=UTC)
    meter.step(alloc, three.timestamp() - 4)
    meter.step(alloc, three.timestamp() + 6)  # 10 s at 100 W: flushed
    with db.read() as session:
        rows = {r.hour: r for r in session.exec(select(IdleUsage)).all()}
    assert sorted(rows) == [three.replace(hour=14), three]
    assert rows[three.replace(hour=14)].energy_j == pytest.approx(400.0)
    assert rows[three].energy_j == pytest.approx(600.0)
    assert rows[three].carbon_g == pytest.approx(600.0 * 200 / 3.6e6)
    t = three.timestamp()
    assert list(_hours(t - 1800, t + 3600 + 60)) == [
        (t - 1800, t), (t, t + 3600), (t + 3600, t + 3660)
    ]  # fmt: skip


# -- the config ----------------------------------------------------------------------------
BAD = {
    "relative program": (
        {"power_off": ["ipmitool", "off"], "power_on": ["/bin/true"]},
        "absolute path",
    ),
    "empty command": ({"power_off": [], "power_on": ["/bin/true"]}, "1 to 64 arguments"),
    "a string, not a list": ({"power_off": "/bin/true", "power_on": ["/bin/true"]}, "valid list"),
    "one command only": ({"power_off": ["/bin/true"]}, "needs both power_off and power_on"),
    "bad idle_off_after": (
        {"power_off": ["/bin/true"], "power_on": ["/bin/true"], "idle_off_after": "soon"},
        "invalid duration",
    ),
    "negative idle draw": ({"gpu_idle_w": -5}, "gpu_idle_w"),
    "pue below 1": ({"pue": 0.5}, "pue"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_power_settings_are_one_line_and_exit_2(cli, case):
    from tests.test_rightsize_live import write_config

    extra, expected = BAD[case]
    write_config(cli.home, [{"name": "n1", "executor": "ssh", "host": "h", "gpus": 2, **extra}])
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_power_commands_are_for_ssh_servers_and_users_cli_never_runs_them(cli, tmp_path):
    from tests.test_rightsize_live import write_config

    for executor, why in (
        ("local", "the daemon's own host"),
        ("slurm", "Slurm's own power saving"),
    ):
        node = {"name": "n1", "executor": executor, "gpus": 2,
                "power_off": ["/bin/true"], "power_on": ["/bin/true"]}  # fmt: skip
        write_config(cli.home, [node])
        proc = cli.run("nodes", check=False)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    canary = tmp_path / "ran"
    touch = [PY, "-c", f"open({str(canary)!r}, 'w')"]
    write_config(cli.home, [{"name": "n1", "executor": "ssh", "host": "127.0.0.1", "port": 1,
                             "gpus": 2, "power_off": touch, "power_on": touch,
                             "idle_off_after": "1s", "connect_timeout": "1s"}])  # fmt: skip
    for args in (["nodes", "--refresh"], ["submit", "--gpus", "1", "--", "true"], ["ls"]):
        cli.run(*args, check=False)
    assert not canary.exists(), "only the daemon runs power commands"


def test_idle_draw_measured_through_the_energy_counters_when_not_configured(tmp_path):
    from datetime import UTC, datetime

    from executors.gpu.fake import FakeGpuControl
    from orchestrator.daemon.energy.idle import IdleMeter
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import IdleUsage, Node

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        session.add(Node(name="local", executor="local", gpus=4, gpu_source="fake",
                         updated_at=datetime.now(UTC)))  # fmt: skip
    t0 = 1_700_000_000.0
    clock = [t0]
    ctl = FakeGpuControl(4, power_w=30.0, clock=lambda: clock[0])  # each draws 30 W
    meter = IdleMeter(db, {"local": "local"}, {}, local_ctl=ctl)
    alloc = ClusterAllocator(ClusterTopology((NodeTopology.plain("local", 4),)))
    for dt in (0.0, 10.0, 20.0):
        clock[0] = t0 + dt
        meter.step(alloc, t0 + dt)
    with db.read() as session:
        (row,) = session.exec(__import__("sqlmodel").select(IdleUsage)).all()
    # 10 s at the default (4 x 50 W + 150 W host), then 10 s as measured (4 x 30 W + 150 W)
    assert row.energy_j == pytest.approx(3500 + 2700)
    assert meter.draw_w("local", 4, 1) == pytest.approx(3 * 30 + 150 * 3 / 4), "3 idle GPUs"


def test_idle_energy_is_never_counted_twice_by_two_daemons(tmp_path):
    """A second daemon (a takeover) counting a stretch the first already wrote adds only
    what lies after the node's idle_until."""

    from orchestrator.accounting.reports import idle_energy
    from orchestrator.daemon.energy.idle import IdleMeter

    db, cfg = _one_idle_ssh_node(tmp_path)
    alloc = ClusterAllocator(ClusterTopology((NodeTopology.plain("a", 1),)))
    first, second = (IdleMeter(db, {"a": "ssh"}, cfg) for _ in range(2))
    t0 = 1_700_000_000.0
    first.step(alloc, t0)
    first.step(alloc, t0 + 10)  # written: [t0, t0 + 10] at 100 W
    second.step(alloc, t0 + 5)
    second.step(alloc, t0 + 15)  # [t0 + 5, t0 + 15]: only its last 5 s are new
    with db.read() as session:
        assert idle_energy(session, None)["energy_kwh"] == pytest.approx(1500 / 3.6e6, abs=1e-6)


def test_a_daemon_that_stops_kills_the_power_commands_under_way(tmp_path):
    import threading

    from orchestrator.daemon.energy.powercmd import kill_running

    got = []
    hang = _script(tmp_path, "hang", "import time; time.sleep(60)")
    thread = threading.Thread(target=lambda: got.append(run_power_command(hang, 60)))
    thread.start()
    time.sleep(0.5)
    kill_running()
    thread.join(10)
    assert not thread.is_alive() and not got[0].ok and "signal 9" in got[0].detail


def test_discovery_leaves_servers_that_are_off_alone(tmp_path):
    from orchestrator.daemon.energy.levers import Levers

    ok = _script(tmp_path, "ok", "pass")
    sizer, _alloc, _db = _sizer(tmp_path, ok, ok)
    levers = Levers(sizer, idle=None)
    links = {"a": "link-a", "b": "link-b"}
    assert levers.awake(links) == links
    sizer.nodes["a"].state = "off"
    assert levers.awake(links) == {"b": "link-b"}, "b is not managed: always asked"


@pytest.mark.parametrize("value", ["0.5", "6", "nan", '"high"'])
def test_a_bad_daemon_pue_is_one_line_and_exit_2(cli, value):
    (cli.home / "gridshift.toml").write_text(f"[daemon]\npue = {value}\n")
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and "pue" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# -- what the live planner counts for keeping a server on -----------------------------------
def test_idle_cost_of_the_cluster_with_right_sizing(tmp_path):
    from types import SimpleNamespace

    from orchestrator.daemon.energy.levers import Levers

    ok = _script(tmp_path, "ok", "pass")
    sizer, _alloc, db = _sizer(tmp_path, ok, ok, gpu_idle_w=40, node_idle_w=100)
    configs = {n: p.cfg for n, p in sizer.nodes.items()}
    from orchestrator.daemon.energy.idle import IdleMeter

    meter = IdleMeter(db, {"a": "ssh", "b": "ssh"}, configs)
    nodes = [SimpleNamespace(name=n, executor="ssh", gpu_count=2) for n in ("a", "b")]
    # a: 2 x 40 + 100 = 180 W; b (defaults): 2 x 50 + 150 = 250 W; over 4 GPUs
    per_gpu_w, wait_s = Levers(sizer, meter).idle_cost(nodes)
    assert per_gpu_w == pytest.approx(430 / 4)
    assert wait_s is None, "b is never powered off: a wait keeps it on"
    assert Levers(None, meter).idle_cost(nodes) is None, "counted with right-sizing only"


def test_the_live_planner_counts_idle_servers_for_a_job_that_would_wait():
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from tests.test_budget_pacing import NOW_S, T0, _feed, _job

    def start_h(idle_cost) -> float:
        feed, _ = _feed()  # 400 g/kWh, 100 only from +12 h to +14.5 h
        planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for(None), feed=feed)
        planner.idle_cost = idle_cost
        planner.schedule(T0, [_job(1)], {}, [], 4, 4, 0.0)
        return (planner._plan[1].start_s - NOW_S) / 3600

    assert start_h(None) >= 12, "without the idle cost it waits for the low window"
    assert start_h((2000.0, None)) < 1, "4 GPUs idle 12 h cost more than the window saves"


def test_a_restarted_daemon_keeps_power_states_and_idle_cursors(tmp_path):
    """``sync_inventory`` replaces the node rows at start: what right-sizing and the idle
    ledger stored on them is carried over (a server left off stays off, a stretch already
    counted is not counted again)."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from orchestrator.daemon.energy.idle import IdleMeter
    from orchestrator.daemon.energy.levers import Levers
    from orchestrator.nodes.inventory import sync_inventory
    from orchestrator.queue.models import Node

    ok = _script(tmp_path, "ok", "pass")
    sizer, _alloc, db = _sizer(tmp_path, ok, ok)
    cursor = datetime(2026, 11, 24, 5, 0, tzinfo=UTC)
    with db.write() as session:
        a, b = session.get(Node, "a"), session.get(Node, "b")
        a.power_state, a.power_error, a.idle_until = "off", None, cursor
        b.idle_until = cursor
        session.add_all([a, b])
    levers = Levers(sizer, IdleMeter(db, {"a": "ssh", "b": "ssh"}, {}))
    kept = levers.remember()
    fields = dict(executor="ssh", gpu_count=2, gpu_model=None, rack=None, host="h",
                  gpu_source="config", gpus=[])  # fmt: skip
    resolved = [SimpleNamespace(name=n, **fields) for n in ("a", "b")]
    with db.write() as session:
        sync_inventory(session, resolved, datetime.now(UTC))
    levers.start(datetime.now(UTC).timestamp(), kept)
    assert sizer.nodes["a"].state == "off"
    with db.read() as session:
        rows = {n: session.get(Node, n) for n in ("a", "b")}
        assert rows["a"].power_state == "off" and rows["a"].idle_until == cursor
        assert rows["b"].idle_until == cursor and rows["b"].power_state is None


def test_nodes_refresh_does_not_ask_a_server_right_sizing_powered_off(cli):
    import json
    from datetime import UTC, datetime

    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Node
    from tests.test_rightsize_live import write_config

    down = {"executor": "ssh", "host": "127.0.0.1", "port": 1, "gpus": 2,
            "connect_timeout": "1s"}  # fmt: skip
    write_config(cli.home, [{"name": "off1", **down}, {"name": "on1", **down}])
    cli.run("status", check=False)  # the store exists
    db = Database(cli.db_url)
    db.ensure_schema()
    with db.write() as session:
        for name, state in (("off1", "off"), ("on1", None)):
            session.add(Node(name=name, executor="ssh", gpus=2, gpu_source="config",
                             updated_at=datetime.now(UTC), power_state=state))  # fmt: skip
    rows = {r["name"]: r for r in json.loads(cli.run("nodes", "--refresh", "--json").stdout)}
    assert rows["on1"]["reachable"] is False and rows["on1"]["error"], rows["on1"]  # asked
    assert rows["off1"]["power"] == "off" and rows["off1"]["error"] is None, rows["off1"]


def test_a_failing_energy_step_is_logged_once_per_reason_and_swallowed(caplog):
    """The energy levers' and the co-location moves' steps (``OncePerReason``): any
    failure, the store's too, never ends the pass; a new reason is said again."""
    import logging

    from orchestrator.daemon.contain import OncePerReason
    from orchestrator.errors import StoreError

    faults = OncePerReason(logging.getLogger("gs.test"), "energy levers", "the daemon goes on")
    with caplog.at_level("ERROR", logger="gs.test"):
        for exc in (StoreError("the store went away"), StoreError("the store went away"),
                    RuntimeError("a bug")):  # fmt: skip
            with faults.step():
                raise exc
        with faults.step():
            pass  # well again: the same reason is said once more
        with faults.step():
            raise StoreError("the store went away")
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "energy levers: StoreError: the store went away (the daemon goes on)",
        "energy levers: RuntimeError: a bug (the daemon goes on)",
        "energy levers: StoreError: the store went away (the daemon goes on)",
    ]
    assert not caplog.records[0].exc_info and caplog.records[1].exc_info  # a bug: traced
