"""Split a site power limit across running jobs (PowerGrad's gradient idea).

Every job starts at its highest cap (its plan's); while the jobs together count more than
the limit, a step of 5 % of the GPU's maximum limit is taken from the job whose next step
down costs the least progress per watt saved: within each node, the node's cheapest step;
across nodes, the node whose cheapest step is cheapest (PowerGrad's two levels: node,
then cluster). Progress is each job's share of its own full speed, so a small job is not
starved to feed a big one. The gradient is measured where the job has run at two caps or
more (``measured_progress``: its progress reports at each cap), else the static model's.

What a job counts against the limit is the caller's (``PowerJob.watts``): the simulator
counts the model's draw, the daemon the GPU power limits it sets. Pure: no clock, no I/O.

Measured gradients come from what jobs write (untrusted): ``split_fair`` first splits by
the static model alone, then lets the measured gradients move each job at most ``SURPLUS``
(10 % of its GPUs' maximum limit) below its cap in that split, and ``measured_progress``
keeps a measured shape monotone and within ``MEASURED_BAND`` (±15 %) of the model's curve.
A job that lies in its reports can so take from each other job at most 10 % of that job's
GPUs' maximum limits, and no job goes below its model share minus that.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

STEP = 0.05
EPS_W = 1e-6
SURPLUS = 0.10  # how far (cap fraction) a measured gradient may move a job below its model share
MEASURED_BAND = 0.15  # a measured share stays within ±15 % of the model's at that cap


@dataclass(frozen=True, slots=True)
class PowerJob:
    """One running (or starting) job as the split sees it."""

    key: Hashable
    node: str
    watts: Callable[[float], float]  # what it counts against the limit at cap fraction f
    progress: Callable[[float], float]  # its speed at cap f, a share of its full speed
    lowest: float  # its lowest cap fraction (the board's minimum limit)
    highest: float = 1.0  # its highest (its plan's cap)
    model: Callable[[float], float] | None = None  # its static model's speed (progress's
    # when None): ``split_fair``'s floor


def split_site(jobs: Sequence[PowerJob], limit_w: float,
               fixed_w: float = 0.0) -> tuple[dict[Hashable, float], bool]:  # fmt: skip
    """Caps (fractions) per job key so that ``fixed_w`` (what counts and cannot be
    moved: idle GPUs at their lowest limit) plus the jobs' watts stay within ``limit_w``.
    Returns the caps and whether they fit (False: even every job at its lowest cap counts
    more; the caps are then every job's lowest)."""
    caps = {j.key: max(j.lowest, min(1.0, j.highest)) for j in jobs}
    draw = {j.key: j.watts(caps[j.key]) for j in jobs}
    total = fixed_w + sum(draw.values())
    by_node: dict[str, list[PowerJob]] = {}
    for j in jobs:
        by_node.setdefault(j.node, []).append(j)
    # within each node: its jobs' next steps, cheapest first
    inner: dict[str, list[tuple[float, int, PowerJob]]] = {n: [] for n in by_node}
    order = {j.key: k for k, j in enumerate(jobs)}

    def push(j: PowerJob) -> None:
        f = caps[j.key]
        if f <= j.lowest + 1e-9:
            return
        g = max(j.lowest, f - STEP)
        saved = draw[j.key] - j.watts(g)
        lost = j.progress(f) - j.progress(g)
        cost = max(0.0, lost) / saved if saved > EPS_W else float("inf")
        heapq.heappush(inner[j.node], (cost, order[j.key], j))

    for j in jobs:
        push(j)
    # across nodes: each node's cheapest step
    outer = [(h[0][0], node) for node, h in inner.items() if h]
    heapq.heapify(outer)
    while total > limit_w + EPS_W and outer:
        _, node = heapq.heappop(outer)
        _, _, j = heapq.heappop(inner[node])
        g = max(j.lowest, caps[j.key] - STEP)
        new = j.watts(g)
        total -= draw[j.key] - new
        caps[j.key], draw[j.key] = g, new
        push(j)
        if inner[node]:
            heapq.heappush(outer, (inner[node][0][0], node))
    return caps, total <= limit_w + EPS_W


def split_fair(jobs: Sequence[PowerJob], limit_w: float,
               fixed_w: float = 0.0) -> tuple[dict[Hashable, float], bool]:  # fmt: skip
    """``split_site`` where measured gradients (untrusted) move only a bounded surplus:
    each job keeps at least its cap in the static model's split less ``SURPLUS``."""
    if all(j.model is None for j in jobs):
        return split_site(jobs, limit_w, fixed_w)
    static = [replace(j, progress=j.model or j.progress) for j in jobs]
    base, fits = split_site(static, limit_w, fixed_w)
    floored = [replace(j, lowest=max(j.lowest, base[j.key] - SURPLUS)) for j in jobs]
    caps, fair = split_site(floored, limit_w, fixed_w)
    return (caps, True) if fair else (base, fits)


def lowest_w(jobs: Sequence[PowerJob]) -> float:
    """What ``jobs`` count at their lowest caps: a job starts only if this, with the
    running ones and the fixed part, fits the limit (else it waits)."""
    return sum(j.watts(j.lowest) for j in jobs)


def measured_progress(
    model: Callable[[float], float], samples: Sequence[tuple[float, float]]
) -> Callable[[float], float]:
    """A job's speed at cap f (a share of its full speed) from what it measured: its
    progress rate (work per second, any unit) at each cap it ran under (``samples``: (cap
    fraction, rate)). With rates at two caps or more, the measured rates, linear between
    them and scaled to the model's at the highest cap measured (full speed is not
    measured under a cap); outside the measured range, and with fewer, the model's."""
    rates: dict[float, list[float]] = {}
    for cap, rate in samples:
        if 0 < cap <= 1.0 and rate > 0:
            rates.setdefault(round(cap, 3), []).append(rate)
    if len(rates) < 2:
        return model
    caps = sorted(rates)
    mean = [sum(rates[c]) / len(rates[c]) for c in caps]
    top = caps[-1]
    full = mean[-1] / max(model(top), 1e-9)  # the rate at full speed, by the model's shape
    shares, floor = [], 0.0  # untrusted: monotone, and within the band about the model's
    for c, r in zip(caps, mean, strict=True):
        lo, hi = model(c) * (1 - MEASURED_BAND), model(c) * (1 + MEASURED_BAND)
        floor = max(floor, min(hi, max(lo, r / full)))
        shares.append(floor)

    def progress(f: float) -> float:
        if f <= caps[0] or f >= top:
            edge, share = (caps[0], shares[0]) if f <= caps[0] else (top, shares[-1])
            return share + model(f) - model(edge)  # the model's slope past the edges
        k = next(i for i in range(1, len(caps)) if f <= caps[i])
        a, b = caps[k - 1], caps[k]
        return shares[k - 1] + (shares[k] - shares[k - 1]) * (f - a) / (b - a)

    return progress


def model_job(key: Hashable, node: str, model: object, gpus: int,
              highest: float = 1.0) -> PowerJob:  # fmt: skip
    """A job by its ``JobModel``: it counts the model's draw on ``gpus`` GPUs (the
    simulator's)."""
    full = model.throughput(gpus, 1.0)
    return PowerJob(
        key=key,
        node=node,
        watts=_memo(lambda f: model.power_w(gpus, f)),
        progress=_memo(lambda f: model.throughput(gpus, f) / full),
        lowest=model.curve.min_fraction,
        highest=highest,
    )


def _memo(fn: Callable[[float], float]) -> Callable[[float], float]:
    """``fn`` remembered per cap (the split asks for the same few steps again and again)."""
    seen: dict[float, float] = {}

    def at(f: float) -> float:
        value = seen.get(f)
        if value is None:
            value = seen[f] = fn(f)
        return value

    return at


def split_power(jobs: Sequence[tuple[object, int]], limit_w: float) -> tuple[list[float], bool]:
    """Caps (fractions) for ``jobs`` (each: a JobModel and its GPU count, all on one
    node) under ``limit_w``. Returns the caps and whether they fit (False: even every job
    at its lowest cap draws more)."""
    items = [model_job(k, "", model, n) for k, (model, n) in enumerate(jobs)]
    caps, fits = split_site(items, limit_w)
    return [caps[k] for k in range(len(items))], fits
