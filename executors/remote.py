"""What the SSH executor runs on a server: ``python3 -m executors.remote VERB ...``.

The daemon ships this package (``executors.bundle``) to each server once and calls these
verbs over SSH with argument lists it quotes itself. Values from users (commands, paths,
environments) travel as JSON on standard input, never on a command line. Every verb
prints one JSON object. Paths are relative to the login directory unless absolute.

- ``launch``: stdin ``{"spec": {...}}``; writes ``spec.json`` in the run directory and
  starts the job monitor (``executors.shim``, the one local jobs use) in a session of its
  own, so the job outlives the SSH connection. Prints the monitor's identity and the
  absolute run directory and log path.
- ``status``: stdin ``{"runs": [{"run_dir", "monitor", "power_offset"}]}``; for each run
  its claim, ``job.json``, ``exit.json``, progress text, whether monitor and job live,
  and the power log from the offset on.
- ``signal RUN_DIR SIG``: the job's process group, when that very job still runs.
- ``fence RUN_DIR``: make sure an attempt the daemon gave up on does not run: claim it
  abandoned when its monitor never started, or SIGKILL the job.
- ``claim RUN_DIR``: claim it abandoned (recovery of an interrupted launch).
- ``read PATH OFFSET``: raw bytes of a log from OFFSET on (exit 3 when it is missing).

Stdlib only, and Python 3.9 or newer: this runs on the servers' own ``python3``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from executors import procs, runfiles, shim

READ_MAX = 1 << 20


def _abs(path: str) -> Path:
    return Path(os.path.expanduser(path)).absolute()


def _alive(data: dict | None) -> bool:
    return bool(data) and procs.is_alive(procs.ProcessId.from_dict(data))


def launch(request: dict) -> dict:
    spec = dict(request["spec"])
    run_dir = _abs(spec["run_dir"])
    log_path = _abs(spec["log_path"])
    workdir = _abs(spec["workdir"]) if spec.get("workdir") else Path.home()
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    spec.update(run_dir=str(run_dir), log_path=str(log_path), workdir=str(workdir))
    runfiles.write_json(run_dir / runfiles.SPEC, spec)
    _, monitor = shim.spawn(run_dir)
    return {"monitor": monitor, "run_dir": str(run_dir), "log_path": str(log_path)}


def _status_of(run: dict) -> dict:
    run_dir = _abs(run["run_dir"])
    job = runfiles.read_json(run_dir / runfiles.JOB)  # before the power log: see shim
    power_path = run_dir / runfiles.POWER
    power, offset = "", int(run.get("power_offset") or 0)
    if power_path.exists():
        with open(power_path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(READ_MAX)
        power = data[: data.rfind(b"\n") + 1].decode("ascii", "replace")
    try:
        progress = (run_dir / runfiles.PROGRESS).read_text(errors="replace")[:4096]
    except OSError:
        progress = None
    monitor_alive = _alive(run.get("monitor"))
    return {
        "claim": runfiles.read_claim(run_dir) if run_dir.exists() else None,
        "job": job,
        "exit": runfiles.read_json(run_dir / runfiles.EXIT),  # after the liveness checks
        "monitor_alive": monitor_alive,
        "job_alive": _alive(job),
        "progress": progress,
        "power": power,
        "power_exists": power_path.exists(),
    }


def status(request: dict) -> dict:
    return {"runs": [_status_of(run) for run in request["runs"]]}


def send_signal(run_dir: str, sig: int) -> dict:
    job = runfiles.read_json(_abs(run_dir) / runfiles.JOB)
    if not _alive(job):
        return {"sent": False}
    try:
        os.killpg(int(job["pid"]), sig)
    except ProcessLookupError:
        return {"sent": False}
    return {"sent": True}


def claim(run_dir: str) -> dict:
    path = _abs(run_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    claimed = runfiles.try_claim(path, "abandoned")
    spec = runfiles.read_json(path / runfiles.SPEC) or {}
    return {
        "claimed": claimed,
        "claim": runfiles.read_claim(path),
        "run_dir": str(path),
        "log_path": spec.get("log_path"),
    }


def fence(run_dir: str) -> dict:
    out = claim(run_dir)
    if out["claimed"]:
        return {"settled": True, "ran": False}
    killed = send_signal(run_dir, signal.SIGKILL)["sent"]
    return {"settled": True, "ran": True, "killed": killed}


def read(path: str, offset: int) -> int:
    try:
        with open(_abs(path), "rb") as fh:
            fh.seek(offset)
            data = fh.read(READ_MAX)
    except FileNotFoundError:
        return 3
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
