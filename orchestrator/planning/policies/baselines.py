"""The baseline policies.

- ``fifo``: carbon-agnostic; every job is due at once (it starts as soon as GPUs free up,
  in queue order) at full power.
- ``lowest-window``: each job, on its own, starts at the beginning of the window of its
  run time with the lowest mean forecast intensity that still ends by its deadline (the
  Let's Wait Awhile / CATS strategy). Candidate starts: now and every slot boundary up to
  the latest start; ties go to the earliest.
- ``lowest-slots``: its interruptible twin: a job that may be suspended runs in the
  lowest-intensity slots before its deadline (earliest first on ties); other jobs are
  planned as by ``lowest-window``.
A job whose run time is unknown starts at once; one that cannot meet its deadline any
more starts at once too (the deadline guard).
"""

from __future__ import annotations

import numpy as np

from orchestrator.planning.policies.base import (
    Decision,
    Plan,
    Policy,
    QueuedJob,
    Snapshot,
)
from orchestrator.planning.policies.pieces import run_needed_s


class Fifo(Policy):
    name = "fifo"
    reads_cluster = False

    def plan(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now_s
        return {job.id: Decision(job.release_s(now)) for job in snapshot.jobs}


class LowestWindow(Policy):
    name = "lowest-window"
    needs_forecast = True
    reads_cluster = False

    def plan(self, snapshot: Snapshot) -> Plan:
        return {job.id: self.plan_job(job, snapshot) for job in snapshot.jobs}

    def plan_job(self, job: QueuedJob, snapshot: Snapshot) -> Decision:
        now, run = job.release_s(snapshot.now_s), job.duration_s
        if not run or snapshot.forecast is None:
            return Decision(now)
        latest = job.latest_finish_s(snapshot.max_defer_s) - run
        if latest <= now:
            return Decision(now)
        start = lowest_window_start(snapshot.forecast, now, latest, run, snapshot.now_s)
        return Decision(start)


class LowestSlots(LowestWindow):
    name = "lowest-slots"

    def plan_job(self, job: QueuedJob, snapshot: Snapshot) -> Decision:
        if not job.interruptible:
            return super().plan_job(job, snapshot)
        now, run = job.release_s(snapshot.now_s), job.duration_s
        if not run or snapshot.forecast is None:
            return Decision(now)
        finish = job.latest_finish_s(snapshot.max_defer_s)
        if finish - now <= run:
            return Decision(now)
        # the pieces hold the job's run and each restart's (``pieces.run_needed_s``)
        need = run
        while True:
            intervals = lowest_slots(snapshot.forecast, now, finish, need, snapshot.now_s)
            more = run_needed_s(run, job.checkpoint_s, len(intervals))
            if more <= need + 1e-6:
                return Decision(intervals[0][0], intervals)
            if finish - now <= more:
                return Decision(now)
            need = more


def lowest_window_start(
    forecast, now_s: float, latest_s: float, run_s: float, issued_s: float | None = None
) -> float:
    """Start in ``[now_s, latest_s]`` of the lowest-mean window of ``run_s`` (earliest on
    ties), candidates being now and the slot boundaries after it. ``issued_s``: when the
    forecast is read (default ``now_s``; earlier for a job that may start only later)."""
    issued = now_s if issued_s is None else issued_s
    series = forecast.window(issued, now_s, latest_s + run_s)
    step, origin = series.step_s, series.start_s
    first = np.floor((now_s - origin) / step) + 1
    last = np.floor((latest_s - origin) / step)
    bounds = origin + np.arange(first, last + 1) * step
    starts = np.concatenate(([now_s], bounds))
    totals = series.integral(starts, starts + run_s)
    lowest = totals.min()
    best = int(np.flatnonzero(totals <= lowest + 1e-9 * max(1.0, abs(lowest)))[0])
    return float(starts[best])


def lowest_slots(
    forecast, now_s: float, finish_s: float, run_s: float, issued_s: float | None = None
) -> tuple[tuple[float, float], ...]:
    """The lowest-intensity pieces of ``[now_s, finish_s)`` adding up to ``run_s``, as
    merged intervals in time order. Needs ``finish_s - now_s > run_s``. ``issued_s``: when
    the forecast is read (default ``now_s``)."""
    issued = now_s if issued_s is None else issued_s
    series = forecast.window(issued, now_s, finish_s)
    starts, ends, values = series.slots(now_s, finish_s)
    real = ends - starts > 1e-6  # not a sliver of a slot left by rounding (now a hair
    starts, ends, values = starts[real], ends[real], values[real]  # before a boundary)
    order = np.argsort(values, kind="stable")
    lengths = (ends - starts)[order]
    taken = np.cumsum(lengths)
    count = int(np.searchsorted(taken, run_s - 1e-6)) + 1
    chosen = np.sort(order[:count])
    pieces = [[float(starts[i]), float(ends[i])] for i in chosen]
    surplus = float(taken[count - 1]) - run_s
    if surplus > 1e-6:  # the last chosen slot is only partly needed: use its beginning
        last = int(order[count - 1])
        piece = next(p for p in pieces if p[0] == float(starts[last]))
        piece[1] -= surplus
    merged: list[list[float]] = []
    for a, b in pieces:
        if merged and abs(merged[-1][1] - a) < 1e-6:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)
