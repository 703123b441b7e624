"""The local executor: jobs on this machine, each watched by its own monitor process
(:mod:`executors.shim`) so that jobs outlive a daemon crash or restart."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path

from executors import procs, runfiles, shim
from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import ExecutorError, LaunchError
from executors.procs import ProcessId


class LocalExecutor(Executor):
    name = "local"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}  # monitors we started, to reap

    # -- launch -------------------------------------------------------------------------
    def _do_launch(self, spec: LaunchSpec) -> Handle:
        run_dir = Path(spec.run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(run_dir, 0o711)  # the job may reach its progress file, not list
            runfiles.write_json(run_dir / runfiles.SPEC, spec.to_dict())
            child, monitor = shim.spawn(run_dir)
        except OSError as exc:
            raise LaunchError(f"cannot start the job monitor in {run_dir}: {exc}") from exc
        self._children[spec.attempt_id] = child
        return Handle(attempt_id=spec.attempt_id, run_dir=str(run_dir), data={"monitor": monitor})

    # -- poll ---------------------------------------------------------------------------
    def _do_poll(self, handle: Handle) -> PollResult:
        self._reap(handle.attempt_id)
        run_dir = Path(handle.run_dir)
        monitor_alive = procs.is_alive(ProcessId.from_dict(handle.data["monitor"]))
        # exit.json is read after the liveness check: no lost race
        exit_data = runfiles.read_json(run_dir / runfiles.EXIT)
        job = self._job_process(run_dir)
        return poll_result(exit_data, monitor_alive, job is not None and procs.is_alive(job))

    def _reap(self, attempt_id: int) -> None:
        child = self._children.get(attempt_id)
        if child is not None and child.poll() is not None:
            del self._children[attempt_id]

    @staticmethod
    def _job_process(run_dir: Path) -> ProcessId | None:
        data = runfiles.read_json(run_dir / runfiles.JOB)
        return ProcessId.from_dict(data) if data else None

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        try:
            text = (Path(handle.run_dir) / runfiles.PROGRESS).read_text()
        except (FileNotFoundError, PermissionError, UnicodeDecodeError):
            return None
        return runfiles.parse_progress(text)

    # -- signal -------------------------------------------------------------------------
    def _do_signal(self, handle: Handle, sig: int) -> bool:
        job = self._job_process(Path(handle.run_dir))
        if job is None or not procs.is_alive(job):
            return False
        try:
            os.killpg(job.pid, sig)  # the job leads its own session and group
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise ExecutorError(f"not allowed to signal job process group {job.pid}") from exc
        return True

    # -- recovery -----------------------------------------------------------------------
    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None:
        path = Path(run_dir)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if runfiles.try_claim(path, "abandoned"):
            return None  # the monitor never claimed it and now never will
        claim = runfiles.read_claim(path) or ""
        if not claim.startswith("started"):
            return None
        _, pid, ticks = claim.split()
        return Handle(
            attempt_id=attempt_id,
            run_dir=run_dir,
            data={"monitor": {"pid": int(pid), "start_ticks": int(ticks)}},
        )


def poll_result(exit_data: dict | None, monitor_alive: bool, job_alive: bool) -> PollResult:
    """What a run directory says (``exit.json`` read after the liveness checks)."""
    if exit_data is not None:
        return PollResult(
            RunStatus.EXITED,
            exit_code=exit_data["exit_code"],
            signal=exit_data.get("signal"),
            ended_at=datetime.fromisoformat(exit_data["ended_at"]),
            energy_j=exit_data.get("energy_j"),
            detail=exit_data.get("detail"),
        )
    if monitor_alive:
        return PollResult(RunStatus.RUNNING)
    if job_alive:
        return PollResult(RunStatus.RUNNING, detail="monitor gone; job still running")
    return PollResult(RunStatus.LOST, detail="the job's monitor vanished; exit status lost")
