"""Wall time of the everyday commands (``submit``, ``ls``, ``show``, ``status``,
``cancel``, ``logs``), median of several runs, against a running daemon (the socket
client) and in single-user mode without one (answered in-process from the database),
next to Python's own start-up. A fresh home with fake GPUs and a small queue. Prints JSON.

    python benchmarks/cli.py [--runs 9] [--queued 20] [--full]

``--full`` measures the full typer command line (GRIDSHIFT_NO_FAST=1) instead of the
fast path. Each median is given as wall time and as the command's own CPU time (against a
daemon, the daemon's share is not in it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gridshift() -> list[str]:
    script = shutil.which("gridshift", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "orchestrator"]


def _once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and the command's CPU time (user + system; on a shared machine the
    wall time also counts the others' load, its CPU time much less)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _median(cmd, env, runs: int) -> tuple[float, float]:
    return _medians([_once(cmd, env) for _ in range(runs)])


def _medians(times: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def _verbs(gs: list[str], env: dict[str, str], runs: int, victims: list[int]) -> dict:
    """The six verbs' medians (wall, CPU); ``cancel`` cancels another queued job each run."""
    out = {
        "submit": _median([*gs, "submit", "--", "true"], env, runs),
        "ls": _median([*gs, "ls"], env, runs),
        "show": _median([*gs, "show", "1"], env, runs),
        "status": _median([*gs, "status"], env, runs),
        "logs": _median([*gs, "logs", "1"], env, runs),
    }
    out["cancel"] = _medians([_once([*gs, "cancel", str(victims.pop())], env) for _ in range(runs)])
    return {"wall_s": {k: v[0] for k, v in out.items()}, "cpu_s": {k: v[1] for k, v in out.items()}}


def _submit(gs, env, *args: str) -> int:
    done = subprocess.run([*gs, "submit", *args], env=env, check=True, capture_output=True)
    return int(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--queued", type=int, default=20, help="queued jobs in the queue")
    parser.add_argument("--full", action="store_true", help="the full typer path")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gridshift-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSHIFT_")}
    env |= {"GRIDSHIFT_HOME": str(home), "GRIDSHIFT_FAKE_GPUS": "8"}
    if args.full:
        env["GRIDSHIFT_NO_FAST"] = "1"
    gs = _gridshift()
    daemon = None
    try:
        # job 1 prints a line (for show and logs); then a queue that stays queued
        _submit(gs, env, "--now", "--", "sh", "-c", "echo hello")
        idle = [*gs, "daemon", "--until-idle", "--interval", "0.1"]
        subprocess.run(idle, env=env, check=True, capture_output=True)
        # while the daemon serves, this one holds every GPU: the rest stays queued
        _submit(gs, env, "--gpus", "8", "--", "sleep", "600")
        victims = [_submit(gs, env, "--", "true") for _ in range(2 * args.runs)]
        for _ in range(args.queued):
            _submit(gs, env, "--", "true")
        result: dict = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}",
            "path": "full typer" if args.full else "fast",
            "runs": args.runs,
            "queued_jobs": args.queued + 2 * args.runs,
            "python_startup_s": _median([sys.executable, "-c", "pass"], env, args.runs)[0],
        }
        result["single_user"] = _verbs(gs, env, args.runs, victims[: args.runs])
        daemon = subprocess.Popen(
            [*gs, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while not (home / "gridshift.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # its first pass starts the blocker
        result["daemon"] = _verbs(gs, env, args.runs, victims[args.runs :])
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
        _kill_jobs(home)
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(_rounded(result), indent=2))


def _kill_jobs(home: Path) -> None:
    """The jobs the daemon left running (the blocker), by their process groups; then a
    moment for their monitors to write what they exited with (before the home goes)."""
    records = list(home.glob("run/attempt-*/job.json"))
    for record in records:
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(
        (r.parent / "exit.json").exists() for r in records
    ):
        time.sleep(0.1)
    time.sleep(0.2)


def _rounded(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
