"""Right-sizing's share of idle energy saved, on the planner benchmark's stretch.

The jobs, grids and cluster of ``benchmarks/planner.py`` (2,000 Philly jobs from the
69,000th, 256 A40 GPUs in nodes of 8, DE-LU and GB 2023 hourly carbon intensity, deadlines
within 24 h, half the jobs interruptible), each run twice per policy: every node always on,
then with right-sizing (a node idle for ``IDLE_OFF_AFTER`` is powered off; woken, it answers
after ``WAKE``); the same planner in both arms (``plan_idle`` off, the default). Idle draw:
the simulator's defaults (each free GPU 20 % of the A40's 300 W limit, a server on 150 W,
PUE 1). Per grid, the idle energy of all four runs is counted over one window (the first
arrival to the latest end of any, each run's last idle draw held to it:
``sim.runner.common_window``).

- ``idle_energy_saved``: (idle energy always on − with right-sizing) / always on, the
  least over grids and policies (floor ≥ 0.5);
- ``idle_jct_increase``: the mean JCT with right-sizing over always on, minus one (what
  waiting for wake-ups costs), the most over grids and policies; ``idle_jct_increase_by``
  the same per policy;
- ``idle_deadline_misses_added``: deadline misses with right-sizing minus always on, the
  most over grids and policies (floor ≤ 0: right-sizing must not miss a deadline that
  always on meets);
- ``idle``: each run's idle and job energy, idle carbon, power-offs, wake-ups, mean JCT
  and deadline misses.

    python benchmarks/energy.py --only idle [--jobs 2000]
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from planner import GPUS, ROOT, data_dir, scenario

GRIDS = ("DE-LU", "GB")
POLICIES = ("fifo", "budget")  # the baseline and the planner (no budget: carbon-aware)
IDLE_OFF_AFTER = "30m"
WAKE = "5m"
JOBS = 2000


def spec(grid: str, jobs: int, right_size: bool) -> dict:
    s = scenario(grid, jobs, POLICIES[0], "perfect", None)
    s["policies"] = list(POLICIES)
    s["cluster"] = {"gpus": GPUS, "gpu": "a40", "gpus_per_node": 8}
    if right_size:
        s["cluster"] |= {"idle_off_after": IDLE_OFF_AFTER, "wake": WAKE}
    return s


def one(grid: str, jobs: int) -> dict:
    """Both arms on one grid, their idle energy over one window: {arm: {policy: metrics}}."""
    code = (
        "import json, sys, pathlib\n"
        "from orchestrator.sim.runner import common_window, simulate\n"
        "from orchestrator.sim.scenario import Scenario\n"
        "arms = json.loads(sys.argv[1])\n"
        f"root = pathlib.Path({str(ROOT)!r})\n"
        "outs = [simulate(Scenario.model_validate(s), root) for s in arms]\n"
        "common_window(outs)\n"
        "print(json.dumps([o.results for o in outs]))\n"
    )
    arms = [spec(grid, jobs, False), spec(grid, jobs, True)]
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arms)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    on, rs = json.loads(proc.stdout)
    return {"always_on": on, "right_sized": rs}


def measure(jobs: int | None = None) -> dict:
    if not (data_dir() / "jobs" / "philly.csv").is_file():
        return {"idle_skipped": "shared data are absent"}
    jobs = jobs or JOBS
    with ThreadPoolExecutor(2) as pool:
        by = dict(zip(GRIDS, pool.map(lambda g: one(g, jobs), GRIDS), strict=True))
    saved, jct, missed, table = [], {p: [] for p in POLICIES}, [], {}
    for g in GRIDS:
        for p in POLICIES:
            on, rs = by[g]["always_on"][p], by[g]["right_sized"][p]
            saved.append((on["idle_energy_kwh"] - rs["idle_energy_kwh"]) / on["idle_energy_kwh"])
            jct[p].append(rs["avg_jct_h"] / on["avg_jct_h"] - 1)
            missed.append(rs["deadline_misses"] - on["deadline_misses"])
            for label, m in (("always_on", on), ("right_sized", rs)):
                table[f"{g}/{p}/{label}"] = {
                    k: m[k]
                    for k in ("idle_energy_kwh", "energy_kwh", "idle_carbon_kg", "carbon_kg",
                              "power_offs", "wakes", "avg_jct_h", "deadline_misses")
                }  # fmt: skip
    return {
        "idle_energy_saved": round(min(saved), 4),
        "idle_jct_increase": round(max(max(v) for v in jct.values()), 4),
        "idle_jct_increase_by": {p: round(max(v), 4) for p, v in jct.items()},
        "idle_deadline_misses_added": max(missed),
        "idle": {
            "jobs": jobs,
            "idle_off_after": IDLE_OFF_AFTER,
            "wake": WAKE,
            "runs": table,
        },
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else None), indent=2))
