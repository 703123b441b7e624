"""Right-sizing's share of idle energy saved, on the planner benchmark's stretch.

The jobs, grids and cluster of ``benchmarks/planner.py`` (2,000 Philly jobs from the
69,000th, 256 A40 GPUs in nodes of 8, DE-LU and GB 2023 hourly carbon intensity, deadlines
within 24 h, half the jobs interruptible), each run twice per policy: every node always on,
then with right-sizing (a node idle for ``IDLE_OFF_AFTER`` is powered off; woken, it answers
after ``WAKE``). Idle draw: the simulator's defaults (each free GPU 20 % of the A40's
300 W limit, a server on 150 W, PUE 1).

- ``idle_energy_saved``: (idle energy always on − with right-sizing) / always on, the
  least over grids and policies (floor ≥ 0.5);
- ``idle_jct_increase``: the mean JCT with right-sizing over always on, minus one (what
  waiting for wake-ups costs), the most over grids and policies;
- ``idle``: each run's idle and job energy, idle carbon, power-offs, wake-ups, mean JCT.

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


def spec(grid: str, jobs: int, policy: str, right_size: bool) -> dict:
    s = scenario(grid, jobs, policy, "perfect", None)
    s["cluster"] = {"gpus": GPUS, "gpu": "a40", "gpus_per_node": 8}
    if right_size:
        s["cluster"] |= {"idle_off_after": IDLE_OFF_AFTER, "wake": WAKE}
    return s


def one(s: dict) -> dict:
    code = (
        "import json, sys\n"
        "from orchestrator.sim.runner import simulate\n"
        "from orchestrator.sim.scenario import Scenario\n"
        "s = json.loads(sys.argv[1])\n"
        f"out = simulate(Scenario.model_validate(s), __import__('pathlib').Path({str(ROOT)!r}))\n"
        "print(json.dumps(out.results[s['policies'][0]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(s)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(proc.stdout)


def measure(jobs: int | None = None) -> dict:
    if not (data_dir() / "jobs" / "philly.csv").is_file():
        return {"idle_skipped": "shared data are absent"}
    jobs = jobs or JOBS
    runs = [(g, p, rs) for g in GRIDS for p in POLICIES for rs in (False, True)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: one(spec(r[0], jobs, r[1], r[2])), runs))
    by = dict(zip(runs, results, strict=True))
    saved, jct, table = [], [], {}
    for g in GRIDS:
        for p in POLICIES:
            on, rs = by[(g, p, False)], by[(g, p, True)]
            saved.append((on["idle_energy_kwh"] - rs["idle_energy_kwh"]) / on["idle_energy_kwh"])
            jct.append(rs["avg_jct_h"] / on["avg_jct_h"] - 1)
            for label, m in (("always_on", on), ("right_sized", rs)):
                table[f"{g}/{p}/{label}"] = {
                    k: m[k]
                    for k in ("idle_energy_kwh", "energy_kwh", "idle_carbon_kg", "carbon_kg",
                              "power_offs", "wakes", "avg_jct_h", "deadline_misses")
                }  # fmt: skip
    return {
        "idle_energy_saved": round(min(saved), 4),
        "idle_jct_increase": round(max(jct), 4),
        "idle": {
            "jobs": jobs,
            "idle_off_after": IDLE_OFF_AFTER,
            "wake": WAKE,
            "runs": table,
        },
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else None), indent=2))
