"""Resizing running elastic jobs: the ``resize`` step of the one pass
(``orchestrator.planning.onepass``), for the live daemon and the simulator alike.

An elastic job accepts a GPU range (``--gpus 2-8``) and may be suspended (the ``signal``
contract: SIGTERM, it checkpoints and exits 0). While it runs, the pass may change its
width by checkpoint and relaunch at the new width, in three cases:

- **narrow start**: the due job at the head of the queue does not fit at its width, but
  fits now on fewer GPUs within its range; it starts narrower if it finishes sooner that
  way than by waiting for its width (counting, for one that may be suspended, a grow
  once the GPUs it waits for are free);
- **shrink**: the head of the queue does not fit at any width; running elastic jobs give
  up GPUs (down to their minimum) so that it starts now, when the wait it saves is longer
  than the time the shrunk jobs lose (their slower run and each one's restart);
- **grow**: no due job waits for GPUs and some are free beyond what the plans that stand
  hold while the job runs; a running elastic job grows into them when the time it saves
  exceeds its restart cost (``QueuedJob.checkpoint_s``).

Times are a job's remaining run time at its requested width (``Running.remaining_s``),
converted with its model's speed-up (``JobModel.speedup``; without one, 90 % efficiency
per doubling, the model's default). The decisions here are pure;
``orchestrator.planning.resizestep`` carries them out through the pass's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from orchestrator.planning.perfmodel import scaled_speedup
from orchestrator.planning.policies.base import Commitment, QueuedJob


class Running(Protocol):  # ``onepass.Running``: a running attempt
    key: Hashable
    job: QueuedJob
    remaining_s: float | None
    checkpointing: bool
    gpus: int
    end_s: float | None
    elastic: bool
    age_s: float


ROUNDS = 8  # narrow starts in one pass, at most (``resizestep``)
SETTLE_S = 2.0  # an attempt runs at least this long (and its restart cost) before a resize
Fits = Callable[[int, dict], bool]  # (GPUs for a waiting job, {key: new width}) -> fits?


@dataclass(frozen=True, slots=True)
class Resize:
    key: Hashable  # the running attempt (what holds its GPUs in the allocator)
    job_id: int
    from_gpus: int
    to_gpus: int
    gain_s: float  # run time (or, for a shrink, completion time) it saves, net of restarts


def speedup(job: QueuedJob, n: int) -> float:
    if job.model is not None and hasattr(job.model, "speedup"):
        return job.model.speedup(n)
    return scaled_speedup(n)


def width_rate(widest: int) -> Callable[[int], float]:
    """How fast a job runs on n GPUs as a share of its speed on ``widest`` (the model's
    default scaling): what an hour on n GPUs did of its work at its widest."""
    full = scaled_speedup(widest) if widest > 0 else 1.0
    return lambda n: scaled_speedup(n) / full if n > 0 else 1.0


def run_s(job: QueuedJob, remaining_s: float, n: int) -> float:
    """``remaining_s`` (at the job's requested width) on ``n`` GPUs."""
    return remaining_s * speedup(job, job.gpus) / speedup(job, n)


def bounds(job: QueuedJob) -> tuple[int, int]:
    return job.min_gpus or job.gpus, job.max_gpus or job.gpus


def settle_s(job: QueuedJob) -> float:
    """How long an attempt runs before it may be resized: its restart cost (what a
    resize throws away at once, and the time a job takes to start, load and be ready to
    checkpoint: SIGTERM before its handler is installed kills it), at least ``SETTLE_S``
    (a few of the daemon's passes: never in the pass that launched it)."""
    return max(job.checkpoint_s, SETTLE_S)


def resizable(run: Running) -> bool:
    """A running job the pass may resize: it may be suspended, accepts a range, has run
    long enough to checkpoint (``settle_s``), its run time left is known and its state
    lets it be resized (``elastic``: not while it runs a piece of a plan, nor at a width
    or power cap its plan chose)."""
    lo, hi = bounds(run.job)
    return (
        run.elastic
        and run.age_s >= settle_s(run.job)
        and run.job.interruptible
        and lo < hi
        and run.gpus > 0
        and not run.checkpointing
        and run.remaining_s is not None
    )


def wait_s(width: int, free: int, runs: Iterable[Running], now_s: float) -> float:
    """How long until ``width`` GPUs are free, from the running jobs' expected ends (a
    count, not per node); infinite when it hangs on a job whose end nobody knows."""
    if free >= width:
        return 0.0
    ends = sorted((r.end_s if r.end_s is not None else math.inf, r.gpus) for r in runs)
    for end, gpus in ends:
        free += gpus
        if free >= width:
            return max(0.0, end - now_s)
    return math.inf


def narrow_width(
    job: QueuedJob, width: int, wait: float, fits: Callable[[int], bool]
) -> int | None:
    """The widest width below ``width`` in the job's range that fits now and finishes
    sooner than waiting ``wait`` for ``width``; None: wait."""
    lo, _ = bounds(job)
    if job.duration_s is None and not math.isinf(wait):
        return None  # nobody knows what it would lose
    for n in range(width - 1, lo - 1, -1):
        if not fits(n):
            continue
        if job.duration_s is None:
            return n
        narrow = run_s(job, job.duration_s, n)
        full = run_s(job, job.duration_s, width)
        if job.interruptible and wait < narrow:  # then grows back once its GPUs are free
            narrow = min(narrow, wait + job.checkpoint_s + full * (1.0 - wait / narrow))
        return n if narrow < wait + full - 1e-6 else None
    return None


def plan_shrinks(
    width: int, wait: float, free: int, runs: list[Running], fits: Fits
) -> list[Resize]:
    """Running elastic jobs to shrink so that a job of ``width`` GPUs starts now instead
    of in ``wait`` seconds: the cheapest GPUs first (the least time lost per GPU given
    up); none unless the wait saved exceeds the time they lose together."""
    need = width - free
    if need <= 0 or wait <= 0:
        return []
    options = []
    for run in runs:
        if not resizable(run):
            continue
        lo, _ = bounds(run.job)
        for n in range(run.gpus - 1, lo - 1, -1):
            lost = _lost_s(run, n)
            options.append((lost / (run.gpus - n), run, n, lost))
    chosen: dict[Hashable, tuple[Running, int, float]] = {}
    got = 0
    for _, run, n, lost in sorted(options, key=lambda o: (o[0], str(o[1].key))):
        if got >= need:
            break
        have = chosen.get(run.key)
        gives = run.gpus - n
        if have is not None:
            if n >= have[1]:
                continue
            got -= run.gpus - have[1]
        chosen[run.key] = (run, n, lost)
        got += gives
    if got < need:
        return []
    cost = sum(lost for _, _, lost in chosen.values())
    if cost >= wait or not fits(width, {k: n for k, (_, n, _) in chosen.items()}):
        return []
    share = (wait - cost) / len(chosen)
    return [Resize(k, r.job.id, r.gpus, n, share) for k, (r, n, _) in chosen.items()]


def _lost_s(run: Running, n: int) -> float:
    """What shrinking ``run`` to ``n`` GPUs costs it: its slower run plus a restart."""
    return (
        run_s(run.job, run.remaining_s, n)
        - run_s(run.job, run.remaining_s, run.gpus)
        + run.job.checkpoint_s
    )


def plan_grows(
    runs: list[Running], spare: int, fits: Fits, held: Callable[[float], int] | None = None,
    now_s: float = 0.0,
) -> list[Resize]:  # fmt: skip
    """Running elastic jobs to grow into ``spare`` GPUs nobody due waits for, the
    longest first; each to the widest width whose saved time exceeds its restart cost
    and that the plans that stand (``held(until)``: the most GPUs they hold from now to
    then) leave free until it ends."""
    out: list[Resize] = []
    for run in sorted(runs, key=lambda r: -(r.remaining_s or 0.0)):
        if spare <= 0:
            break
        if not resizable(run):
            continue
        _, hi = bounds(run.job)
        now_run = run_s(run.job, run.remaining_s, run.gpus)
        for n in range(min(hi, run.gpus + spare), run.gpus, -1):
            new_run = run_s(run.job, run.remaining_s, n)
            gain = now_run - new_run - run.job.checkpoint_s
            if gain <= 0:
                break  # narrower gains even less
            planned = held(now_s + new_run + run.job.checkpoint_s) if held else 0
            if n - run.gpus > spare - planned:
                continue
            if fits(0, {run.key: n}):
                out.append(Resize(run.key, run.job.id, run.gpus, n, gain))
                spare -= n - run.gpus
                break
    return out


def peak_held(commitments: list[Commitment], now_s: float, until_s: float) -> int:
    """The most GPUs the commitments hold at once between now and ``until_s``."""
    edges = []
    for c in commitments:
        a, b = max(c.start_s, now_s), min(c.end_s, until_s)
        if b > a:
            edges += [(a, c.gpus), (b, -c.gpus)]
    peak = level = 0
    for _, d in sorted(edges, key=lambda e: (e[0], e[1])):
        level += d
        peak = max(peak, level)
    return peak
