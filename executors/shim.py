"""The monitor that runs one job attempt: ``python -m executors.shim RUN_DIR``.

It is started in a session of its own, so it outlives the daemon that launched it. It
claims the run directory (or exits when a recovering daemon abandoned it first), starts
the job in a new session and process group with its output appended to the job's log,
records the job's pid and start time, waits, and records the exit code, the end time and
the GPU energy the job used (from energy counters; null where there are none). A job that
ends while no daemon runs is thus recorded with its real exit code and end time.

On a shared server the monitor runs as root and the job as its submitter. The monitor
reads ``spec.json`` once and removes it (it holds the job's environment); it creates the
job's log and progress file itself (``O_EXCL``, never through a link) and hands them to
the job's user on their descriptors; the job's own process drops to the submitter
(groups, gid, uid) before it enters the working directory, so that directory is resolved
with the submitter's rights, not root's. The job cannot write the monitor's files.
"""

from __future__ import annotations

import errno
import os
import pwd
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from executors import procs, runfiles
from executors.gpu import GpuControl, gpu_control_for

DEFAULT_SAMPLE_S = 5.0  # seconds between energy samples in the power log


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _iso(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).isoformat()


class PowerLog:
    """``power.log``: one line per sample, ``<epoch s> <joules since start>``, appended and
    flushed, so the daemon (or one restarted after a crash) integrates power × intensity
    over the run from it. Only where the GPUs have energy counters."""

    def __init__(self, path: Path, start: list[float] | None) -> None:
        self._start = sum(start) if start is not None else None
        self._fh = None
        if start is not None:
            fd = runfiles.create_owned(path, None, None, os.O_APPEND)
            self._fh = os.fdopen(fd, "a", buffering=1)

    def sample(self, t_s: float, reading: list[float] | None) -> None:
        if self._fh is None or reading is None:
            return
        self._fh.write(f"{t_s:.6f} {max(0.0, sum(reading) - self._start):.6f}\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def _energy_reading(ctl: GpuControl | None, indices: list[int]) -> list[float] | None:
    if ctl is None or not indices:
        return None
    try:
        if not all(ctl.supports_energy_counter(i) for i in indices):
            return None
        reading = ctl.energy_many_j(indices)
        return None if any(v is None for v in reading) else reading
    except Exception:  # a measurement failure leaves energy unmeasured, never fails the job
        return None


def _ignore(_signum, _frame) -> None:
    pass


class Identity:
    """Whom the job runs as, when that is not the monitor's own user."""

    def __init__(self, uid: int, gid: int, groups: list[int]) -> None:
        self.uid, self.gid, self.groups = uid, gid, groups


def _identity(spec: dict) -> Identity | None:
    """The submitter (KeyError when that user no longer exists); None: run as ourselves."""
    uid = spec.get("run_as_uid")
    if uid is None or uid == os.geteuid():
        return None
    entry = pwd.getpwuid(uid)
    gid = spec.get("run_as_gid")
    gid = entry.pw_gid if gid is None else gid
    return Identity(uid, gid, os.getgrouplist(entry.pw_name, gid))


def _start(spec: dict, env: dict, log_fd: int, who: Identity | None) -> subprocess.Popen:
    """Start the job in a session of its own. ``subprocess`` enters ``cwd=`` before it
    changes the user, so the working directory is entered here after the change (its
    ``preexec_fn`` runs after setgroups, setregid and setreuid): a path swapped for a link
    after submission leads only where the submitter may go. Why it could not enter it
    comes back over a pipe, as an OSError naming the directory."""
    workdir = spec["workdir"]
    err_r, err_w = os.pipe()  # close-on-exec: the job never holds it

    def enter() -> None:
        try:
            os.chdir(workdir)
        except OSError as exc:
            os.write(err_w, str(exc.errno or errno.EACCES).encode())
            raise

    identity = {}
    if who is not None:
        identity = {"user": who.uid, "group": who.gid, "extra_groups": who.groups}
    try:
        return subprocess.Popen(
            spec["command"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=enter,  # runs after the uid change; the monitor has no threads
            **identity,
        )
    except subprocess.SubprocessError:
        os.close(err_w)
        err_w = -1
        code = os.read(err_r, 16)
        if code.isdigit():
            raise OSError(int(code), os.strerror(int(code)), workdir) from None
        raise
    finally:
        os.close(err_r)
        if err_w >= 0:
            os.close(err_w)


def _cannot_start(run_dir: Path, code: int, detail: str) -> int:
    runfiles.write_json(
        run_dir / runfiles.EXIT,
        {"exit_code": code, "signal": None, "ended_at": _now_iso(), "energy_j": None,
         "detail": detail},
    )  # fmt: skip
    return 0


def run(run_dir: Path) -> int:
    me = procs.self_id()
    if not runfiles.try_claim(run_dir, f"started {me.pid} {me.start_ticks}"):
        runfiles.remove(run_dir / runfiles.SPEC)  # abandoned: its environment goes too
        return 0  # a recovering daemon abandoned this attempt before we got here
    spec = runfiles.read_json(run_dir / runfiles.SPEC)
    assert spec is not None, "spec.json is written before the monitor starts"
    runfiles.remove(run_dir / runfiles.SPEC)  # it holds the environment: read once
    # Only the job's own group is ever signalled; the monitor shrugs off stray signals.
    # A handler, not SIG_IGN: ignored signals would stay ignored in the job after exec.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)

    try:
        who = _identity(spec)
    except KeyError:
        return _cannot_start(run_dir, 126, f"cannot start: no user {spec['run_as_uid']}")
    uid, gid = (who.uid, who.gid) if who is not None else (None, None)
    try:
        log_fd = runfiles.open_log(Path(spec["log_path"]), uid, gid)
    except OSError as exc:
        return _cannot_start(run_dir, 126, f"cannot start: the log: {exc}")
    env = dict(spec["env"])
    progress = run_dir / runfiles.PROGRESS
    try:
        os.close(runfiles.create_owned(progress, uid, gid))
        env["GRIDSHIFT_PROGRESS_FILE"] = str(progress)
        gpus: list[int] = spec["gpu_indices"]
        try:
            ctl = gpu_control_for(spec["gpu_backend"])
        except Exception:
            ctl = None
        child = _start(spec, env, log_fd, who)
    except (OSError, subprocess.SubprocessError) as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        os.write(log_fd, f"gridshift: cannot start {spec['command'][0]!r}: {exc}\n".encode())
        os.close(log_fd)
        return _cannot_start(run_dir, code, f"cannot start: {exc}")
    os.close(log_fd)
    started_s = time.time()
    energy_start = _energy_reading(ctl, gpus)
    # the power log exists before job.json: a job.json without one means no counters
    meter = PowerLog(run_dir / runfiles.POWER, energy_start)
    meter.sample(started_s, energy_start)
    ident = procs.identify(child.pid)
    runfiles.write_json(
        run_dir / runfiles.JOB,
        {
            "pid": child.pid,
            "start_ticks": ident.start_ticks if ident else 0,
            "started_at": _iso(started_s),
        },
    )
    every_s = float(spec.get("power_sample_s") or DEFAULT_SAMPLE_S)
    while True:
        try:
            returncode = child.wait(timeout=every_s)
            break
        except subprocess.TimeoutExpired:
            meter.sample(time.time(), _energy_reading(ctl, gpus))
    ended_s = time.time()
    energy_end = _energy_reading(ctl, gpus)
    meter.sample(ended_s, energy_end)
    meter.close()
    ended_at = _iso(ended_s)
    energy_j = None
    if energy_start is not None and energy_end is not None:
        energy_j = max(0.0, sum(energy_end) - sum(energy_start))
    sig = -returncode if returncode < 0 else None
    runfiles.write_json(
        run_dir / runfiles.EXIT,
        {
            "exit_code": 128 + sig if sig else returncode,
            "signal": sig,
            "ended_at": ended_at,
            "energy_j": energy_j,
            "detail": None,
        },
    )
    if ctl is not None:
        ctl.close()
    return 0


def spawn(run_dir: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    """Start the monitor for ``run_dir`` (its ``spec.json`` written) in a session of its
    own, importing ``executors`` from where this process found it. Returns the child and
    its identity (pid and start time), for the handle."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(run_dir / "monitor.err", flags, 0o600), "ab") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "executors.shim", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    ident = procs.identify(child.pid)
    return child, ident.to_dict() if ident else {"pid": child.pid, "start_ticks": -1}


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m executors.shim RUN_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
