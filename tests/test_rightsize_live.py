"""Right-sizing on the live daemon, end to end: a real sshd server (``tests/helpers/sshd.py``)
whose ``power_off`` command (a script that records its calls) kills it and whose
``power_on`` command starts it again, so the server answers only once woken. The daemon
powers it off once idle, a job placed on it wakes it, and the job completes; ``nodes``
shows the power state, ``report`` the idle energy."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import E2E
from tests.helpers.waiting import wait_for
from tests.test_ssh_daemon import _toml_value, ssh_node


def write_config(home: Path, nodes: list[dict], top: dict | None = None) -> None:
    """As ``test_ssh_daemon.write_config``, with lists (a JSON list of strings is TOML)."""
    import json

    def value(v) -> str:
        return json.dumps(v) if isinstance(v, list) else _toml_value(v)

    lines = [f"{k} = {value(v)}" for k, v in (top or {}).items()]
    for node in nodes:
        lines += ["", "[[nodes]]", *(f"{k} = {value(v)}" for k, v in node.items())]
    (home / "gridshift.toml").write_text("\n".join(lines) + "\n")


pytestmark = [pytest.mark.slow, E2E, pytest.mark.backends("sqlite")]

# power_off: record the call, then kill the server's sshd (listener and sessions), as a
# machine going off does; power_on: record it, then start sshd again (it daemonizes: the
# command ends once it listens)
POWER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    what, calls, root = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(calls, "a") as fh:
        fh.write(f"{what} {time.time():.3f}\\n")
    pid = int(open(os.path.join(root, "sshd.pid")).read()) if what == "off" else None
    if what == "off":
        kids = {}
        for e in os.listdir("/proc"):
            if e.isdigit():
                try:
                    st = open(f"/proc/{e}/stat").read()
                except OSError:
                    continue
                kids.setdefault(int(st[st.rindex(")") + 2:].split()[1]), []).append(int(e))
        todo, found = [pid], []
        while todo:
            p = todo.pop(); found.append(p); todo += kids.get(p, [])
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        subprocess.run(["/usr/sbin/sshd", "-f", os.path.join(root, "sshd_config")], check=True)
    """
)


def _power_node(srv, servers, tmp_path: Path, **extra) -> tuple[dict, Path]:
    script = tmp_path / "power.py"
    script.write_text(POWER)
    calls = tmp_path / "power.calls"
    argv = [sys.executable, str(script)]
    node = ssh_node(
        srv, servers, "gpu1",
        power_off=[*argv, "off", str(calls), str(srv.root)],
        power_on=[*argv, "on", str(calls), str(srv.root)],
        idle_off_after="1s", wake="1s", wake_timeout="30s", power_timeout="20s",
        gpu_idle_w=40, node_idle_w=100, **extra,
    )  # fmt: skip
    return node, calls


def _calls(path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    return [(w, float(t)) for w, t in (line.split() for line in path.read_text().splitlines())]


def _kill_server(srv, node: dict) -> None:
    """The sshd that power_on started (daemonized: no fixture owns it), and its sessions."""
    if (srv.root / "sshd.pid").exists():
        subprocess.run(node["power_off"], check=False, timeout=30)


def test_an_idle_server_is_powered_off_and_woken_for_a_job(cli, ssh_servers, tmp_path):
    srv = ssh_servers(gpus=2)
    node, calls = _power_node(srv, ssh_servers, tmp_path)
    write_config(cli.home, [node], top={"daemon_interval_s": 0.2})
    daemon = cli.daemon()
    try:
        wait_for(lambda: [w for w, _ in _calls(calls)] == ["off"], timeout_s=20,
                 what="the idle server powered off")  # fmt: skip
        wait_for(lambda: cli.json("nodes")[0]["power"] == "off", timeout_s=10, what="state off")
        daemon.terminate()  # a daemon started again finds the server off, as left
        daemon.wait(timeout=30)
        daemon = cli.daemon()
        time.sleep(1.0)
        shown = cli.run("nodes").stdout  # the STATE column
        assert " off " in shown and "powering" not in shown and " on " not in shown, shown
        assert [w for w, _ in _calls(calls)] == ["off"], "an off server stays off while idle"

        out = tmp_path / "ran"
        job = cli.submit("--gpus", "1", "--", sys.executable, "-c",
                         f"open({str(out)!r}, 'w').write('ok')")  # fmt: skip
        done = cli.wait_state(job, {"completed", "failed"}, timeout=120)
        assert done["state"] == "completed", done
        assert done["node"] == "gpu1" and out.read_text() == "ok"
        woke = _calls(calls)
        assert [w for w, _ in woke][:2] == ["off", "on"], woke
        started = done["runs"][0]["started_at"] if done.get("runs") else None
        assert started is not None
        from datetime import datetime

        assert datetime.fromisoformat(started).timestamp() >= woke[1][1], "launched once woken"
        daemon.terminate()  # a stopped daemon has written its idle energy
        daemon.wait(timeout=30)
        report = cli.json("report")
        assert report["total"]["idle_energy_kwh"] > 0, report["idle"]
        assert set(report["idle"]["by_node"]) == {"gpu1"}
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        _kill_server(srv, node)


def test_a_failing_wake_marks_the_server_and_the_daemon_goes_on(cli, tmp_path):
    """A server whose power_on fails (printing garbage): marked ``wake failed`` with one
    escaped line, its job waits, and a job elsewhere runs meanwhile."""
    calls = tmp_path / "calls"
    off = [sys.executable, "-c", f"open({str(calls)!r}, 'a').write('off\\n')"]
    garbage = "sys.stdout.write('\\x1b[2J\\x00' * 500 + '\\nBMC says no\\x07')"
    on = [sys.executable, "-c", f"import sys; open({str(calls)!r}, 'a').write('on\\n'); "
          f"{garbage}; sys.exit(4)"]  # fmt: skip
    nodes = [
        {"name": "here", "executor": "local", "fake_gpus": 1},
        {"name": "far", "executor": "ssh", "host": "127.0.0.1", "port": 1, "gpus": 2,
         "connect_timeout": "1s", "idle_off_after": "1s", "wake": "1s",
         "power_off": off, "power_on": on},
    ]  # fmt: skip
    write_config(cli.home, nodes, top={"daemon_interval_s": 0.2})
    daemon = cli.daemon()  # far is unreachable: never powered off (no discovery says idle)
    from sqlalchemy.exc import DBAPIError

    def stored() -> bool:
        try:
            return cli.db_rows("SELECT power_state FROM node WHERE name = 'far'") == [("on",)]
        except (LookupError, DBAPIError):  # no database or no tables yet
            return False

    wait_for(stored, timeout_s=20, what="the inventory")
    daemon.terminate()
    daemon.wait(timeout=30)
    import sqlite3

    with sqlite3.connect(cli.db_url.removeprefix("sqlite:///")) as con:  # a daemon left it off
        con.execute("UPDATE node SET power_state = 'off' WHERE name = 'far'")
    daemon = cli.daemon()
    try:  # status says far is off (right-sizing left it so), not unreachable
        wait_for(lambda: " far off since " in cli.run("status").stdout, timeout_s=10,
                 what="status to say far is off")  # fmt: skip
        made = cli.run("submit", "--gpus", "2", "--", "true")  # fits only on far
        wide = int(made.stdout)
        assert "starts once far wakes (about 1s)" in made.stderr, made.stderr
        far = wait_for(lambda: next((n for n in cli.json("nodes") if n["name"] == "far"
                                     and n["power"] == "wake failed"), None),
                       timeout_s=20, what="the wake to fail")  # fmt: skip
        assert (
            far["power_error"].startswith("power_on: python")
            and "BMC says no\\x07" in (far["power_error"])
        ), far
        assert "\x1b" not in cli.run("nodes").stdout
        small = cli.submit("--gpus", "1", "--priority", "1", "--", "true")  # fifo: ahead
        assert cli.wait_state(small, {"completed"}, timeout=30)["node"] == "here"
        assert cli.json("show", str(wide))["state"] == "queued", "it waits for its server"
        # ... and says why: its server's wake failed, why, and when it is tried again
        shown = cli.json("show", str(wide))
        note = shown["plan_note"] or ""
        assert shown["wait_reason"] == "wake", shown
        assert note.startswith("due; waiting for far to wake: its wake failed (power_on: python")
        assert re.search(r"BMC says no\\x07\); tried again at \d\d:\d\d:\d\d UTC$", note), note
        assert "\x1b" not in note and len(note) < 300, note
        assert "far wake failed" in cli.run("ls").stdout
        assert "its wake failed (power_on: python" in cli.run("show", str(wide)).stdout
        assert calls.read_text().splitlines().count("on") == 1, "retried only after a back-off"

        # the server's state, its failure (escaped, cut): from the daemon's health, which
        # it writes at most once a second (the wake may have failed within that second)
        def failed_status() -> str | None:
            out = cli.run("status").stdout
            return out if " far wake failed " in out else None

        status = wait_for(failed_status, timeout_s=10, what="status to say the wake failed")
        assert re.search(r" far wake failed since .*: power_on: python.*BMC says no\\x07; "
                         r"tried again at ", status), status  # fmt: skip
        assert "unreachable" not in status and "\x1b" not in status, status
        health = cli.json("status")
        power = health["nodes_power"]["far"]
        assert power["power_state"] == "wake failed" and power["retry_at"], power
        assert "far" not in health["nodes_unreachable"], "its wake failed: not unreachable"
        made = cli.run("submit", "--gpus", "2", "--", "true")  # a second: it says why it waits
        assert "waits for far, whose wake failed (far: power_on: python" in made.stderr
        assert "BMC says no\\x07); the daemon tries again after a back-off" in made.stderr
        assert "\x1b" not in made.stderr, made.stderr
        cli.run("cancel", str(wide), made.stdout.strip())
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
