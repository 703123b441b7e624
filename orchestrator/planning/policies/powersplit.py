"""Split a site power limit across running jobs (PowerGrad's gradient idea).

Every job starts uncapped; while the jobs together draw more than the limit, the job
whose next step down in power cap costs the least progress per watt saved is capped one
step further. Progress is each job's share of its own full speed, so a small job is not
starved to feed a big one. Pure: a function of the jobs' models and the limit.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

STEP = 0.05


def split_power(jobs: Sequence[tuple[object, int]], limit_w: float) -> tuple[list[float], bool]:
    """Caps (fractions) for ``jobs`` (each: a JobModel and its GPU count) under
    ``limit_w``. Returns the caps and whether they fit (False: even every job at its
    lowest cap draws more)."""
    caps = [1.0] * len(jobs)
    draw = [model.power_w(n, 1.0) for model, n in jobs]
    total = sum(draw)
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        model, n = jobs[i]
        lowest = model.curve.min_fraction
        f = caps[i]
        if f <= lowest + 1e-9:
            return
        g = max(lowest, f - STEP)
        saved = draw[i] - model.power_w(n, g)
        lost = (model.throughput(n, f) - model.throughput(n, g)) / model.throughput(n, 1.0)
        heapq.heappush(heap, (lost / saved if saved > 0 else float("inf"), i))

    for i in range(len(jobs)):
        push(i)
    while total > limit_w + 1e-6 and heap:
        _, i = heapq.heappop(heap)
        model, n = jobs[i]
        f = max(model.curve.min_fraction, caps[i] - STEP)
        new = model.power_w(n, f)
        total -= draw[i] - new
        caps[i], draw[i] = f, new
        push(i)
    return caps, total <= limit_w + 1e-6
