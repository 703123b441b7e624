"""What the SSH executor runs on a server: ``python3 -m executors.remote VERB ...``.

The daemon ships this package (``executors.bundle``) to each server once and calls these
verbs over SSH with argument lists it quotes itself. Values from users (commands, paths,
environments) travel as JSON on standard input, never on a command line. Every verb
prints one JSON object. Paths are relative to the login directory unless absolute.

- ``launch``: stdin ``{"spec": {...}}``; writes ``spec.json`` (which the monitor removes
  once read: it holds the environment) and ``launch.json`` (the log's path, for recovery)
  in the run directory and starts the job monitor (``executors.shim``, the one local jobs
  use) in a session of its own, so the job outlives the SSH connection. Prints the
  monitor's identity and the absolute run directory and log path.
- ``status``: stdin ``{"runs": [{"run_dir", "monitor", "power_offset"}]}``; for each run
  its claim, ``job.json``, ``exit.json``, progress text, whether monitor and job live,
  and the power log from the offset on.
- ``signal RUN_DIR SIG``: the job's process group, when that very job still runs.
- ``fence RUN_DIR``: make sure an attempt the daemon gave up on does not run: claim it
  abandoned when its monitor never started, or SIGKILL the job (waiting, a few seconds
  at most, for a monitor that claimed the run to start it or exit; not settled else).
- ``claim RUN_DIR``: claim it abandoned (recovery of an interrupted launch).
- ``read PATH OFFSET``: raw bytes of a log from OFFSET on (exit 3 when it is missing).

Stdlib only, and Python 3.9 or newer: this runs on the servers' own ``python3``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

from executors import procs, runfiles, shim

READ_MAX = 1 << 20
FENCE_WAIT_S = 5.0  # how long a fence waits for a claimed run's job.json
LAUNCH = "launch.json"  # where the job's log is, for recovery


def _abs(path: str) -> Path:
    return Path(os.path.expanduser(path)).absolute()


def _alive(data: dict | None) -> bool:
    """Whether the process a record names (a monitor, or a job's ``job.json``, which
    the job may have forged) still runs; False for a record that names none."""
    if not isinstance(data, dict):
        return False
    try:
        proc = procs.ProcessId.from_dict(data)
    except (KeyError, TypeError, ValueError, OverflowError):
        return False
    return proc.pid > 1 and procs.is_alive(proc)


def _job(run_dir: Path) -> dict | None:
    """The job's start record when it can be believed (``runfiles.check_job``)."""
    data = runfiles.read_json(run_dir / runfiles.JOB)
    try:
        runfiles.check_job(data)
    except runfiles.BadRunFile:
        return None
    return data


def _ascii(data: bytes) -> str:
    """Bytes as text of the same length (each byte not ASCII becomes ``?``), so the
    daemon counts the bytes it mirrored right whatever a job wrote in its power log."""
    return bytes(b if b < 128 else 63 for b in data).decode("ascii")


def launch(request: dict) -> dict:
    spec = dict(request["spec"])
    run_dir = _abs(spec["run_dir"])
    log_path = _abs(spec["log_path"])
    workdir = _abs(spec["workdir"]) if spec.get("workdir") else Path.home()
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    spec.update(run_dir=str(run_dir), log_path=str(log_path), workdir=str(workdir))
    # the log's path outlives spec.json, which the monitor removes once read
    runfiles.write_json(run_dir / LAUNCH, {"log_path": str(log_path)})
    runfiles.write_json(run_dir / runfiles.SPEC, spec)
    _, monitor = shim.spawn(run_dir)
    return {"monitor": monitor, "run_dir": str(run_dir), "log_path": str(log_path)}


def _status_of(run: dict) -> dict:
    run_dir = _abs(run["run_dir"])
    job = _job(run_dir)  # before the power log: see shim
    power_path = run_dir / runfiles.POWER
    power, offset = "", int(run.get("power_offset") or 0)
    if power_path.exists():
        with open(power_path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(READ_MAX)
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == READ_MAX:  # no line end in a whole read: garbage,
            data, end = data[:-1] + b"\n", READ_MAX  # passed on as one line to skip
        power = _ascii(data[:end])
    progress = runfiles.read_progress(run_dir)
    monitor_alive = _alive(run.get("monitor"))
    exit_data = runfiles.read_json(run_dir / runfiles.EXIT)  # after the liveness checks
    if exit_data is None and (run_dir / runfiles.EXIT).exists():
        exit_data = ""  # there but not a JSON object: the daemon calls it a bad record
    return {
        "claim": runfiles.read_claim(run_dir) if run_dir.exists() else None,
        "job": job,
        "exit": exit_data,
        "monitor_alive": monitor_alive,
        "job_alive": _alive(job),
        "progress": progress,
        "power": power,
        "power_exists": power_path.exists(),
    }


def status(request: dict) -> dict:
    return {"runs": [_status_of(run) for run in request["runs"]]}


def send_signal(run_dir: str, sig: int) -> dict:
    job = _job(_abs(run_dir))
    if not _alive(job):
        return {"sent": False}
    try:
        if os.getpgid(job["pid"]) != job["pid"]:  # the job leads its own group; else forged
            return {"sent": False}
        os.killpg(job["pid"], sig)
    except ProcessLookupError:
        return {"sent": False}
    return {"sent": True}


def claim(run_dir: str) -> dict:
    path = _abs(run_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    claimed = runfiles.try_claim(path, "abandoned")
    if claimed:
        runfiles.remove(path / runfiles.SPEC)  # it holds the job's environment
    launched = runfiles.read_json(path / LAUNCH) or {}
    return {
        "claimed": claimed,
        "claim": runfiles.read_claim(path),
        "run_dir": str(path),
        "log_path": launched.get("log_path"),
    }


def _monitor_of(claim_text: str | None) -> dict | None:
    """The monitor a ``started <pid> <ticks>`` claim names, as a record for ``_alive``."""
    try:
        word, pid, ticks = (claim_text or "").split()
        return {"pid": int(pid), "start_ticks": int(ticks)} if word == "started" else None
    except ValueError:
        return None


def fence(run_dir: str) -> dict:
    """Settled once the attempt is known not to run. A monitor that claimed the run but
    has not yet written ``job.json`` may be about to start the job (it opens the log and
    reads the GPUs' energy first): wait for its ``job.json`` (then kill the job) or its
    exit, at most ``FENCE_WAIT_S``; a monitor still between the two is not settled (the
    daemon fences again on a later pass)."""
    out = claim(run_dir)
    if out["claimed"]:
        return {"settled": True, "ran": False}
    path = _abs(run_dir)
    monitor = _monitor_of(out["claim"])
    deadline = time.monotonic() + FENCE_WAIT_S
    while _job(path) is None and _alive(monitor) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = send_signal(run_dir, signal.SIGKILL)["sent"]
    settled = killed or _job(path) is not None or not _alive(monitor)
    return {"settled": settled, "ran": True, "killed": killed}


def read(path: str, offset: int) -> int:
    """A block of a log: never through a link, only a regular file."""
    try:
        fd = os.open(_abs(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return 3
    except OSError as exc:  # a link (ELOOP), a permission: not a log this account reads
        sys.stderr.write(f"cannot read {path}: {exc.strerror}\n")
        return 4
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            sys.stderr.write(f"cannot read {path}: not a regular file\n")
            return 4
        fh.seek(offset)
        data = fh.read(READ_MAX)
    sys.stdout.buffer.write(data)
    return 0


def main(argv: list[str]) -> int:
    verb, args = (argv[0], argv[1:]) if argv else ("", [])
    if verb == "read":
        return read(args[0], int(args[1]))
    if verb in ("launch", "status"):
        request = json.load(sys.stdin)
        out = launch(request) if verb == "launch" else status(request)
    elif verb == "signal":
        out = send_signal(args[0], int(args[1]))
    elif verb == "fence":
        out = fence(args[0])
    elif verb == "claim":
        out = claim(args[0])
    else:
        print(f"usage: python -m executors.remote launch|status|signal|fence|claim|read ({verb!r})",
              file=sys.stderr)  # fmt: skip
        return 2
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
