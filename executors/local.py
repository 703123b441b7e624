"""The local executor: jobs on this machine, each watched by its own monitor process
(:mod:`executors.shim`) so that jobs outlive a daemon crash or restart."""

from __future__ import annotations

import os
import subprocess
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
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            # the monitor's; the job (maybe another user) reaches its progress file only
            runfiles.make_dir(run_dir, 0o711)
            # a new attempt's directory holds nothing of its own yet: what is there was
            # left by another queue's attempt of this id (a database made anew in the
            # same home), and its exit record would end this attempt before it ran; a
            # live monitor's records are that queue's, and stay
            if (held := _claimed_by(run_dir)) is not None and procs.is_alive(held):
                raise OSError(f"a running job of another queue holds {run_dir}")
            for name in runfiles.RECORDS:
                runfiles.remove(run_dir / name)
            runfiles.write_json(run_dir / runfiles.SPEC, spec.to_dict())
            try:
                child, monitor = shim.spawn(run_dir)
            except OSError:
                runfiles.remove(run_dir / runfiles.SPEC)  # no monitor will read it
                raise
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
        if exit_data is None and (run_dir / runfiles.EXIT).exists():
            exit_data = ""  # there, but not a JSON object: a bad record (poll_result)
        job = self._job_process(run_dir)
        return poll_result(exit_data, monitor_alive, job is not None and procs.is_alive(job))

    def _reap(self, attempt_id: int) -> None:
        child = self._children.get(attempt_id)
        if child is not None and child.poll() is not None:
            del self._children[attempt_id]

    @staticmethod
    def _job_process(run_dir: Path) -> ProcessId | None:
        """The job's process as its start record names it; None when there is no
        believable record (``runfiles.check_job``)."""
        try:
            data = runfiles.read_job(run_dir)
        except runfiles.BadRunFile:
            return None
        return ProcessId(data["pid"], data["start_ticks"]) if data and data["pid"] else None

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        text = runfiles.read_progress(Path(handle.run_dir))
        return runfiles.parse_progress(text) if text is not None else None

    # -- signal -------------------------------------------------------------------------
    def _do_signal(self, handle: Handle, sig: int) -> bool:
        job = self._job_process(Path(handle.run_dir))
        if job is None or not procs.is_alive(job):
            return False
        try:
            if os.getpgid(job.pid) != job.pid:  # the job leads its own group; else forged
                return False
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
            runfiles.remove(path / runfiles.SPEC)  # it holds the job's environment
            return None  # the monitor never claimed it and now never will
        if not (runfiles.read_claim(path) or "").startswith("started"):
            return None
        # a claim the monitor did not write: no monitor to follow
        monitor = _claimed_by(path) or ProcessId(0, -1)
        return Handle(attempt_id=attempt_id, run_dir=run_dir, data={"monitor": monitor.to_dict()})


def _claimed_by(run_dir: Path) -> ProcessId | None:
    """The monitor that claimed ``run_dir`` (``started PID TICKS``), or None."""
    try:
        word, pid, ticks = (runfiles.read_claim(run_dir) or "").split()
        monitor = ProcessId(int(pid), int(ticks))
    except ValueError:
        return None
    return monitor if word == "started" and monitor.pid > 0 else None


def poll_result(exit_data: dict | str | None, monitor_alive: bool, job_alive: bool) -> PollResult:
    """What a run directory says (``exit.json`` read after the liveness checks). The
    exit record counts once its monitor is gone (the monitor writes it last, then exits;
    one a job forged while its monitor still waits is overwritten by the real one). One
    that cannot be believed (``runfiles.check_exit``) makes the attempt lost, with why."""
    if exit_data is not None and not monitor_alive:
        try:
            record = runfiles.check_exit(exit_data)
        except runfiles.BadRunFile as exc:
            return PollResult(RunStatus.LOST, detail=f"exit.json cannot be believed: {exc}")
        return PollResult(
            RunStatus.EXITED,
            exit_code=record["exit_code"],
            signal=record["signal"],
            ended_at=record["ended_at"],
            energy_j=record["energy_j"],
            detail=record["detail"],
        )
    if monitor_alive:
        return PollResult(RunStatus.RUNNING)
    if job_alive:
        return PollResult(RunStatus.RUNNING, detail="monitor gone; job still running")
    return PollResult(RunStatus.LOST, detail="the job's monitor vanished; exit status lost")
