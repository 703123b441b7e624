"""Fit the power-cap curves on the Zeus measurements; writes ``power_curves.json``.

    python -m orchestrator.planning.perffit ../shared/data/perf/zeus

How: for each GPU type (one ``summary_power_<gpu>.csv``), every workload (dataset, network,
batch size, optimizer) is normalised to its own run at the highest power limit: throughput
``t(f) = time_per_epoch(max) / time_per_epoch(f)`` and power ``p(f) = average_power /
max_limit``, with ``f = power_limit / max_limit``. Throughput is fitted with the saturating
curve ``t(f) = (1 - exp(-k (f - f0))) / (1 - exp(-k (1 - f0)))`` (t(1) = 1) by least squares
over a grid of (k, f0); power with a quadratic in f (numpy.polyfit). The fit reports the
median absolute error of normalised throughput and of normalised energy per epoch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CURVES = Path(__file__).with_name("power_curves.json")
KEY = ["dataset", "network", "batch_size", "optimizer"]


def normalised(path: Path) -> tuple[pd.DataFrame, float, float]:
    d = pd.read_csv(path)
    max_w, min_w = float(d.power_limit.max()), float(d.power_limit.min())
    ref = d[d.power_limit == max_w].set_index(KEY)[["time_per_epoch", "average_power"]]
    ref.columns = ["time_ref", "power_ref"]
    d = d.join(ref, on=KEY).dropna(subset=["time_ref"])
    d["f"] = d.power_limit / max_w
    d["tput"] = d.time_ref / d.time_per_epoch
    d["power"] = d.average_power / max_w
    d["energy"] = (d.time_per_epoch * d.average_power) / (d.time_ref * d.power_ref)
    return d, max_w, min_w


def tput_curve(f, k: float, f0: float):
    return (1 - np.exp(-k * (np.asarray(f) - f0))) / (1 - np.exp(-k * (1 - f0)))


def fit_gpu(path: Path) -> dict:
    d, max_w, min_w = normalised(path)
    f, t = d.f.to_numpy(), d.tput.to_numpy()
    best = None
    for k in np.linspace(0.5, 40, 160):
        for f0 in np.linspace(-0.5, float(f.min()) - 0.01, 120):
            err = float(np.sum((tput_curve(f, k, f0) - t) ** 2))
            if best is None or err < best[0]:
                best = (err, float(k), float(f0))
    _, k, f0 = best
    power = [float(c) for c in np.polyfit(f, d.power.to_numpy(), 2)]
    curve = {
        "max_limit_w": max_w,
        "min_limit_w": min_w,
        "tput_k": round(k, 6),
        "tput_f0": round(f0, 6),
        "power_poly": [round(c, 6) for c in power],
    }
    curve.update(errors(curve, d))
    curve["workloads"] = int(d.groupby(KEY).ngroups)
    curve["rows"] = len(d)
    return curve


def errors(curve: dict, d: pd.DataFrame) -> dict:
    t_pred = tput_curve(d.f, curve["tput_k"], curve["tput_f0"])
    p_pred = np.polyval(curve["power_poly"], d.f)
    p_ref = np.polyval(curve["power_poly"], 1.0)
    e_pred = (p_pred / t_pred) / p_ref
    return {
        "median_abs_err_tput": round(float(np.median(np.abs(t_pred - d.tput))), 4),
        "median_abs_err_energy": round(float(np.median(np.abs(e_pred - d.energy))), 4),
    }


def fit_all(folder: Path) -> dict:
    curves = {}
    for path in sorted(folder.glob("summary_power_*.csv")):
        curves[path.stem.removeprefix("summary_power_")] = fit_gpu(path)
    return {
        "source": "Zeus summary_power_<gpu>.csv (Apache-2.0), normalised per workload",
        "method": __doc__.split("How: ", 1)[1].strip(),
        "gpus": curves,
    }


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/perf/zeus")
    data = fit_all(folder)
    CURVES.write_text(json.dumps(data, indent=2) + "\n")
    for gpu, c in data["gpus"].items():
        print(gpu, {k: c[k] for k in ("median_abs_err_tput", "median_abs_err_energy")})


if __name__ == "__main__":
    main()
