"""Files and privileges on a shared server: a root daemon in shared mode runs each job as
its submitter (real throwaway users alice and bob in the lab group, eve outside it, the
real monitor via LocalExecutor). Users cannot write the daemon's directories, a planted
link is refused and changes nothing outside, the job enters its working directory as its
submitter, cannot write the monitor's files, and its log is its own (0600). The
single-user quick start, as a normal user, works as before."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors import runfiles
from executors.base import Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import LaunchError
from executors.local import LocalExecutor
from orchestrator.errors import ConfigError
from orchestrator.queue.ownership import prepare_home
from orchestrator.settings import Settings
from tests.conftest import ROOT
from tests.helpers import users
from tests.helpers.users import Lab, as_user, lab_users

MONITOR_FILES = ("power.log", "exit.json", "job.json", "spec.json", "claim", "monitor.err")


@pytest.fixture
def base() -> Iterator[Path]:
    """A temporary directory every user may pass through (pytest's own is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gs-shared-"))
    os.chmod(path, 0o755)
    (path / "users").mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lab(base: Path) -> Iterator[Lab]:
    with lab_users(base / "users") as made:
        yield made


@pytest.fixture
def queue(base: Path, lab: Lab) -> Settings:
    settings = Settings(home=base / "queue", shared_group=lab.group)
    prepare_home(settings)
    return settings


def _spec(q: Settings, user: users.TestUser, command: list[str], attempt: int, **kw) -> LaunchSpec:
    job_id = kw.pop("job_id", attempt)
    return LaunchSpec(
        job_id=job_id,
        attempt_id=attempt,
        command=command,
        workdir=str(kw.pop("workdir", user.home)),
        env={"PATH": "/usr/bin:/bin", "HOME": str(user.home)},
        gpu_indices=kw.pop("gpus", []),
        log_path=str(q.log_path(job_id)),
        run_dir=str(q.runs_dir / f"attempt-{attempt}"),
        run_as_uid=user.uid,  # as the daemon hands it: the gid is the user's own
        **kw,
    )


def _wait(ex: LocalExecutor, handle: Handle, timeout: float = 30) -> PollResult:
    deadline = time.monotonic() + timeout
    while (result := ex.poll(handle)).status is RunStatus.RUNNING:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    return result


def _until(predicate, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return got


def _snapshot(path: Path) -> tuple:
    st = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(st.st_mode) else sorted(os.listdir(path))
    return st.st_uid, st.st_gid, st.st_mode, st.st_nlink, st.st_mtime_ns, content


def test_the_queue_is_the_daemons_and_no_user_writes_it(queue: Settings, lab: Lab):
    for path in (queue.home, queue.logs_dir, queue.runs_dir):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, lab.gid, 0o710), path
    prepare_home(queue)  # a restarted daemon takes its own directories as they are
    for user in (lab.alice, lab.bob, lab.eve):
        for argv in (
            ["touch", str(queue.home / "x")],
            ["touch", str(queue.logs_dir / "9.log")],
            ["ln", "-s", "/etc/shadow", str(queue.logs_dir / "9.log")],
            ["mkdir", str(queue.runs_dir / "attempt-9")],
            ["mv", str(queue.runs_dir), str(queue.home / "run.old")],  # to swap run/
            ["ln", "-s", str(user.home), str(queue.runs_dir / "attempt-9")],
            ["ls", str(queue.logs_dir)],
        ):
            assert as_user(user, argv).returncode != 0, (user.name, argv)
    assert os.listdir(queue.logs_dir) == [] and os.listdir(queue.runs_dir) == []


def test_existing_directories_others_may_write_are_refused_not_fixed(base: Path, lab: Lab):
    home = base / "old"
    home.mkdir()
    os.chown(home, 0, lab.gid)
    os.chmod(home, 0o2770)  # what shared mode made before
    before = _snapshot(home)
    with pytest.raises(ConfigError, match="may be written by group or others"):
        prepare_home(Settings(home=home, shared_group=lab.group))
    assert _snapshot(home) == before, "refused, and nothing changed"

    home = base / "linked"
    prepare_home(Settings(home=home, shared_group=lab.group))
    os.rmdir(home / "run")
    target = lab.alice.home / "runs"
    as_user(lab.alice, ["mkdir", str(target)], check=True)
    os.symlink(target, home / "run")
    before = _snapshot(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        prepare_home(Settings(home=home, shared_group=lab.group))
    assert _snapshot(target) == before

    os.unlink(home / "run")
    (home / "run").mkdir(mode=0o700)
    os.chown(home / "run", lab.alice.uid, -1)
    with pytest.raises(ConfigError, match=f"belongs to uid {lab.alice.uid}"):
        prepare_home(Settings(home=home, shared_group=lab.group))


def test_the_log_is_the_users_own_and_progress_reaches_the_daemon(queue: Settings, lab: Lab):
    ex = LocalExecutor()
    job = 'echo "hello from $(id -un)"; printf "1 4" > "$GRIDSHIFT_PROGRESS_FILE"; '
    job += "for i in $(seq 300); do [ -e go ] && break; sleep 0.1; done"
    handle = ex.launch(_spec(queue, lab.alice, ["sh", "-c", job], 1))
    assert _until(lambda: ex.progress(handle)) == (1.0, 4.0)
    progress = Path(handle.run_dir) / runfiles.PROGRESS
    st = progress.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (lab.alice.uid, 0o600)
    (lab.alice.home / "go").touch()
    result = _wait(ex, handle)
    assert result.exit_code == 0, result
    log = queue.log_path(1)
    st = log.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (lab.alice.uid, lab.alice.gid, 0o600)
    # what ``gridshift logs`` does as the user: open the log by its path
    read = as_user(lab.alice, ["cat", str(log)])
    assert read.stdout == f"hello from {lab.alice.name}\n"
    assert as_user(lab.bob, ["cat", str(log)]).returncode != 0, "not another member's"
    # a retried attempt of the same job appends to the same log, which stays the user's
    (lab.alice.home / "go").unlink()
    again = ex.launch(_spec(queue, lab.alice, ["sh", "-c", "echo again"], 2, job_id=1))
    assert _wait(ex, again).exit_code == 0
    assert as_user(lab.alice, ["cat", str(log)]).stdout.endswith("hello from " + lab.alice.name
                                                                   + "\nagain\n")  # fmt: skip
    assert log.lstat().st_uid == lab.alice.uid and stat.S_IMODE(log.lstat().st_mode) == 0o600


def test_a_job_cannot_write_the_monitors_files(queue: Settings, lab: Lab):
    run = queue.runs_dir / "attempt-3"
    tries = " ".join(MONITOR_FILES)
    job = f"""
        run=$(dirname "$GRIDSHIFT_PROGRESS_FILE")
        while [ ! -e "$run/job.json" ]; do sleep 0.05; done
        [ -e "$run/spec.json" ] && echo "spec.json present" || echo "spec.json gone"
        for f in {tries} new; do
            ( echo forged >> "$run/$f" ) 2>/dev/null && echo "$f appended"
            ( : > "$run/$f" ) 2>/dev/null && echo "$f truncated"
            [ -e "$run/$f" ] && rm -f "$run/$f" 2>/dev/null && [ ! -e "$run/$f" ] \
                && echo "$f removed"
            ln -s /tmp "$run/$f.x" 2>/dev/null && echo "$f linked"
        done
        mv "$GRIDSHIFT_PROGRESS_FILE" "$run/exit.json" 2>/dev/null && echo "progress moved"
        chmod 777 "$run" 2>/dev/null && echo "run dir chmodded"
        echo done
    """
    ex = LocalExecutor()
    handle = ex.launch(_spec(queue, lab.alice, ["sh", "-c", job], 3, gpus=[0],
                             gpu_backend="fake:100", power_sample_s=0.05))  # fmt: skip
    result = _wait(ex, handle)
    out = as_user(lab.alice, ["cat", str(queue.log_path(3))]).stdout
    assert out == "spec.json gone\ndone\n", out
    assert result.exit_code == 0 and result.energy_j is not None
    names = set(os.listdir(run))
    assert names == {"power.log", "exit.json", "job.json", "claim", "monitor.err", "progress"}
    for name in names - {"progress"}:
        st = (run / name).lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077, name
    st = run.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711)
    assert json.loads((run / "exit.json").read_text())["exit_code"] == 0
    samples, _ = runfiles.read_power_log(run / "power.log")
    assert samples and all(j >= 0 for _, j in samples)


def test_planted_links_are_refused_and_nothing_outside_changes(base: Path, queue, lab):
    victim_dir = base / "victim"
    victim_dir.mkdir(mode=0o755)
    victim = victim_dir / "root-only"
    victim.write_text("root's secret\n")
    os.chmod(victim, 0o600)
    outside = victim_dir / "not-yet"
    evil = lab.alice.home / "evil"
    as_user(lab.alice, ["mkdir", "-m", "700", str(evil)], check=True)
    # alice cannot plant anything there herself ...
    assert as_user(lab.alice, ["ln", "-s", str(victim), str(queue.log_path(20))]).returncode
    # ... and what was planted anyway (by an older, group-writable layout) is refused
    os.symlink(victim, queue.log_path(21))
    os.link(victim, queue.log_path(22))
    os.symlink(outside, queue.log_path(23))
    before = {p: _snapshot(p) for p in (victim, victim_dir, evil)}
    ex = LocalExecutor()
    ran = lab.alice.home / "ran"
    for attempt in (21, 22, 23):
        command = ["sh", "-c", f"touch {ran}; cat {queue.log_path(attempt)}"]
        result = _wait(ex, ex.launch(_spec(queue, lab.alice, command, attempt)))
        assert result.exit_code == 126 and "the log" in result.detail, result
    os.symlink(evil, queue.runs_dir / "attempt-24")
    with pytest.raises(LaunchError, match="symbolic link"):
        ex.launch(_spec(queue, lab.alice, ["touch", str(ran)], 24))
    time.sleep(0.3)
    assert not ran.exists(), "no job started"
    assert not outside.exists()
    assert {p: _snapshot(p) for p in before} == before, "owner, mode and content as they were"


def test_a_workdir_swapped_for_a_link_reaches_only_what_the_submitter_may(queue, lab):
    private = lab.bob.home / "private"  # bob's home is 0700; this folder and file are not
    as_user(lab.bob, ["mkdir", "-m", "755", str(private)], check=True)
    as_user(lab.bob, ["sh", "-c", f"echo bob-secret > {private}/secret.txt"], check=True)
    work = lab.alice.home / "work"
    as_user(lab.alice, ["mkdir", str(work)], check=True)
    spec = _spec(queue, lab.alice, ["cat", "secret.txt"], 5, workdir=work)  # submitted
    as_user(lab.alice, ["sh", "-c", f"rmdir {work} && ln -s {private} {work}"], check=True)
    ex = LocalExecutor()
    result = _wait(ex, ex.launch(spec))
    assert result.exit_code == 126 and "Permission denied" in result.detail, result
    log = queue.log_path(5).read_text()
    assert "bob-secret" not in log and str(work) in log
    # the same job from a directory alice may enter runs there
    (lab.alice.home / "secret.txt").write_text("alice's own\n")
    ok = _wait(ex, ex.launch(_spec(queue, lab.alice, ["cat", "secret.txt"], 6)))
    assert ok.exit_code == 0 and queue.log_path(6).read_text() == "alice's own\n"


def _python_for(user: users.TestUser) -> tuple[str, str]:
    """An interpreter ``user`` may run that imports gridshift (this one may live under
    root's 0700 home), and the PYTHONPATH it needs."""
    path = os.pathsep.join((str(ROOT), sysconfig.get_paths()["purelib"]))
    for python in (sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        probe = [python, "-c", "import orchestrator.settings, sqlmodel, typer"]
        with contextlib.suppress(OSError):  # not even runnable by the user
            if as_user(user, probe, env={"PYTHONPATH": path}).returncode == 0:
                return python, path
    pytest.skip("no Python the test user may run with gridshift's dependencies")


def test_the_single_user_quick_start_as_a_normal_user(base: Path, lab: Lab):
    home = lab.alice.home / ".gridshift"
    python, path = _python_for(lab.alice)
    env = {"GRIDSHIFT_HOME": str(home), "GRIDSHIFT_FAKE_GPUS": "1", "PYTHONPATH": path}

    def gridshift(*args: str):
        argv = [python, "-m", "orchestrator", *args]
        return as_user(lab.alice, argv, env=env, timeout=120, check=True).stdout

    job = 'echo hi; printf "1 2" > "$GRIDSHIFT_PROGRESS_FILE"; sleep 1.5'
    job_id = gridshift("submit", "--", "sh", "-c", job).strip()
    gridshift("daemon", "--until-idle", "--interval", "0.1")
    assert gridshift("logs", job_id) == "hi\n"
    assert json.loads(gridshift("show", "--json", job_id))["state"] == "completed"
    with sqlite3.connect(home / "gridshift.db") as db:
        assert db.execute("SELECT progress_done, progress_total FROM attempt").fetchall() == [
            (1.0, 2.0)
        ], "the report reached the daemon"
    for path, mode in ((home, 0o700), (home / "logs", 0o700), (home / "run", 0o711)):
        st = path.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (lab.alice.uid, mode), path
    log = (home / "logs" / f"{job_id}.log").lstat()
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (lab.alice.uid, 0o600)
    (run,) = (home / "run").iterdir()
    assert not (run / "spec.json").exists() and (run / "exit.json").exists()


def test_a_progress_report_is_untrusted_input(tmp_path: Path):
    """What a job writes is read without following links or blocking, at most 4 KiB, and
    believed only when it is a plain, finite, consistent report."""
    progress = tmp_path / runfiles.PROGRESS
    progress.write_text("3 10")
    assert runfiles.parse_progress(runfiles.read_progress(tmp_path)) == (3.0, 10.0)
    progress.write_text("1" * (runfiles.PROGRESS_MAX + 1))
    assert runfiles.read_progress(tmp_path) is None, "too long to be a report"
    progress.unlink()
    (tmp_path / "secret").write_text("42\n")
    progress.symlink_to(tmp_path / "secret")
    assert runfiles.read_progress(tmp_path) is None, "never through a link"
    progress.unlink()
    os.mkfifo(progress)
    assert runfiles.read_progress(tmp_path) is None, "a FIFO neither blocks nor counts"
    for garbage in ("nan", "inf 2", "1 2 3", "5 2", "-1", "1 0", "{", "[1, 2]", '{"done": true}',
                    '{"done": "1"}', '{"done": 1e999}', "{" * 3000, "1 2\x00"):  # fmt: skip
        assert runfiles.parse_progress(garbage) is None, garbage
    assert runfiles.parse_progress('{"done": 2, "total": 4, "epoch": 1}') == (2.0, 4.0)
    assert runfiles.parse_progress("7/8\n") == (7.0, 8.0)
