"""PNG plots of a what-if run (matplotlib, no display needed):

- ``carbon_power.png``: the carbon signal over the run, and the cluster's power draw per
  policy beneath it, so one sees each policy move work into the troughs;
- ``carbon_vs_jct.png``: carbon and average job completion time per policy, side by side.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from orchestrator.sim.metrics import power_timeline
from orchestrator.sim.runner import Outcome


def write_plots(outcome: Outcome, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    inputs = outcome.inputs
    paths = []

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=(1, 2))
    end = max(float(r.finish_s.max()) for r in outcome.runs.values())
    start = float(inputs.jobs.submit_s.min())
    carbon = inputs.carbon
    first, last = int(carbon.index(start)), int(carbon.index(end))
    slots = carbon.start_s + np.arange(first, last + 1) * carbon.step_s
    top.step(_dates(slots), carbon.values[first : last + 1], where="post", color="0.3", lw=0.8)
    top.set_ylabel(f"carbon\n{inputs.signal_label}")
    top.set_title(f"{inputs.scenario.name}: carbon intensity and cluster power")
    step = max(carbon.step_s, (end - start) / 2000)
    for name, run in outcome.runs.items():
        t, watts = power_timeline(inputs, run, step)
        bottom.step(_dates(t), watts / 1000, where="post", lw=0.9, label=name)
    bottom.set_ylabel("cluster power (kW)")
    bottom.legend(loc="upper right")
    fig.autofmt_xdate()
    fig.tight_layout()
    paths.append(folder / "carbon_power.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    names = list(outcome.results)
    carbon_kg = [outcome.results[n]["carbon_kg"] for n in names]
    jct_h = [outcome.results[n]["avg_jct_h"] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, carbon_kg, color="tab:green")
    left.set_ylabel("carbon (kg CO2e)")
    right.bar(names, jct_h, color="tab:blue")
    right.set_ylabel("average job completion time (h)")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"{inputs.scenario.name}: carbon vs completion time")
    fig.tight_layout()
    paths.append(folder / "carbon_vs_jct.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _dates(seconds: np.ndarray):
    return [datetime.fromtimestamp(float(s), UTC) for s in seconds]
