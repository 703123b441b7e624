"""The shared server with real users (root only): a root daemon owns the queue, alice and
bob (in the lab group) reach it only through its socket, eve (outside it) not at all.

Each proof of issue 19's list is one assertion block below: no member can write the
database or the daemon's directories (nor read the database); another user's job cannot
be cancelled, shown or read, and its environment is in no answer; a uid or user named in
a request changes nothing; eve is refused; alice's job runs as alice; without a daemon a
shared queue's commands fail with one line. (50 concurrent clients and a silent one:
tests/test_socket_protocol.py in-process and ``test_the_live_socket_...`` here.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Cli, base_env
from tests.helpers.users import as_user, lab_users, needs_root
from tests.helpers.waiting import wait_for

SECRET = "s3cr3t-of-alice"


def _user_python(user) -> list[str]:
    """A python the test users may run, with this checkout and its packages on its path
    (this virtualenv's python may live under root's 0700 home)."""
    import site

    paths = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    for py in (sys.executable, "/usr/bin/python3"):
        try:
            probe = as_user(user, [py, "-c", "import typer"], env={"PYTHONPATH": paths})
        except OSError:  # not executable by them
            continue
        if probe.returncode == 0:
            return [py, "-m", "orchestrator"], paths
    pytest.skip("no python the test users may run with this checkout's packages")


@pytest.fixture(scope="module")
def lab():
    needs_root()
    base = Path(tempfile.mkdtemp(prefix="gs-shared-"))
    os.chmod(base, 0o755)  # the users' homes and the queue's home are reached through it
    (base / "users").mkdir(mode=0o755)
    try:
        with lab_users(base / "users") as lab:
            yield base, lab
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Queue:
    """A shared queue's home (config with shared_group), its root daemon and its users' CLI."""

    def __init__(self, base: Path, lab, name: str) -> None:
        self.home = base / name
        self.home.mkdir(mode=0o755)
        (self.home / "gridshift.toml").write_text(f'shared_group = "{lab.group}"\n')
        os.chmod(self.home / "gridshift.toml", 0o644)
        self.socket = self.home / "gridshift.sock"
        self.env = base_env(self.home)
        self.cmd, self.paths = _user_python(lab.alice)
        self.daemon: subprocess.Popen | None = None

    def start(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", "--interval", "0.2"],
            env=self.env,
            cwd=self.home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(self.socket.exists, 60, "the daemon's socket")

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(timeout=30)

    def run(self, user, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        given = {"GRIDSHIFT_HOME": str(self.home), "PYTHONPATH": self.paths, **(env or {})}
        return as_user(user, [*self.cmd, *args], env=given)

    def json(self, user, *args: str):
        proc = self.run(user, args[0], "--json", *args[1:])
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def raw(self, user, request: dict) -> dict:
        """One protocol request sent by ``user`` as written (no CLI in between)."""
        code = (
            "import json, socket, sys; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({str(self.socket)!r}); s.sendall(sys.argv[1].encode() + b'\\n'); "
            "print(s.makefile().readline())"
        )
        py = self.cmd[0]
        proc = as_user(user, [py, "-c", code, json.dumps(request)])
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def queue(lab):
    base, users = lab
    q = Queue(base, users, "queue")
    q.start()
    yield q
    q.stop()
    from tests.conftest import Cli, cleanup

    cleanup(Cli(q.home, q.env))


def _fails(proc, code: int, text: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], proc.stderr


def test_without_a_daemon_a_shared_queue_answers_nothing_and_opens_no_database(lab):
    base, users = lab
    q = Queue(base, users, "no-daemon")
    for args in (["ls"], ["submit", "--", "true"], ["status"], ["cancel", "1"]):
        _fails(q.run(users.alice, *args), 1, f"no gridshift daemon serves {q.socket}")
    assert not (q.home / "gridshift.db").exists(), "no CLI process opened the database"


def test_alices_job_runs_as_alice_and_others_cannot_touch_or_read_it(queue, lab):
    _, users = lab
    alice, bob = users.alice, users.bob
    job = queue.json(alice, "submit", "--name", "mine", "--", "sh", "-c", "id -u")["id"]
    secret_job = queue.run(
        alice, "submit", "--gpus", "0", "--env", f"KEY={SECRET}", "--", "sleep", "300",
        env={"TOKEN": SECRET},
    ).stdout.strip()  # fmt: skip

    # alice's job runs as alice: it writes its own uid to its log
    wait_for(lambda: queue.json(alice, "show", str(job))["state"] == "completed", 60, "job")
    shown = queue.json(alice, "show", str(job))
    assert shown["user"] == alice.name and shown["exit_code"] == 0
    assert queue.run(alice, "logs", str(job)).stdout.split()[0] == str(alice.uid)

    # bob cannot cancel, show or read it: the daemon refuses (exit 2, one line)
    _fails(queue.run(bob, "cancel", str(secret_job)), 2, f"belongs to {alice.name}")
    _fails(queue.run(bob, "show", str(job)), 2, f"belongs to {alice.name}")
    _fails(queue.run(bob, "logs", str(job)), 2, f"belongs to {alice.name}")
    _fails(queue.run(bob, "cron", "rm", "1"), 2, "no cron template 1")

    # what bob sees of alice's jobs: squeue's columns, the program's name, no environment
    listed = {j["id"]: j for j in queue.json(bob, "ls", "--all")}
    theirs = listed[job]
    assert theirs["user"] == alice.name and theirs["name"] == "mine"
    assert theirs["command"] == ["sh"] and theirs["workdir"] is None
    assert theirs["log_path"] is None and "env" not in theirs
    everything = json.dumps(queue.json(bob, "ls", "--all"))
    assert SECRET not in everything and "id -u" not in everything

    # a uid or user named in a request changes nothing: the kernel says who asks
    spoofed = {"v": 1, "op": "cancel", "args": {"job_ids": [int(secret_job)], "uid": 0,
                                                "user": "root", "caller": {"uid": 0}}}  # fmt: skip
    answer = queue.raw(bob, spoofed)
    assert answer["ok"] is False and answer["error"]["kind"] == "PermissionDenied"
    assert queue.json(alice, "show", str(secret_job))["state"] != "cancelled"
    forged = {"v": 1, "op": "submit",
              "args": {"jobs": [{"command": ["true"], "workdir": str(bob.home)}],
                       "cwd": str(bob.home), "env": {}, "uid": 0, "user": "root"}}  # fmt: skip
    answer = queue.raw(bob, forged)
    assert answer["ok"] is True, answer
    made_by_bob = answer["result"]["jobs"][0]["id"]
    assert queue.json(bob, "show", str(made_by_bob))["user"] == bob.name
    # alice may cancel her own
    assert queue.run(alice, "cancel", secret_job).stdout.startswith(f"job {secret_job}: ")
    wait_for(lambda: queue.json(alice, "show", secret_job)["state"] == "cancelled", 60)


def test_members_cannot_write_the_database_or_any_directory_of_the_daemons(queue, lab):
    _, users = lab
    home = queue.home
    probe = (
        "import json, os, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        if os.path.isdir(p):\n"
        "            fd = os.open(os.path.join(p, 'planted'), os.O_CREAT | os.O_WRONLY, 0o600)\n"
        "        else:\n"
        "            fd = os.open(p, os.O_RDONLY)\n"
        "        os.close(fd); out[p] = 'opened'\n"
        "    except OSError as exc:\n"
        "        out[p] = exc.strerror\n"
        "print(json.dumps(out))\n"
    )
    targets = [home, home / "logs", home / "run", home / "gridshift.db"]
    targets += [p for p in home.glob("gridshift.db-*")]
    for user in (users.alice, users.bob, users.eve):
        proc = as_user(user, [queue.cmd[0], "-c", probe, *map(str, targets)])
        got = json.loads(proc.stdout)
        assert set(got.values()) == {"Permission denied"}, (user.name, got)
    assert not list(home.rglob("planted"))
    # with no write path to the queue, the only way in is a request, answered as its caller


def test_eve_outside_the_group_cannot_use_the_socket(queue, lab):
    _, users = lab
    proc = queue.run(users.eve, "ls")
    _fails(proc, 1, "permission denied")
    st = queue.socket.lstat()
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == lab[1].gid and st.st_uid == 0


def test_the_live_socket_survives_a_crowd_and_a_silent_client(queue, lab):
    _, users = lab
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(queue.socket))  # connects and sends nothing
    results: list = []

    def one() -> None:
        results.append(queue.run(users.bob, "ls").returncode)

    started = time.monotonic()
    crowd = [threading.Thread(target=one) for _ in range(50)]
    for t in crowd:
        t.start()
    job = queue.json(users.alice, "submit", "--", "true")["id"]
    for t in crowd:
        t.join(timeout=120)
    assert results == [0] * 50
    # the daemon kept dispatching meanwhile
    wait_for(lambda: queue.json(users.alice, "show", str(job))["state"] == "completed", 60)
    assert time.monotonic() - started < 120
    silent.close()
    assert queue.daemon.poll() is None, "the daemon lives on"


def test_report_leaves_out_other_users_labels_but_counts_their_jobs(queue, lab):
    _, users = lab
    alice, bob = users.alice, users.bob
    secret = queue.json(alice, "submit", "--label", "secretlabel", "--label", "both", "--", "true")
    mine = queue.json(bob, "submit", "--label", "both", "--label", "bobs", "--", "true")

    def done() -> bool:
        states = [queue.json(alice, "show", str(secret["id"]))["state"],
                  queue.json(bob, "show", str(mine["id"]))["state"]]  # fmt: skip
        return states == ["completed", "completed"]

    wait_for(done, 60, "both jobs")

    seen = queue.json(bob, "report")
    assert "secretlabel" not in json.dumps(seen)
    assert set(seen["by_label"]) <= {"both", "bobs", "-"}, seen["by_label"]
    # a label bob also uses counts only his own jobs: alice's use of it is hers
    assert seen["by_label"]["both"]["jobs"] == 1 and seen["by_label"]["bobs"]["jobs"] == 1
    # her jobs still count: in the totals, per user, and as other users' jobs
    assert seen["by_user"][alice.name]["jobs"] >= 1
    hidden = seen["others_labels_hidden"]
    assert hidden["jobs"] == seen["by_user"][alice.name]["jobs"]
    assert sum(r["jobs"] for r in seen["by_label"].values()) <= seen["total"]["jobs"]
    text = queue.run(bob, "report")
    assert text.returncode == 0, text.stderr
    assert "secretlabel" not in text.stdout and "other users" in text.stdout

    hers = queue.json(alice, "report")
    assert hers["by_label"]["secretlabel"]["jobs"] == 1 and "bobs" not in hers["by_label"]
    assert hers["by_label"]["both"]["jobs"] == 1
    # root (the daemon's user here) sees every label
    root = json.loads(Cli(queue.home, queue.env).run("report", "--json").stdout)
    assert root["by_label"]["both"]["jobs"] == 2 and "secretlabel" in root["by_label"]
    assert root["others_labels_hidden"] is None
