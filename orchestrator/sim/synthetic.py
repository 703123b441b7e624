"""Synthetic jobs with Philly-like statistics, so what-if runs need no data files:
``synthetic:count=400&days=14&seed=1``.

- arrivals: a Poisson process whose rate follows the working week (three times busier on
  workdays 09:00-18:00 than at night, half as busy at weekends), spread over ``days``;
- run times: log-normal with the Philly trace's median (1,144 s) and a heavy tail
  (σ = 2.2, so a mean of about 3.6 h), from 1 minute to 14 days;
- GPU counts: 1 (93 %), 2, 4, 8 (about 2 % each) and 16 (0.5 %), Philly's shares.
The same options and seed always give the same jobs.
"""

from __future__ import annotations

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.sim.traces import TraceJobs

DEFAULTS = {"count": "300", "days": "7", "seed": "0", "median": "1144", "sigma": "2.2"}
#: The largest value of each option (all finite): ten years, a median run of a week.
LIMITS = {"count": 5e6, "days": 3650.0, "seed": 2.0**63, "median": 7 * 86400.0, "sigma": 10.0}
GPU_COUNTS = np.array([1, 2, 4, 8, 16])
GPU_SHARES = np.array([0.932, 0.022, 0.023, 0.018, 0.005])


def parse_options(text: str) -> dict[str, float]:
    from urllib.parse import parse_qsl

    _, _, query = text.partition(":")
    try:
        options = dict(parse_qsl(query, strict_parsing=bool(query)))
    except ValueError:
        raise SpecError(
            f"invalid synthetic jobs {text!r}: use synthetic:count=400&days=14"
        ) from None
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise SpecError(
            f"synthetic jobs: unknown option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(DEFAULTS)}"
        )
    values = {}
    for key, raw in {**DEFAULTS, **options}.items():
        try:
            values[key] = float(raw)
        except ValueError:
            raise SpecError(f"synthetic jobs: {key} must be a number, not {raw!r}") from None
        if not values[key] >= 0 or (key != "seed" and values[key] == 0):
            raise SpecError(f"synthetic jobs: {key} must be above zero, not {raw!r}")
        if not values[key] <= LIMITS[key]:
            raise SpecError(f"synthetic jobs: {key} is at most {LIMITS[key]:,g}, not {raw!r}")
    if values["count"] > 5_000_000:
        raise SpecError("synthetic jobs: count is at most 5,000,000")
    return values


def synthetic_jobs(text: str, start_s: float, seed: int = 0, max_gpus: int | None = None):
    opts = parse_options(text)
    rng = np.random.default_rng([int(opts["seed"]), seed])
    count, span = int(opts["count"]), opts["days"] * 86400
    # Arrival times by thinning: draw uniformly, keep with probability rate / max rate.
    times: list[np.ndarray] = []
    kept = 0
    while kept < count:
        t = start_s + rng.uniform(0, span, size=2 * count)
        keep = rng.uniform(0, 1, size=len(t)) < _rate(t)
        times.append(t[keep])
        kept += int(keep.sum())
    submit = np.sort(np.concatenate(times)[:count])
    run = np.exp(rng.normal(np.log(opts["median"]), opts["sigma"], count))
    run = np.clip(np.round(run), 60, 14 * 86400)
    gpus = rng.choice(GPU_COUNTS, size=count, p=GPU_SHARES / GPU_SHARES.sum())
    if max_gpus is not None:
        gpus = np.minimum(gpus, max_gpus)
    return TraceJobs.build(submit, run, gpus, source="synthetic")


def _rate(t: np.ndarray) -> np.ndarray:
    """Relative arrival rate (max 1) by hour and weekday, UTC."""
    hour = (t % 86400) / 3600
    weekday = ((t // 86400).astype(np.int64) + 3) % 7
    rate = np.where((hour >= 9) & (hour < 18), 1.0, 1 / 3)
    return np.where(weekday >= 5, rate / 2, rate)
