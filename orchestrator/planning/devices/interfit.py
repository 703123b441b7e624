"""Fit the co-location interference model on Gavel's measured pairs; writes
``interference.json`` beside this file (coefficients only, never the data).

    python -m orchestrator.planning.devices.interfit  # default: ../shared/data/perf/gavel_...

How: for each GPU type (k80, p100, v100), every job type (model and batch size, scale 1)
alone runs at ``null`` steps/s; paired with job type ``b`` it runs at ``x``. Its relative
speed is ``r(a, b) = x / null(a)`` (1: no slowdown). The model is
``r(a, b) = min(1, exp(-(s_a + p_b + u_a v_b)))``: ``s_a`` how sensitive ``a`` is to any
neighbour, ``p_b`` how much pressure ``b`` puts on any neighbour, and one rank-one term for
what these miss. Fitted in log space by alternating least squares; pairs measured at full
speed (r >= 0.999) are censored (the model may predict any value at or above 1 for them).
Pairs with a zero (the two do not fit in the GPU's memory together) are counted as
``infeasible`` and never predicted as possible. The fit reports, per GPU type, the median
relative error of ``r`` over the measured pairs (in sample) and over 5-fold held-out pairs.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_name("interference.json")
GPUS = ("k80", "p100", "v100")
ROUNDS = 200
DEFAULT = "../shared/data/perf/gavel_simulation_throughputs.json"


def pairs(table: dict) -> tuple[list[tuple[str, str, float]], set[tuple[str, str]]]:
    """(a, b, relative speed of a) for each measured pair, and the pairs that do not fit."""
    rows, infeasible = [], set()
    for key, entry in table.items():
        a_name, scale = ast.literal_eval(key)
        alone = entry.get("null") or 0.0
        for other, speeds in entry.items():
            if other == "null" or scale != 1:
                continue
            b_name, _ = ast.literal_eval(other)
            b_alone = (table.get(other) or {}).get("null") or 0.0
            if alone <= 0 or b_alone <= 0 or speeds[0] <= 0:
                infeasible.add((a_name, b_name))
                continue
            rows.append((a_name, b_name, float(speeds[0]) / alone))
    return rows, infeasible


def fit(rows: list[tuple[str, str, float]], names: list[str]) -> dict[str, list[float]]:
    """Coefficients [s, p, u, v] per job type."""
    index = {n: i for i, n in enumerate(names)}
    n = len(names)
    ia = np.array([index[a] for a, _, _ in rows])
    ib = np.array([index[b] for _, b, _ in rows])
    r = np.array([x for _, _, x in rows])
    y0 = -np.log(np.minimum(r, 1.0))
    censored = r >= 0.999
    design = np.zeros((len(rows), 2 * n))
    design[np.arange(len(rows)), ia] = 1
    design[np.arange(len(rows)), n + ib] += 1
    rng = np.random.default_rng(0)
    u, v = rng.normal(0, 0.1, n), rng.normal(0, 0.1, n)
    y, lam = y0.copy(), 0.01
    for _ in range(ROUNDS):
        coef, *_ = np.linalg.lstsq(design, y - u[ia] * v[ib], rcond=None)
        s, p = coef[:n], coef[n:]
        rest = y - s[ia] - p[ib]
        for i in range(n):
            m = ia == i
            x = v[ib[m]]
            u[i] = float(x @ rest[m]) / (float(x @ x) + lam)
        for j in range(n):
            m = ib == j
            x = u[ia[m]]
            v[j] = float(x @ rest[m]) / (float(x @ x) + lam)
        z = s[ia] + p[ib] + u[ia] * v[ib]
        y = np.where(censored, np.minimum(z, 0.0), y0)
    return {
        name: [round(float(c), 6) for c in (s[i], p[i], u[i], v[i])] for i, name in enumerate(names)
    }


def predict(coef: dict[str, list[float]], a: str, b: str) -> float:
    s, _, u, _ = coef[a]
    _, p, _, v = coef[b]
    return float(min(1.0, np.exp(-(s + p + u * v))))


def median_error(coef: dict, rows: list) -> float:
    errors = [abs(predict(coef, a, b) - r) / r for a, b, r in rows]
    return round(float(np.median(errors)), 4)


def held_out_error(rows: list, names: list[str], folds: int = 5) -> float:
    order = np.random.default_rng(1).permutation(len(rows))
    errors: list[float] = []
    for k in range(folds):
        test = {int(i) for i in order[k::folds]}
        train = [row for i, row in enumerate(rows) if i not in test]
        coef = fit(train, names)
        held = [row for i, row in enumerate(rows) if i in test]
        errors += [abs(predict(coef, a, b) - r) / r for a, b, r in held]
    return round(float(np.median(errors)), 4)


def unknown_job_error(coef: dict, rows: list) -> tuple[float, float]:
    """The error for a job the model does not know (a ``--name`` that is no Gavel type
    gets the mean job): each job in turn given the others' mean coefficients, over its
    measured pairs. Median and 90th percentile of the relative error."""
    errors: list[float] = []
    for name in coef:
        others = [c for n, c in coef.items() if n != name]
        mean = [float(np.mean([c[k] for c in others])) for k in range(4)]
        known = {**coef, name: mean}
        errors += [abs(predict(known, a, b) - r) / r for a, b, r in rows if name in (a, b)]
    return round(float(np.median(errors)), 4), round(float(np.percentile(errors, 90)), 4)


def measured_speeds(data: dict) -> dict[tuple[str, str, str], float]:
    """Gavel's measured relative speeds, (GPU type, job, partner) -> speed in [0.01, 1]
    (``interference.FLOOR``; one above 2 or not a number is no measurement): what the
    simulator runs a pair at when told to (``[jobs] pair_speeds``)."""
    out = {}
    for gpu in GPUS:
        rows, _ = pairs(data[gpu])
        out.update({(gpu, a, b): min(1.0, max(0.01, r)) for a, b, r in rows if 0 < r < 2.0})
    return out


def fit_gpu(table: dict) -> dict:
    rows, infeasible = pairs(table)
    names = sorted({a for a, _, _ in rows} | {b for _, b, _ in rows})
    coef = fit(rows, names)
    return {
        "pairs": len(rows),
        "median_rel_err": median_error(coef, rows),
        "median_rel_err_held_out": held_out_error(rows, names),
        "infeasible": sorted(list(x) for x in {tuple(sorted(pair)) for pair in infeasible}),
        "jobs": coef,
    }


def fit_all(path: Path) -> dict:
    data = json.loads(path.read_text())
    return {
        "source": "Gavel simulation_throughputs.json (MIT): steps/s alone and paired, scale 1",
        "method": __doc__.split("How: ", 1)[1].strip(),
        "gpus": {gpu: fit_gpu(data[gpu]) for gpu in GPUS},
    }


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    out = fit_all(path)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for gpu, c in out["gpus"].items():
        print(gpu, {k: c[k] for k in ("pairs", "median_rel_err", "median_rel_err_held_out")})


if __name__ == "__main__":
    main()
