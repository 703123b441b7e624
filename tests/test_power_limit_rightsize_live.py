"""The site power limit beside right-sizing, end to end: this host's two fake GPUs and a
real sshd server (``tests/helpers/sshd.py``, two fake GPUs behind a fake nvidia-smi)
whose ``power_off`` kills it and whose ``power_on`` boots it again, its GPUs back at
their default (highest) limit. The daemon powers the idle server off; a job that fits
only there wakes it, the running job's limits lowered first. Replaying both fakes'
limit histories (the server counted 0 W while off) never exceeds the limit."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import E2E, ROOT
from tests.helpers.waiting import wait_for
from tests.test_rightsize_live import POWER, _kill_server, write_config
from tests.test_ssh_daemon import ssh_node

pytestmark = [pytest.mark.slow, E2E, pytest.mark.backends("sqlite")]
LIMIT_W = 850.0  # 4 GPUs, 100-300 W: the server woken at 600 W leaves the other 2 at 100

# power.py (the right-sizing live test's: kill sshd, or start it again), wrapped: the
# server's events timed as the GPUs see them (off once killed; on before its GPUs boot)
BOOT = textwrap.dedent(
    """
    import subprocess, sys, time
    what, events, state, power, calls, root, repo = sys.argv[1:8]
    if what == "on":
        open(events, "a").write(f"on {time.time():.6f}\\n")
        sys.path.insert(0, repo)
        from executors.gpu.fake import FakeGpuControl
        ctl = FakeGpuControl(2, state_path=state)
        for i in range(2):  # a boot: each GPU at its default limit, the highest
            ctl.set_power_limit_w(i, 300.0)
    subprocess.run([sys.executable, power, what, calls, root], check=True)
    if what == "off":
        open(events, "a").write(f"off {time.time():.6f}\\n")
    """
)


def _history(path: Path) -> dict[str, list[list[float]]]:
    return json.loads(path.read_text()) if path.exists() else {}


def _replayed_max(local: dict, server: dict, events: list[tuple[str, float]]) -> float:
    """The largest sum of the limits in force at any moment once every GPU was set (the
    server counted 0 W between its power_off and its power_on), an increase first where
    two changes share a time."""
    changes = [(t, -w, f"l{g}", w) for g, ch in local.items() for t, w in ch]
    changes += [(t, -w, f"s{g}", w) for g, ch in server.items() for t, w in ch]
    changes += [(t, 0.0, what, None) for what, t in events]
    now: dict[str, float] = {}
    on, worst = True, 0.0
    for _t, _neg, what, w in sorted(changes, key=lambda c: (c[0], c[1])):
        if w is None:
            on = what == "on"
            continue
        now[what] = w
        if len(now) == 4:
            worst = max(worst, sum(v for k, v in now.items() if on or k[0] == "l"))
    return worst


def test_the_site_limit_holds_while_a_server_is_powered_off_and_woken(cli, ssh_servers, tmp_path):
    srv = ssh_servers(gpus=2)
    (tmp_path / "power.py").write_text(POWER)
    (tmp_path / "boot.py").write_text(BOOT)
    events = tmp_path / "events"
    argv = [sys.executable, str(tmp_path / "boot.py")]
    rest = [str(events), str(srv.gpu_state), str(tmp_path / "power.py"),
            str(tmp_path / "calls"), str(srv.root), str(ROOT)]  # fmt: skip
    server = ssh_node(
        srv, ssh_servers, "gpu1", power_off=[*argv, "off", *rest], power_on=[*argv, "on", *rest],
        idle_off_after="1s", wake="1s", wake_timeout="30s", power_timeout="20s",
    )  # fmt: skip
    here = {"name": "here", "executor": "local", "fake_gpus": 2}
    write_config(cli.home, [here, server], top={"daemon_interval_s": 0.2})
    daemon = cli.daemon("--power-limit", f"{LIMIT_W:g}W")
    try:
        wait_for(lambda: events.exists() and events.read_text().startswith("off"),
                 timeout_s=30, what="the idle server powered off")  # fmt: skip
        gate = tmp_path / "gate"  # here's job runs until the one woken for has run
        wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"
        held = cli.submit("--gpus", "2", "--", sys.executable, "-c", wait)  # at full power
        cli.wait_state(held, {"running"}, timeout=30)
        woken = cli.submit("--gpus", "2", "--", "sleep", "1")  # fits only on gpu1
        done = cli.wait_state(woken, {"completed", "failed"}, timeout=60)
        gate.touch()
        assert done["state"] == "completed" and done["node"] == "gpu1", done
        assert cli.wait_state(held, {"completed"}, timeout=60)["node"] == "here"
        site = cli.json("status")["power_limit"]
        assert site["limit_w"] == LIMIT_W and site["in_force_w"] <= LIMIT_W
    finally:
        (tmp_path / "gate").touch()
        daemon.terminate()
        daemon.wait(timeout=30)
        _kill_server(srv, server)
    seen = [(w, float(t)) for w, t in (ln.split() for ln in events.read_text().splitlines())]
    assert [w for w, _ in seen][:2] == ["off", "on"], seen
    local, remote = _history(cli.home / "fake-gpus.json"), _history(srv.gpu_state)
    assert _replayed_max(local, remote, seen) <= LIMIT_W + 1e-6, (local, remote, seen)
    at = lambda ch, t: max((c for c in ch if c[0] <= t), default=[0, 300.0])[1]  # noqa: E731
    lowered = sum(at(ch, seen[1][1]) for ch in local.values())
    assert lowered <= LIMIT_W - 600.0, local  # the running job lowered before power_on
    assert max(w for ch in local.values() for _, w in ch) > 100.5  # it ran above that


def test_a_limit_that_could_never_wake_a_server_left_off_is_one_line_and_exit_2(cli):
    """A server a daemon left off counts 0 W at start, its GPUs' range as discovery stored
    it (never read: refused, saying how to fix it): a limit under its GPUs at their
    highest plus this host's at their lowest could never wake it, and is refused; one
    that can starts."""
    import sqlite3

    far = {"name": "far", "executor": "ssh", "host": "127.0.0.1", "port": 1, "gpus": 2,
           "connect_timeout": "1s", "idle_off_after": "1s", "power_off": ["/bin/true"],
           "power_on": ["/bin/true"]}  # fmt: skip
    here = {"name": "here", "executor": "local", "fake_gpus": 2}
    write_config(cli.home, [here, far], top={"daemon_interval_s": 0.2})
    cli.run("daemon", "--until-idle")  # the node rows
    path = cli.db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:  # a daemon left it off
        con.execute("UPDATE node SET power_state = 'off' WHERE name = 'far'")
    proc = cli.run("daemon", "--until-idle", "--power-limit", "800W", check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("gridshift: error")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert errors[0].endswith("its GPUs' power limit range was never read: power it on once "
                              "(gridshift discovers its GPUs) before starting the daemon with "
                              "a site limit")  # fmt: skip
    with sqlite3.connect(path) as con:  # what discovery read while it was on
        con.execute("DELETE FROM gpu WHERE node = 'far'")
        for i in (0, 1):
            con.execute("INSERT INTO gpu (node, \"index\", uuid, model, power_min_w, power_max_w, "
                        "power_default_w) VALUES ('far', ?, ?, 'NVIDIA A40', 100, 300, 300)",
                        (i, f"far{i}"))  # fmt: skip
    proc = cli.run("daemon", "--until-idle", "--power-limit", "700W", check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("gridshift: error")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert errors[0].endswith(
        "700 W could never wake node far (right-sized): its 2 GPUs at their highest limits "
        "(600 W) and the GPUs of the servers not right-sized at their lowest (200 W) exceed "
        "it, every other right-sized server off"
    )
    assert cli.run("daemon", "--until-idle", "--power-limit", "800W").returncode == 0
