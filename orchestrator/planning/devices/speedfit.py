"""Fit each GPU type's throughput ratio to the V100, per model family, on Gavel's
measurements; writes ``gpu_speeds.json`` (coefficients only, never the data).

    python -m orchestrator.planning.devices.speedfit \
        ../shared/data/perf/gavel_simulation_throughputs.json

How: Gavel measured steps/s of 26 single-GPU job types (a model family at one batch size:
``ResNet-50 (batch size 32)``, ``A3C``, ...) alone on K80, P100 and V100 (the ``"null"``
entry of each ``(job type, 1)`` key). A family's ratio on a type is the geometric mean,
over its batch sizes, of steps/s on that type over steps/s on the V100; ``any`` is the
geometric mean over all 26 job types (for jobs of no known family). The fit reports the
median absolute relative error of the predicted steps/s (V100's × the family's ratio)
against each measured job type, per GPU type, and the same for the one ``any`` ratio.
Those are in-sample (each job type is one of the points its ratio was fitted on); the
fit also reports them out of sample, leaving each job type out in turn: its family's
ratio from the family's other job types (the ``any`` ratio of all the others when it is
its family's only one, as A3C and CycleGAN are), median and max.
A100, A40 and RTX 6000 were not measured by Gavel: their ratio is a stated prior, the
ratio of memory bandwidth to the V100's (900 GB/s), the same for every family.
"""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

SPEEDS = Path(__file__).with_name("gpu_speeds.json")
REFERENCE = "v100"
MEASURED = ("k80", "p100")
# memory bandwidth (GB/s) of the types Gavel did not measure, over the V100 SXM2's 900
BANDWIDTH_PRIOR = {"a100": 1555 / 900, "a40": 696 / 900, "rtx6000": 672 / 900}


def family_of(job_type: str) -> str:
    """``"ResNet-50 (batch size 32)"`` -> ``"ResNet-50"``."""
    return job_type.split(" (batch size", 1)[0].strip()


def single_gpu(data: dict, gpu: str) -> dict[str, float]:
    """Job type -> steps/s alone on one GPU of ``gpu`` (zero rows left out)."""
    out = {}
    for key, entry in data[gpu].items():
        job_type, scale = ast.literal_eval(key)
        if scale == 1 and entry.get("null", 0) > 0:
            out[job_type] = float(entry["null"])
    return out


def _gmean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _leave_one_out(each: dict[str, float]) -> dict[str, float]:
    """Relative errors of each job type's ratio predicted without it (``fit``'s doc)."""
    errs = []
    for t, measured in each.items():
        same = [r for u, r in each.items() if u != t and family_of(u) == family_of(t)]
        predicted = _gmean(same or [r for u, r in each.items() if u != t])
        errs.append(abs(predicted / measured - 1))
    return {"median_rel_err_loo": round(_median(errs), 4), "max_rel_err_loo": round(max(errs), 4)}


def fit(data: dict) -> dict:
    ref = single_gpu(data, REFERENCE)
    mix = sorted(ref)
    families = sorted({family_of(t) for t in mix})
    ratios: dict[str, dict[str, float]] = {f: {REFERENCE: 1.0} for f in [*families, "any"]}
    errors: dict[str, dict[str, float]] = {}
    for gpu in MEASURED:
        steps = single_gpu(data, gpu)
        both = [t for t in mix if t in steps]
        each = {t: steps[t] / ref[t] for t in both}
        for fam in families:
            ratios[fam][gpu] = round(_gmean([each[t] for t in both if family_of(t) == fam]), 4)
        ratios["any"][gpu] = round(_gmean(list(each.values())), 4)
        errors[gpu] = {
            "median_rel_err_family": round(
                _median([abs(ratios[family_of(t)][gpu] / each[t] - 1) for t in both]), 4
            ),
            "median_rel_err_any": round(
                _median([abs(ratios["any"][gpu] / each[t] - 1) for t in both]), 4
            ),
            "job_types": len(both),
            **_leave_one_out(each),
        }
    for gpu, prior in BANDWIDTH_PRIOR.items():
        for fam in ratios:
            ratios[fam][gpu] = round(prior, 4)
    return {
        "source": "Gavel simulation_throughputs.json (MIT), single-GPU job types alone",
        "method": __doc__.split("How: ", 1)[1].strip(),
        "reference": REFERENCE,
        "assumed": sorted(BANDWIDTH_PRIOR),
        "errors": errors,
        "ratios": ratios,
        "mix": mix,
    }


def main() -> None:
    path = Path(
        sys.argv[1]
        if len(sys.argv) > 1
        else "../shared/data/perf/gavel_simulation_throughputs.json"
    )
    result = fit(json.loads(path.read_text()))
    SPEEDS.write_text(json.dumps(result, indent=2) + "\n")
    for gpu, err in result["errors"].items():
        print(gpu, err)


if __name__ == "__main__":
    main()
