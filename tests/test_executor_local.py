"""The local executor and its monitor: real processes, no daemon, no database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executors import procs, runfiles
from executors.base import Handle, LaunchSpec, RunStatus
from executors.local import LocalExecutor
from tests.conftest import ROOT


def _spec(tmp_path: Path, command, attempt=1, **kw) -> LaunchSpec:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    return LaunchSpec(
        job_id=attempt,
        attempt_id=attempt,
        command=command,
        workdir=str(tmp_path),
        env=env,
        gpu_indices=kw.pop("gpus", []),
        log_path=str(tmp_path / f"{attempt}.log"),
        run_dir=str(tmp_path / f"run-{attempt}"),
        **kw,
    )


def _wait(executor, handle, timeout=20):
    deadline = time.monotonic() + timeout
    while (result := executor.poll(handle)).status is RunStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return result


def test_exit_code_log_and_process_group(tmp_path):
    ex = LocalExecutor()
    script = (
        "import os, sys; print(os.getpgid(0) == os.getpid(), os.getsid(0) == os.getpid())"
        "; sys.exit(5)"
    )
    handle = ex.launch(_spec(tmp_path, [sys.executable, "-c", script]))
    result = _wait(ex, handle)
    assert result.status is RunStatus.EXITED and result.exit_code == 5
    assert (tmp_path / "1.log").read_text() == "True True\n", "own session and group"
    assert result.energy_j is None


def test_signal_reaches_the_whole_process_group(tmp_path):
    ex = LocalExecutor()
    child_pid = tmp_path / "grandchild"
    script = f"sleep 60 & echo $! > {child_pid}; wait"
    handle = ex.launch(_spec(tmp_path, ["sh", "-c", script]))
    while not child_pid.exists() or not child_pid.read_text().strip():
        time.sleep(0.02)
    while not (Path(handle.run_dir) / runfiles.JOB).exists():
        time.sleep(0.02)
    assert ex.signal(handle, signal.SIGTERM)
    result = _wait(ex, handle)
    assert result.signal == signal.SIGTERM and result.exit_code == 128 + 15
    grandchild = int(child_pid.read_text())
    time.sleep(0.2)
    assert procs.identify(grandchild) is None or not procs.is_alive(procs.identify(grandchild))
    assert not ex.signal(handle, signal.SIGTERM), "nothing left to signal"


def test_energy_is_measured_from_counters_when_the_gpus_have_them(tmp_path):
    ex = LocalExecutor()
    handle = ex.launch(_spec(tmp_path, ["sleep", "0.5"], gpus=[0, 1], gpu_backend="fake:100"))
    result = _wait(ex, handle)
    # two GPUs at 100 W for about half a second: about 100 J
    assert result.energy_j == pytest.approx(100, rel=0.5)


def test_recycled_pid_is_not_mistaken_for_the_job():
    me = procs.self_id()
    assert procs.is_alive(me)
    assert not procs.is_alive(procs.ProcessId(me.pid, me.start_ticks + 1))


def test_monitor_vanishing_without_an_exit_record_is_lost(tmp_path):
    ex = LocalExecutor()
    run_dir = tmp_path / "run-9"
    run_dir.mkdir()
    me = procs.self_id()
    stale = Handle(
        attempt_id=9,
        run_dir=str(run_dir),
        data={"monitor": {"pid": me.pid, "start_ticks": me.start_ticks + 1}},
    )
    assert ex.poll(stale).status is RunStatus.LOST


def _run_monitor(run_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "executors.shim", str(run_dir)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30,
    )


def test_abandoned_run_directory_never_starts(tmp_path):
    spec = _spec(tmp_path, ["sh", "-c", f"touch {tmp_path / 'ran'}"])
    run_dir = Path(spec.run_dir)
    run_dir.mkdir()
    runfiles.write_json(run_dir / runfiles.SPEC, {**spec.__dict__})
    assert LocalExecutor().recover(1, spec.run_dir) is None, "nothing had claimed it"
    _run_monitor(run_dir)  # a monitor arriving late finds it abandoned
    assert not (tmp_path / "ran").exists()
    assert runfiles.read_claim(run_dir) == "abandoned"


def test_started_run_directory_is_recovered_not_restarted(tmp_path):
    spec = _spec(tmp_path, ["sh", "-c", f"echo x >> {tmp_path / 'ran'}"])
    run_dir = Path(spec.run_dir)
    run_dir.mkdir()
    runfiles.write_json(run_dir / runfiles.SPEC, {**spec.__dict__})
    _run_monitor(run_dir)
    handle = LocalExecutor().recover(1, spec.run_dir)
    assert handle is not None
    result = LocalExecutor().poll(handle)
    assert result.status is RunStatus.EXITED and result.exit_code == 0
    assert (tmp_path / "ran").read_text() == "x\n"


def test_a_stale_run_directory_of_the_same_attempt_id_is_not_believed(tmp_path):
    """A database made anew in the same home gives attempt ids from 1 again: the run
    directory an earlier queue's attempt 1 left must not end the new attempt at once."""
    ex = LocalExecutor()
    first = ex.launch(_spec(tmp_path, [sys.executable, "-c", "import sys; sys.exit(3)"]))
    assert _wait(ex, first).exit_code == 3
    again = ex.launch(_spec(tmp_path, [sys.executable, "-c", "import time; time.sleep(1)"]))
    assert ex.poll(again).status is RunStatus.RUNNING, "the old exit record was believed"
    result = _wait(ex, again)
    assert result.status is RunStatus.EXITED and result.exit_code == 0


def test_a_run_directory_a_live_monitor_holds_is_left_alone(tmp_path):
    """Another queue's job of the same attempt id still running: its records stay, and
    this launch fails (the attempt is lost, nothing is cross-wired)."""
    from executors.errors import LaunchError

    ex = LocalExecutor()
    first = ex.launch(_spec(tmp_path, [sys.executable, "-c", "import time; time.sleep(3)"]))
    deadline = time.monotonic() + 10
    while not (runfiles.read_claim(Path(first.run_dir)) or "").startswith("started"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(LaunchError, match="another queue"):
        ex.launch(_spec(tmp_path, [sys.executable, "-c", "pass"]))
    result = _wait(ex, first)
    assert result.status is RunStatus.EXITED and result.exit_code == 0
