"""SSH nodes and the trust around them, on real sshd servers on 127.0.0.1: the control
sockets' directory (someone else's, or a symlink, is refused and nothing goes through
it); malformed answers (the node's error, never the daemon's end); and ``user = "{user}"``
(each job logs in as its submitter: real throwaway accounts on the test server)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from executors.base import Handle, LaunchSpec, RunStatus
from executors.errors import HostUnreachable
from executors.ssh import SshExecutor
from executors.sshlink import BadAnswer, SshLink, UnsafeControlDir
from orchestrator.nodes.ssh import build_links, control_dir, ssh_target
from orchestrator.settings import NodeConfig
from tests.conftest import server_python
from tests.helpers.users import lab_users
from tests.helpers.waiting import wait_for
from tests.test_ssh_daemon import ssh_node, write_config

pytestmark = pytest.mark.slow


@pytest.fixture
def short():
    """A short directory (a socket's path is limited to ~108 bytes) every user can reach."""
    base = Path(tempfile.mkdtemp(prefix="gs-t-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _spec(tmp: Path, attempt: int, command: list[str], node: str, **kw) -> LaunchSpec:
    return LaunchSpec(attempt, attempt, command, "/", {"PATH": "/usr/bin:/bin"}, [],
                      str(tmp / f"{attempt}.log"), str(tmp / f"run-{attempt}"), node=node,
                      **kw)  # fmt: skip


# -- the control sockets' directory ------------------------------------------------------
@pytest.mark.parametrize("planted", ["another user's", "a symlink", "group-writable"])
def test_a_planted_control_directory_is_refused_and_nothing_goes_through_it(
    ssh_servers, short, tmp_path, planted
):
    if os.geteuid() != 0 and planted == "another user's":
        pytest.skip("making a directory another user's needs root")
    srv = ssh_servers(gpus=1)
    cfg = NodeConfig(**ssh_node(srv, ssh_servers, "s"))
    where = short / "ssh"
    if planted == "a symlink":
        real = short / "theirs"
        real.mkdir(mode=0o700)
        where.symlink_to(real)
    else:
        where.mkdir(mode=0o700)
        if planted == "another user's":
            os.chown(where, 65534, 65534)
        else:
            where.chmod(0o770)
    link = SshLink(ssh_target(cfg), control_dir=where)
    # the planter's fake master, listening where this link's would be
    fake = socket.socket(socket.AF_UNIX)
    fake.bind(str(link.socket_path))
    fake.listen()
    fake.setblocking(False)
    canary = tmp_path / "canary"
    with pytest.raises(UnsafeControlDir, match="refusing the SSH control directory"):
        link.run(["touch", str(canary)])
    with pytest.raises(HostUnreachable):  # and again, as long as it is there
        link.verb("status", request={"runs": []})
    with pytest.raises(BlockingIOError):
        fake.accept()  # nobody connected to it
    assert not canary.exists()
    assert not link.up and "refusing" in link.last_error
    fake.close()


def test_the_daemons_control_directory_is_its_own_and_private(ssh_servers, short):
    home = short / "home"
    home.mkdir(mode=0o700)
    assert control_dir(home) == home / "ssh"
    srv = ssh_servers(gpus=1)
    links = build_links([NodeConfig(**ssh_node(srv, ssh_servers, "s"))], home=home)
    assert links["s"].run(["true"]).returncode == 0
    st = os.lstat(home / "ssh")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o700)
    assert links["s"].socket_path.parent == home / "ssh" and links["s"].socket_path.exists()
    links["s"].close()
    long_home = short / ("x" * 90)
    long_home.mkdir()
    assert len(str(control_dir(long_home))) < 80, "too long for a socket: elsewhere, short"


# -- malformed answers -------------------------------------------------------------------
def _lying_python(where: Path) -> tuple[Path, Path]:
    """The server's python3, except that while ``bad`` holds a verb (first line) and an
    answer (the rest), that verb prints that answer."""
    bad, fake = where / "bad", where / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ -e {bad} ] && [ "$1 $2 $3" = "-m executors.remote $(head -n 1 {bad})" ]; then\n'
        f"  tail -n +2 {bad}; exit 0\nfi\n"
        f'exec {server_python()} "$@"\n'
    )
    fake.chmod(0o755)
    return fake, bad


BAD_STATUS = [
    "{}",
    "not json at all",
    "[1, 2]",
    '{"runs": []}',
    '{"runs": [{"claim": 5}]}',
]
# (a forged exit record in a run's answer is that attempt's matter, not the node's: see
# tests/test_untrusted_runfiles.py)


def test_malformed_answers_are_the_nodes_error_and_the_attempt_survives(ssh_servers, tmp_path):
    srv = ssh_servers(gpus=1)
    fake, bad = _lying_python(tmp_path)
    cfg = NodeConfig(**{**ssh_node(srv, ssh_servers, "s"), "python": str(fake)})
    now = [0.0]
    ex = SshExecutor({"s": SshLink(ssh_target(cfg), clock=lambda: now[0])}, poll_wait_s=5)
    handle = ex.launch(_spec(tmp_path, 1, ["sleep", "60"], "s"))
    try:
        for answer in BAD_STATUS:
            bad.write_text(f"status\n{answer}\n")
            ex.refresh([handle])  # does not raise
            result = ex.poll(handle)
            assert result.status is RunStatus.UNREACHABLE, answer
            assert "malformed answer" in result.detail, result.detail
            assert "s" in ex.unreachable_nodes()
            bad.unlink()
            now[0] += 60  # the node's retry is due
            ex.refresh([handle])
            assert ex.poll(handle).status is RunStatus.RUNNING, "the attempt is intact"
            assert ex.unreachable_nodes() == {}
        for verb, answer in [("signal", '{"sent": "yes"}'), ("claim", '{"claimed": 1}')]:
            bad.write_text(f"{verb}\n{answer}\n")
            with pytest.raises(BadAnswer):
                if verb == "signal":
                    ex.signal(handle, 0)
                else:
                    ex.recover(1, handle.run_dir, "s")
            bad.unlink()
            now[0] += 60
        bad.write_text('launch\n{"monitor": {"pid": "1"}, "run_dir": 3}\n')
        with pytest.raises(HostUnreachable, match="malformed"):  # started or not: unknown
            ex.launch(_spec(tmp_path, 2, ["true"], "s"))
        bad.unlink()
    finally:
        now[0] += 60
        ex.signal(handle, 9)
        ex.close()


def test_a_server_that_answers_launch_with_nonsense_stays_down_longer_each_time(
    ssh_servers, tmp_path
):
    """Its connection works and its other verbs answer well: without the growing wait,
    every pass would send it a job that bounces back."""
    srv = ssh_servers(gpus=1)
    fake, bad = _lying_python(tmp_path)
    cfg = NodeConfig(**{**ssh_node(srv, ssh_servers, "s"), "python": str(fake)})
    now = [0.0]
    ex = SshExecutor({"s": SshLink(ssh_target(cfg), clock=lambda: now[0])}, poll_wait_s=5)
    bad.write_text('launch\n{"monitor": {"pid": "1"}, "run_dir": 3}\n')
    try:
        waits = []
        for attempt in (1, 2, 3):
            with pytest.raises(HostUnreachable, match="malformed"):
                ex.launch(_spec(tmp_path, attempt, ["true"], "s"))
            assert "s" in ex.unreachable_nodes()
            start = now[0]
            while True:  # not asked again before its wait is over
                now[0] += 1
                try:
                    assert ex.recover(attempt, str(tmp_path / f"run-{attempt}"), "s") is None
                except HostUnreachable as exc:
                    assert "next try in" in str(exc)
                    continue
                break
            assert ex.unreachable_nodes() == {}, "a well-formed answer: up again"
            waits.append(now[0] - start)
        assert waits[0] >= 8 and waits[1] >= 4 * waits[0] - 1 and waits[2] >= 4 * waits[1] - 1
        bad.unlink()
        assert ex.launch(_spec(tmp_path, 4, ["true"], "s")) is not None, "mended: used again"
        assert ex.unreachable_nodes() == {}
    finally:
        ex.close()


def test_malformed_answers_to_verbs_by_turns_still_make_the_wait_grow(tmp_path):
    """A good answer to one verb forgives only that verb: nonsense to launch and status
    by turns is not a wait of 8 s for ever."""
    cfg = NodeConfig(name="s", executor="ssh", host="127.0.0.1")
    now = [0.0]
    control = tmp_path / "ssh"
    control.mkdir(mode=0o700)
    link = SshLink(ssh_target(cfg), clock=lambda: now[0], control_dir=control)
    waits = []
    for verb in ("launch", "status", "launch", "status"):
        link.bad_answer(verb, "nonsense")
        waits.append(link._retry_at - now[0])
        now[0] = link._retry_at
        link.answered_well("claim")  # a good claim in between forgives nothing else
        assert link.up
    assert waits == [8.0, 8.0, 32.0, 32.0], waits
    link.answered_well("launch")  # launch answered well again
    link.bad_answer("status", "nonsense")
    assert link._retry_at - now[0] == 128.0, "status is still on its third strike"


@pytest.mark.backends("sqlite")
def test_the_daemon_outlives_a_server_that_answers_nonsense(cli, ssh_servers, tmp_path):
    srv = ssh_servers(gpus=1)
    fake, bad = _lying_python(tmp_path)
    node = {**ssh_node(srv, ssh_servers, "s"), "python": str(fake), "lost_after": "10m"}
    write_config(cli.home, [node], top={"daemon_interval_s": 0.2})
    flag = tmp_path / "go"
    job = cli.submit("--gpus", "1", "--", "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done")
    daemon = cli.daemon()
    try:
        cli.wait_state(job, {"running"}, timeout=30)
        bad.write_text("status\n{}\n")
        status = wait_for(lambda: (s := cli.json("status")) and s["nodes_unreachable"] and s)
        assert "s" in status["nodes_unreachable"] and status["daemon"] == "running"
        bad.write_text("status\nnot json\n")
        wait_for(lambda: daemon.poll() is not None or cli.json("status")["last_tick_age_s"] < 1)
        assert daemon.poll() is None, daemon.stderr.read() if daemon.poll() is not None else ""
        bad.unlink()
        flag.touch()
        done = cli.wait_state(job, {"completed", "failed"}, timeout=60)
        assert done["state"] == "completed" and done["attempts"] == 1, "the same attempt"
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


# -- one account per submitter -----------------------------------------------------------
def test_user_template_logs_each_job_in_as_its_submitter(ssh_servers, user_key, short):
    from tests.helpers.sshd import SshServer

    with lab_users(short) as lab:
        for u in (lab.alice, lab.bob):  # no password, but not locked (sshd refuses "!")
            subprocess.run(["usermod", "-p", "*", u.name], check=True, capture_output=True)
        key = short / "id_ed25519"  # where the accounts' sshd sessions can read the .pub
        shutil.copy(user_key, key)
        shutil.copy(f"{user_key}.pub", f"{key}.pub")
        os.chmod(f"{key}.pub", 0o644)
        srv = SshServer(short / "srv", key, gpus=1).start()
        known = short / "known_hosts"
        known.write_text(srv.known_hosts_line())
        try:
            cfg = NodeConfig(name="s", executor="ssh", host="127.0.0.1", port=srv.port,
                             user="{user}", identity_file=key, known_hosts=known,
                             python=server_python(), remote_dir=".gridshift")  # fmt: skip
            home = short / "daemon"
            home.mkdir(mode=0o700)
            ex = SshExecutor(build_links([cfg], home=home))
            report = ["sh", "-c", "id -un; id -u"]
            handles = {
                u.name: ex.launch(_spec(short, i, report, "s", run_as_uid=u.uid))
                for i, u in enumerate((lab.alice, lab.bob), start=1)
            }
            for u in (lab.alice, lab.bob):
                h = handles[u.name]
                assert h.data["account"] == u.name
                assert ex._link("s", u.name).target.address == f"{u.name}@127.0.0.1"
                wait_for(lambda h=h: ex.poll(h).status is RunStatus.EXITED, 30, "the job")
                assert Path(h.data["log_path"]).read_text().split() == [u.name, str(u.uid)]
                assert h.data["remote_run_dir"].startswith(f"{u.home}/"), "in their account"
            sockets = {p.name for p in (home / "ssh").iterdir()}
            assert len(sockets) == 2, "one master per (server, account)"
            # a restarted daemon finds the account again (ssh.json beside the attempt)
            again = SshExecutor(build_links([cfg], home=home))
            found = again.recover(2, handles[lab.bob.name].run_dir, "s")
            assert found is not None and found.data["account"] == lab.bob.name
            assert again.poll(found).status is RunStatus.EXITED
            ex.close()
            again.close()
        finally:
            srv.stop()


@pytest.mark.backends("sqlite")
def test_nodes_says_which_servers_share_one_account(cli):
    nodes = [
        {"name": "own", "executor": "ssh", "host": "127.0.0.1", "user": "{user}", "gpus": 1},
        {"name": "one", "executor": "ssh", "host": "127.0.0.1", "user": "train", "gpus": 1},
    ]
    write_config(cli.home, nodes)
    got = {n["name"]: n for n in cli.json("nodes")}
    assert got["own"]["shared_account"] is False and got["one"]["shared_account"] is True
    text = cli.run("nodes").stdout
    assert "node one runs every user's jobs as one account" in text
    assert "node own runs" not in text


def test_handles_without_an_account_use_the_nodes_own(tmp_path):
    cfg = NodeConfig(name="s", executor="ssh", host="127.0.0.1", user="{user}")
    ex = SshExecutor({"s": SshLink(ssh_target(cfg))})
    link = ex._handle_link(Handle(1, str(tmp_path), {"node": "s"}))
    assert link is ex.links["s"] and "{user}" not in link.target.address


# -- logs of a job that ran on a server ----------------------------------------------------
def test_the_servers_log_reader_follows_no_link_and_reads_only_files(tmp_path, capsysbinary):
    from executors import remote

    log = tmp_path / "7.log"
    log.write_bytes(b"the job's own output\n")
    (tmp_path / "shadow").write_bytes(b"root:secret\n")
    (tmp_path / "8.log").symlink_to(tmp_path / "shadow")
    os.mkfifo(tmp_path / "9.log")
    assert remote.main(["read", str(log), "4"]) == 0
    assert capsysbinary.readouterr().out == b"job's own output\n"
    assert remote.main(["read", str(tmp_path / "8.log"), "0"]) == 4, "a link is not a log"
    assert remote.main(["read", str(tmp_path / "9.log"), "0"]) == 4, "nor a pipe"
    assert b"secret" not in capsysbinary.readouterr().out
    assert remote.main(["read", str(tmp_path / "none.log"), "0"]) == 3


def test_a_servers_log_is_read_where_gridshift_put_it_as_the_jobs_account(tmp_path):
    """The log path a server answered at launch is the job's to forge: ``logs`` works the
    path out from the node's settings and reads it as the account the job ran as."""
    from datetime import UTC, datetime

    from orchestrator.daemon.ops.base import OpContext
    from orchestrator.daemon.ops.jobs import _sources
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.settings import Settings

    node = {"name": "s", "executor": "ssh", "host": "127.0.0.1", "user": "{user}", "gpus": 1,
            "remote_dir": "/home/{user}/.gridshift"}  # fmt: skip
    settings = Settings(home=tmp_path / "home", nodes=[node])
    (tmp_path / "home").mkdir()
    db = Database(settings.db_url)
    db.ensure_schema()
    now = datetime.now(UTC)
    with db.write() as s:
        job = Job(state="completed", user="alice", uid=1000, command=["x"], workdir="/",
                  gpus_min=1, gpus_max=1, submitted_at=now)  # fmt: skip
        s.add(job)
        s.flush()
        forged = {"node": "s", "account": "alice", "log_path": "/etc/shadow"}
        s.add(Attempt(job_id=job.id, number=1, state="completed", node="s", run_dir="/r",
                      handle={"attempt_id": 1, "run_dir": "/r", "data": forged}))  # fmt: skip
        job_id = job.id
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True)
    sources, last = _sources(ctx, job_id)
    assert sources == [("s", f"/home/alice/.gridshift/logs/{job_id}.log", "alice")]
    assert last == [0]
    db.dispose()
