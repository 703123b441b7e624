"""Wall time of ``gridshift submit`` and ``gridshift ls`` (median of several runs), on an
empty queue and on one holding 1,000 queued jobs. Prints JSON.

    python benchmarks/cli.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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


def _time(cmd: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _import_s(module: str) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gridshift-bench-"))
    env = {**os.environ, "GRIDSHIFT_HOME": str(home), "GRIDSHIFT_FAKE_GPUS": "8"}
    gs = _gridshift()
    try:
        subprocess.run([*gs, "ls"], env=env, check=True, stdout=subprocess.DEVNULL)
        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "runs": args.runs,
            "python_startup_s": _import_s("sys"),
            "import_sqlmodel_s": _import_s("sqlmodel"),
            "submit_empty_queue_s": _time([*gs, "submit", "--", "true"], env, args.runs),
            "ls_empty_queue_s": None,
        }
        subprocess.run(
            [*gs, "cancel", *map(str, range(1, args.runs + 1))],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        result["ls_empty_queue_s"] = _time([*gs, "ls"], env, args.runs)
        sweep = home / "sweep.jsonl"
        sweep.write_text("".join('{"command": ["true"], "gpus": 1}\n' for _ in range(1000)))
        start = time.perf_counter()
        subprocess.run(
            [*gs, "submit", "--file", str(sweep)], env=env, check=True, stdout=subprocess.DEVNULL
        )
        result["submit_sweep_1000_jobs_s"] = time.perf_counter() - start
        result["submit_1000_queued_s"] = _time([*gs, "submit", "--", "true"], env, args.runs)
        result["ls_1000_queued_s"] = _time([*gs, "ls"], env, args.runs)
        result["ls_json_1000_queued_s"] = _time([*gs, "ls", "--json"], env, args.runs)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(
        json.dumps(
            {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, indent=2
        )
    )


if __name__ == "__main__":
    main()
