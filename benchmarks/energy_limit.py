"""The site power limit holds in what-if runs, and what it costs.

The jobs, grids and cluster of ``benchmarks/planner.py`` (2,000 Philly jobs from the
69,000th, 256 A40 GPUs, DE-LU and GB 2023 hourly carbon intensity, deadlines within 24 h,
half the jobs interruptible), each policy run without a limit and under each site limit
of ``LIMITS``. What counts is the site's modelled draw: the jobs' (GPUs at their cap, the
host's share, × PUE) and the idle GPUs' and servers' (20.2 kW with all 256 GPUs idle, so
the issue's 15 kW cannot hold and is refused, as the daemon refuses it: 256 A40s at their
100 W lowest limit are 25.6 kW). 30 kW leaves the jobs 10 kW above the idle draw (the
queue grows); 40 kW cuts the peaks.

- ``peak_over_limit``: the largest draw seen / the limit, the most over grids, policies
  and limits (floor ≤ 1.0);
- ``limit_jct_increase_L``: mean JCT under limit L over without it, minus one (jobs wait
  for power and run capped), the most over grids and policies;
- ``limit_carbon_change_L``: carbon under limit L over without it, minus one, the most
  over grids and policies (negative: the limit emitted less);
- ``limit``: each run's peak, carbon, energy, mean JCT and deadline misses.

    python benchmarks/energy.py --only limit [--jobs 2000]
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from planner import ROOT, data_dir, scenario

GRIDS = ("DE-LU", "GB")
POLICIES = ("fifo", "budget")  # the baseline and the planner (no budget: carbon-aware)
LIMITS = ("30kW", "40kW")
JOBS = 2000
KEYS = ("peak_power_kw", "carbon_kg", "energy_kwh", "avg_jct_h", "deadline_misses")


def spec(grid: str, jobs: int, policy: str, limit: str | None) -> dict:
    s = scenario(grid, jobs, policy, "perfect", None)
    s["power_limit_w"] = limit
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
        return {"limit_skipped": "shared data are absent"}
    from orchestrator.timeparse import parse_power_w

    jobs = jobs or JOBS
    runs = [(g, p, lim) for g in GRIDS for p in POLICIES for lim in (None, *LIMITS)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: one(spec(r[0], jobs, r[1], r[2])), runs))
    by = dict(zip(runs, results, strict=True))
    out: dict = {"peak_over_limit": 0.0}
    table = {}
    for lim in LIMITS:
        limit_kw = parse_power_w(lim) / 1000
        jct, carbon = [], []
        for g in GRIDS:
            for p in POLICIES:
                free, held = by[(g, p, None)], by[(g, p, lim)]
                over = round(held["peak_power_kw"] / limit_kw, 4)
                out["peak_over_limit"] = max(out["peak_over_limit"], over)
                jct.append(held["avg_jct_h"] / free["avg_jct_h"] - 1)
                carbon.append(held["carbon_kg"] / free["carbon_kg"] - 1)
                table[f"{g}/{p}/no_limit"] = {k: free[k] for k in KEYS}
                table[f"{g}/{p}/{lim}"] = {k: held[k] for k in KEYS}
        out[f"limit_jct_increase_{lim}"] = round(max(jct), 4)
        out[f"limit_carbon_change_{lim}"] = round(max(carbon), 4)
    out["limit"] = {"jobs": jobs, "limits": list(LIMITS), "runs": table}
    return out


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else None), indent=2))
