"""Ownership: jobs run as their submitter, users cannot touch each other's jobs, and the
queue's files are private unless a shared group is configured."""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
import time
from datetime import UTC, datetime

import pytest

from orchestrator.errors import PermissionDenied
from orchestrator.queue import store
from orchestrator.queue.db import Database
from orchestrator.queue.ownership import User
from orchestrator.queue.spec import build_spec

NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or NOBODY is None, reason="needs root and a 'nobody' user"
)


def _submit_as(db: Database, user: User, command: list[str], workdir: str) -> int:
    now = datetime.now(UTC)
    spec = build_spec(
        {"command": command, "gpus": 1, "workdir": workdir},
        now=now,
        cwd=workdir,
        base_env={"PATH": "/usr/bin:/bin"},
    )
    (job,) = store.submit(db, [spec], user=user, now=now, largest_node_gpus=4)
    return job.id


@needs_root
def test_root_daemon_runs_each_job_as_its_submitter(cli):
    cli.run("ls")  # creates the database
    db = Database(cli.db_url)
    workdir = tempfile.mkdtemp(prefix="gridshift-nobody-")
    os.chmod(workdir, 0o755)
    nobody = User(NOBODY.pw_name, NOBODY.pw_uid)
    theirs = _submit_as(db, nobody, ["id", "-u"], workdir)
    mine = cli.submit("--", "id", "-u")
    cli.run_until_idle()
    assert cli.json("show", str(theirs))["user"] == "nobody"
    assert cli.run("logs", str(theirs)).stdout.strip() == str(NOBODY.pw_uid)
    assert cli.run("logs", str(mine)).stdout.strip() == "0"
    log = (cli.home / "logs" / f"{theirs}.log").stat()
    assert log.st_uid == NOBODY.pw_uid and stat.S_IMODE(log.st_mode) == 0o600


def test_users_cannot_cancel_each_others_jobs(tmp_path, db_url):
    db = Database(db_url)
    db.ensure_schema()
    alice, bob, root = User("alice", 1001), User("bob", 1002), User("root", 0)
    a = _submit_as(db, alice, ["true"], str(tmp_path))
    b = _submit_as(db, alice, ["true"], str(tmp_path))
    now = datetime.now(UTC)
    with pytest.raises(PermissionDenied, match="belongs to alice"):
        store.cancel(db, [a], user=bob, now=now)
    assert store.cancel(db, [a], user=alice, now=now) == [(a, "cancelled")]
    assert store.cancel(db, [b], user=root, now=now) == [(b, "cancelled")]


def test_a_shared_queue_is_the_daemons_alone_and_reached_through_its_socket(cli):
    """Shared mode: home, logs and run directories are the daemon's (root's), group
    shared_group, 0710 (members pass through, no one else writes or lists); the database
    and each log are their owner's alone (0600); commands go through the daemon's socket
    (0660, group shared_group), and without a daemon nothing opens the database."""
    group = "nogroup" if os.geteuid() == 0 else None
    if group is None:
        pytest.skip("needs root to hand files to another group")
    import grp

    gid = grp.getgrnam(group).gr_gid
    home = cli.home / "shared"
    cli.env["GRIDSHIFT_HOME"] = str(home)
    cli.env["GRIDSHIFT_SHARED_GROUP"] = group
    proc = cli.run("submit", "--", "true", check=False)
    assert proc.returncode == 1 and "no gridshift daemon serves" in proc.stderr
    cli.daemon("--interval", "0.1")
    sock = home / "gridshift.sock"
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert time.monotonic() < deadline, "the daemon serves its socket"
        time.sleep(0.1)
    job = cli.submit("--", "true")
    cli.wait_state(job, {"completed"})
    st = sock.lstat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
    for path in (home, home / "logs", home / "run"):
        assert not path.stat().st_mode & 0o022, f"{path} is writable by the daemon only"
    if cli.backend == "sqlite":
        assert stat.S_IMODE((home / "gridshift.db").stat().st_mode) == 0o600
    for path in (home, home / "logs", home / "run"):
        st = path.lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 0, gid), path
    if cli.backend == "sqlite":
        assert (home / "gridshift.db").stat().st_uid == 0
    log = (home / "logs" / f"{job}.log").stat()
    assert stat.S_IMODE(log.st_mode) == 0o600 and log.st_uid == 0
