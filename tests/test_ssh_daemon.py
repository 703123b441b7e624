"""The daemon with SSH nodes, end to end: the real CLI and daemon, real sshd servers on
127.0.0.1 with fake ``nvidia-smi`` on their PATH (``tests/helpers/sshd.py``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import E2E, server_python
from tests.helpers.waiting import wait_for

# the SSH executor's tests: the store's part (jobs, attempts, lost and requeued) is the
# daemon's own, which test_cli_queue, test_crash_recovery and test_daemon_live run on both
pytestmark = [pytest.mark.slow, E2E, pytest.mark.backends("sqlite")]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def write_config(home: Path, nodes: list[dict], top: dict | None = None) -> None:
    lines = [f"{k} = {_toml_value(v)}" for k, v in (top or {}).items()]
    for node in nodes:
        lines.append("\n[[nodes]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in node.items()]
    (home / "gridshift.toml").write_text("\n".join(lines) + "\n")


def ssh_node(srv, servers, name: str, **extra) -> dict:
    return srv.node(name, servers.known_hosts, python=server_python(), lost_after="3s",
                    connect_timeout="2s", **extra)  # fmt: skip


# Names, arguments and environment full of shell syntax; the remote job writes what it
# received, and the canaries show whether anything else ran.
NASTY = "a;touch {c}1 $(touch {c}2) `touch {c}3` 'q' \"d\" \\ \n{{x}} && touch {c}4 | cat"
RECORD = (
    "import json, os, sys\n"
    "json.dump({'argv': sys.argv[1:], 'env': os.environ['NASTY'],\n"
    "           'name': os.environ['GRIDSHIFT_JOB_NAME'],\n"
    "           'gpus': os.environ['CUDA_VISIBLE_DEVICES']}, open(sys.argv[1], 'w'))\n"
    "print('hello from', os.environ['GRIDSHIFT_JOB_ID'])\n"
)


def test_user_values_reach_the_server_literally_and_nothing_else_runs(cli, ssh_servers, tmp_path):
    srv = ssh_servers(gpus=2)
    write_config(cli.home, [ssh_node(srv, ssh_servers, "gpu1")])
    short = Path(tempfile.mkdtemp(prefix="gs-"))  # a job name is at most 256 characters
    canary = short / "canary"
    nasty = NASTY.format(c=canary)
    out = tmp_path / "received.json"
    args = [str(out), nasty, "$(touch " + str(canary) + "5)", "`id`", "it's", "line\nbreak"]
    job = cli.submit("--name", nasty, "--gpus", "1", "--env", f"NASTY={nasty}",
                     "--", sys.executable, "-c", RECORD, *args)  # fmt: skip
    cli.run_until_idle(timeout=60)
    shown = cli.json("show", str(job))
    assert shown["state"] == "completed", shown
    got = json.loads(out.read_text())
    assert got == {"argv": args, "env": nasty, "name": nasty, "gpus": "0"}
    assert not list(short.glob("canary*")), "a shell ran something it was handed"
    short.rmdir()
    assert cli.run("logs", str(job)).stdout == f"hello from {job}\n", "read from the server"
    assert shown["energy_modelled"] is False, "the fake GPU's energy counter, over SSH"
    assert shown["energy_kwh"] > 0


def test_nodes_shows_what_nvidia_smi_says_and_a_bad_host_key_is_refused(cli, ssh_servers):
    good = ssh_servers(gpus=2)
    bad = ssh_servers(gpus=1)
    lines = ssh_servers.known_hosts.read_text().splitlines()
    other_key = good.known_hosts_line().split(" ", 1)[1]
    ssh_servers.known_hosts.write_text(  # the second server's entry holds the first's key
        f"{lines[0]}\n[127.0.0.1]:{bad.port} {other_key}"
    )
    write_config(cli.home, [ssh_node(good, ssh_servers, "good"), ssh_node(bad, ssh_servers, "bad")])
    nodes = {n["name"]: n for n in cli.json("nodes", "--refresh")}
    assert nodes["good"]["reachable"] is True and nodes["good"]["gpus"] == 2
    gpu = nodes["good"]["gpu_list"][0]
    assert gpu["model"] == "NVIDIA A100-SXM4-80GB" and gpu["memory_mb"] == 81920
    assert (gpu["power_min_w"], gpu["power_default_w"], gpu["power_max_w"]) == (100, 300, 300)
    assert nodes["bad"]["reachable"] is False
    assert "host key" in nodes["bad"]["error"].lower()
    assert "NODE" in cli.run("nodes").stdout


def test_power_caps_go_through_nvidia_smi_on_the_server(ssh_servers):
    from executors.sshlink import SshLink
    from orchestrator.nodes.powercaps import PowerCaps
    from orchestrator.nodes.ssh import gpu_control, ssh_target
    from orchestrator.settings import NodeConfig

    srv = ssh_servers(gpus=2)
    cfg = NodeConfig(**ssh_node(srv, ssh_servers, "gpu1"))
    link = SshLink(ssh_target(cfg))
    caps = PowerCaps(gpu_control(link), 2)
    assert caps.enabled, caps.reason
    assert caps.apply([1], 0.5) == 150.0
    caps.restore([1])
    assert srv.pl_calls()[-2:] == ["pl 1 150.00", "pl 1 300.00"]
    denied = ssh_servers(gpus=1, smi_flags=("--deny-pl",))
    cfg = NodeConfig(**ssh_node(denied, ssh_servers, "gpu2"))
    off = PowerCaps(gpu_control(SshLink(ssh_target(cfg))), 1)
    assert not off.enabled, "no permission: planned without caps"
    link.close()


# A job that trains in 0.25 s steps, checkpointing its step to a file in its working
# directory and resuming from it; it logs each start with the step it resumed from.
TRAIN = (
    "import os, sys, time\n"
    "ckpt = sys.argv[1]; steps = int(sys.argv[2])\n"
    "step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0\n"
    "with open(ckpt + '.starts', 'a') as fh: fh.write(f'{os.getpid()} {step}\\n')\n"
    "while step < steps:\n"
    "    time.sleep(0.25); step += 1\n"
    "    open(ckpt + '.tmp', 'w').write(str(step)); os.replace(ckpt + '.tmp', ckpt)\n"
    "    open(os.environ['GRIDSHIFT_PROGRESS_FILE'], 'w').write(f'{step} {steps}')\n"
)


def test_two_servers_pack_place_and_survive_one_going_away(cli, ssh_servers, tmp_path):
    a, b = ssh_servers(gpus=4), ssh_servers(gpus=4)
    write_config(cli.home, [ssh_node(a, ssh_servers, "a"), ssh_node(b, ssh_servers, "b")],
                 top={"daemon_interval_s": 0.2})  # fmt: skip
    singles = [cli.submit("--gpus", "1", "--", "sleep", "25") for _ in range(3)]
    ckpt = tmp_path / "wide.ckpt"
    wide = cli.submit("--gpus", "4", "--interruptible", "--name", "wide",
                      "--", sys.executable, "-c", TRAIN, str(ckpt), "40")  # fmt: skip
    daemon = cli.daemon()
    try:
        shown = {j: cli.wait_state(j, {"running"}, timeout=30) for j in [wide, *singles]}
        assert {shown[j]["node"] for j in singles} == {"a"}, "single-GPU jobs packed on a"
        assert shown[wide]["node"] == "b" and len(shown[wide]["gpu_ids"]) == 4
        wait_for(lambda: ckpt.exists() and int(ckpt.read_text()) >= 4, what="wide job progress")
        first_pid = int(ckpt.with_suffix(".ckpt.starts").read_text().split()[0])

        b.stop()  # b goes off the network; its job keeps running there, unreachable
        down_at = time.monotonic()
        quick = cli.submit("--gpus", "1", "--", "true")  # a's last GPU: the loop goes on
        assert cli.wait_state(quick, {"completed"}, timeout=15)["node"] == "a"
        lost = cli.wait_state(wide, {"queued"}, timeout=20)
        assert time.monotonic() - down_at >= 2.5, "lost only after lost_after (3 s)"
        events = [e["to"] for e in cli.json("show", str(wide))["events"]]
        assert events[-2:] == ["lost", "queued"], events
        assert lost["node"] in ("b", None)
        time.sleep(1.0)
        assert cli.json("show", str(wide))["state"] == "queued", "a has no room for 4 GPUs"

        b.start()  # back: the orphan is fenced, then b is used again
        again = cli.wait_state(wide, {"running", "completed"}, timeout=30)
        assert again["node"] == "b"
        wait_for(lambda: not _alive(first_pid), timeout_s=10, what="the orphan to be fenced")
        done = cli.wait_state(wide, {"completed"}, timeout=60)
        assert done["attempts"] == 2
        starts = [
            line.split() for line in ckpt.with_suffix(".ckpt.starts").read_text().splitlines()
        ]
        assert len(starts) == 2 and int(starts[1][1]) >= 4, "resumed from its checkpoint"
        atts = cli.db_rows(f"SELECT state FROM attempt WHERE job_id = {wide} ORDER BY number")
        assert [s for (s,) in atts] == ["lost", "exited"]
    finally:
        for j in singles:
            cli.run("cancel", str(j), check=False)
        daemon.terminate()
        daemon.wait(timeout=30)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not); it may go between the two looks."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def test_a_server_that_hangs_does_not_hold_the_others(ssh_servers, tmp_path):
    from executors.base import LaunchSpec, RunStatus
    from executors.ssh import SshExecutor
    from executors.sshlink import SshLink
    from orchestrator.nodes.ssh import ssh_target
    from orchestrator.settings import NodeConfig

    fast, slow = ssh_servers(gpus=1), ssh_servers(gpus=1)
    links = {
        name: SshLink(ssh_target(NodeConfig(**ssh_node(srv, ssh_servers, name))))
        for name, srv in (("fast", fast), ("slow", slow))
    }
    ex = SshExecutor(links, poll_wait_s=1.0)
    handles = {
        name: ex.launch(
            LaunchSpec(
                i,
                i,
                ["sleep", "30"],
                str(tmp_path),
                {"PATH": os.environ["PATH"]},
                [],
                str(tmp_path / f"{i}.log"),
                str(tmp_path / f"run-{i}"),
                node=name,
            )
        )
        for i, name in enumerate(links, start=1)
    }
    slow.freeze()
    try:
        for _ in range(3):  # three passes: each bounded, the fast server answers every time
            t0 = time.monotonic()
            ex.refresh(list(handles.values()))
            assert time.monotonic() - t0 < 2.0
            assert ex.poll(handles["fast"]).status is RunStatus.RUNNING
            assert ex.poll(handles["slow"]).status is RunStatus.UNREACHABLE
    finally:
        slow.thaw()
        for h in handles.values():
            ex.signal(h, 9)
        ex.close()


def test_fencing_kills_what_runs_and_stops_what_never_started(ssh_servers, tmp_path):
    from executors.base import Handle, LaunchSpec, RunStatus
    from executors.ssh import SshExecutor
    from executors.sshlink import SshLink
    from orchestrator.nodes.ssh import ssh_target
    from orchestrator.settings import NodeConfig

    srv = ssh_servers(gpus=1)
    cfg = NodeConfig(**ssh_node(srv, ssh_servers, "s"))
    ex = SshExecutor({"s": SshLink(ssh_target(cfg))})
    env = {"PATH": os.environ["PATH"]}
    spec = LaunchSpec(1, 1, ["sleep", "60"], str(tmp_path), env, [], str(tmp_path / "1.log"),
                      str(tmp_path / "run-1"), node="s")  # fmt: skip
    handle = ex.launch(spec)
    wait_for(lambda: Path(handle.data["remote_run_dir"], "job.json").exists(), what="job start")
    # as the reaper knows an attempt whose launch never answered: its id and node only
    assert ex.fence(Handle(1, spec.run_dir, {"node": "s"}))
    result = wait_for(lambda: (r := ex.poll(handle)).status is not RunStatus.RUNNING and r)
    assert result.exit_code == 137
    assert ex.fence(Handle(2, str(tmp_path / "run-2"), {"node": "s"}))
    claim = Path(cfg.remote_dir) / "run" / "attempt-2" / "claim"
    assert claim.read_text() == "abandoned", "a monitor arriving late will not start it"
    ex.close()
