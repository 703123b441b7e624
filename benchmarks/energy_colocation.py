"""Co-location (EaCO) in the simulator: energy saved and what it costs in job completion time.

The planner benchmark's stretch of Philly (``benchmarks/planner.py``: 2,000 jobs from the
69,000th in arrival order, deadlines within 24 h, half interruptible) on DE-LU 2023, each
job given a Gavel job type by seed (``gputypes.model_mix``: Philly names no models), on
``CLUSTER``: 128 V100s and 128 P100s (each job runs at its model's Gavel speed on each).
Every job may share (``share = 1``); the baseline is the same run with none sharing. A
pair runs at the speeds Gavel measured for it (``pair_speeds = "measured"``), while the
fitted interference model decides which pairs form (refined online by what each pair ran
at). For each policy in ``POLICIES``:

- ``colocation_energy_saving``: 1 − energy with co-location / energy without;
- ``colocation_jct_increase``: mean JCT with co-location / without − 1 (negative: faster,
  the GPUs co-location frees shorten the queue).

The two keys are ``fifo``'s (EaCO's setting: the same scheduler with and without
co-location, no time-shifting); ``_carbon_aware`` ones are ``lowest-window``'s, where jobs
also wait for low-carbon hours (fewer run at once, so fewer pairs form). Each policy's
figures are under ``colocation``. Co-location moves (``[jobs] moves``, off by default),
``fifo``'s: ``_with_moves``, moves for jobs waiting for GPUs (``"waiting-jobs"``);
``_emptying_servers``, moves that empty a server right-sizing then powers down
(``"empty-servers"``). ``colocation_seeds``: ``fifo``'s savings without and with moves
that empty servers for the scenario's seed and ``SEEDS`` more (each draws the jobs' models,
who may be interrupted and the deadlines anew): one run is one sample.

    python benchmarks/energy.py --only colocation [--jobs N]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before benchmarks/ (its placement.py is no package)
sys.path.append(str(Path(__file__).parent))

JOBS = 2000
RIGHT_SIZING = {"idle_off_after": "30m", "wake": "5m"}  # benchmarks/energy_idle.py's
POLICIES = ("fifo", "lowest-window")
SEEDS = (1, 2)  # fifo's savings are also measured with these seeds
# mixed: 16 servers of 8 V100s and 16 of 8 P100s; traced durations are V100 runs
CLUSTER = {
    "gpu": "v100",
    "nodes": [
        {"name": f"{gpu}-{i:02d}", "gpus": 8, "gpu": gpu, "rack": gpu}
        for gpu in ("v100", "p100")
        for i in range(16)
    ],
}


def scenario(jobs: int, share: float, right_size: bool = True, moves: bool | str = False) -> dict:
    """The planner benchmark's stretch on DE-LU (``planner.scenario``), on the mixed
    cluster, with that share of the jobs allowed to share."""
    from planner import SKIP
    from planner import scenario as planner_scenario

    base = planner_scenario("DE-LU", jobs, POLICIES[0], "perfect", None)
    return base | {
        "name": f"Philly {SKIP}+{jobs}, co-location {share:g}",
        "policies": list(POLICIES),
        "jobs": base["jobs"] | {"share": share, "pair_speeds": "measured", "moves": moves},
        "cluster": dict(CLUSTER) | (RIGHT_SIZING if right_size else {}),
    }


def measure(jobs: int | None = None) -> dict:
    from planner import data_dir

    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario

    if not (data_dir() / "jobs" / "philly.csv").is_file():
        return {"colocation_skipped": "shared data absent"}
    jobs = jobs or JOBS
    alone = simulate(Scenario.model_validate(scenario(jobs, 0.0)), ROOT)
    shared = simulate(Scenario.model_validate(scenario(jobs, 1.0)), ROOT)
    per_policy = {name: compare(alone, shared, name) for name in POLICIES}
    moved, emptied = (
        compare(alone, simulate(Scenario.model_validate(moving), ROOT), POLICIES[0])
        for moving in (
            scenario(jobs, 1.0, moves=kind) | {"policies": [POLICIES[0]]}
            for kind in ("waiting-jobs", "empty-servers")
        )
    )
    fifo, aware = per_policy[POLICIES[0]], per_policy[POLICIES[-1]]
    seeds = [{"seed": 0, "saving": fifo["energy_saving"], "emptying": emptied["energy_saving"]}]
    for seed in SEEDS:
        specs = [
            scenario(jobs, share, moves=kind) | {"policies": [POLICIES[0]], "seed": seed}
            for share, kind in ((0.0, False), (1.0, False), (1.0, "empty-servers"))
        ]
        runs = [simulate(Scenario.model_validate(spec), ROOT) for spec in specs]  # fmt: skip
        saving, empty = (compare(runs[0], run, POLICIES[0])["energy_saving"] for run in runs[1:])
        seeds.append({"seed": seed, "saving": saving, "emptying": empty})
    return {
        "colocation_energy_saving": fifo["energy_saving"],
        "colocation_jct_increase": fifo["jct_increase"],
        "colocation_runtime_increase": fifo["runtime_increase"],
        "colocation_energy_saving_jobs_only": fifo["energy_saving_jobs_only"],
        "colocation_energy_saving_carbon_aware": aware["energy_saving"],
        "colocation_jct_increase_carbon_aware": aware["jct_increase"],
        "colocation_energy_saving_with_moves": moved["energy_saving"],
        "colocation_jct_increase_with_moves": moved["jct_increase"],
        "colocation_energy_saving_emptying_servers": emptied["energy_saving"],
        "colocation_jct_increase_emptying_servers": emptied["jct_increase"],
        "colocation_seeds": seeds,
        "colocation": {
            "jobs": jobs,
            "cluster": "16 x 8 V100 + 16 x 8 P100, right-sizing on (30m, wake 5m) in both runs",
            "pair_speeds": "Gavel's measured; the model decides, refined online",
            "policies": per_policy,
            "with_moves": moved,
            "emptying_servers": emptied,
            "note": "[without, with] co-location; energy_saving: the cluster's (jobs + idle "
            "GPUs and servers on); energy_saving_jobs_only: the jobs' alone",
        },
    }


def compare(alone, shared, name: str) -> dict:
    """One policy's figures without and with co-location."""
    a, s = alone.results[name], shared.results[name]
    total_a = a["energy_kwh"] + a.get("idle_energy_kwh", 0.0)
    total_s = s["energy_kwh"] + s.get("idle_energy_kwh", 0.0)
    return {
        "energy_saving": round(1 - total_s / total_a, 4),
        "energy_saving_jobs_only": round(1 - s["energy_kwh"] / a["energy_kwh"], 4),
        "jct_increase": round(s["avg_jct_h"] / a["avg_jct_h"] - 1, 4),
        "runtime_increase": runtime_increase(alone.runs[name], shared.runs[name]),
        "pairs": len(shared.runs[name].pairs or ()),
        "moves": shared.runs[name].moves,  # jobs checkpointed to join another
        "splits": shared.runs[name].splits,  # jobs of a pair checkpointed to keep a deadline
        "energy_kwh": [a["energy_kwh"], s["energy_kwh"]],
        "idle_energy_kwh": [a.get("idle_energy_kwh"), s.get("idle_energy_kwh")],
        "avg_jct_h": [a["avg_jct_h"], s["avg_jct_h"]],
        "deadline_misses": [a["deadline_misses"], s["deadline_misses"]],
        "carbon_kg": [a["carbon_kg"], s["carbon_kg"]],
    }


def runtime_increase(alone, shared) -> float | None:
    """EaCO's measure: the paired jobs' run time (first start to finish) with co-location
    over the same jobs' without, minus one."""
    paired = sorted({j for h, i, _ in shared.pairs or () for j in (h, i)})
    if not paired:
        return None
    ran_a = (alone.finish_s - alone.first_start_s)[paired].sum()
    ran_s = (shared.finish_s - shared.first_start_s)[paired].sum()
    return round(float(ran_s / ran_a) - 1, 4)


if __name__ == "__main__":
    import json

    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else None), indent=2))
