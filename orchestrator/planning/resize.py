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
per doubling, the model's default). The decisions below are pure; ``Resizer.step`` carries
them out through the pass's state: ``state.resize(run, width, now_s)`` checkpoints the
job and requeues it to start again at once on ``width`` GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator.planning.pieces import width_of
from orchestrator.planning.policies.base import Commitment, QueuedJob


class Running(Protocol):  # ``onepass.Running``: a running attempt
    key: Hashable
    job: QueuedJob
    remaining_s: float | None
    checkpointing: bool
    gpus: int
    end_s: float | None
    elastic: bool


Pass = Any  # ``onepass.Pass`` (which imports this module): its state, scheduler and steps
EFFICIENCY = 0.9  # speed-up per doubling of a job without a model (JobModel's default)
ROUNDS = 8  # narrow starts in one pass, at most
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
    return n * EFFICIENCY ** math.log2(n)


def run_s(job: QueuedJob, remaining_s: float, n: int) -> float:
    """``remaining_s`` (at the job's requested width) on ``n`` GPUs."""
    return remaining_s * speedup(job, job.gpus) / speedup(job, n)


def bounds(job: QueuedJob) -> tuple[int, int]:
    return job.min_gpus or job.gpus, job.max_gpus or job.gpus


def resizable(run: Running) -> bool:
    """A running job the pass may resize: it may be suspended, accepts a range, its run
    time left is known and its state lets it be resized (``elastic``: not while it runs
    a piece of a plan)."""
    lo, hi = bounds(run.job)
    return (
        run.elastic
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


def by_node(alloc, runs: list[Running]) -> dict[str | None, list[Running]]:
    """The running jobs by the node they run on (None: several nodes, or not placed)."""
    out: dict[str | None, list[Running]] = {}
    for run in runs:
        out.setdefault(alloc.node_of(run.key), []).append(run)
    return out


def node_wait_s(width: int, alloc, nodes: dict, now_s: float) -> float:
    """How long until one node has ``width`` GPUs free (wider than a node: a count over
    the cluster), from the running jobs' expected ends."""
    if width > alloc.max_node_gpus:
        runs = [r for group in nodes.values() for r in group]
        return wait_s(width, alloc.free_gpus, runs, now_s)
    best = math.inf
    for node in alloc.node_names:
        if len(alloc.gpus_of(node)) >= width:
            free = len(alloc.free_on(node))
            best = min(best, wait_s(width, free, nodes.get(node, ()), now_s))
    return best


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
    # give back what more than ``need`` took, from the last chosen
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


def fits_after(alloc, width: int, moves: dict) -> bool:
    """Whether, with each of ``moves`` (allocation key -> new width) released, a request
    of ``width`` GPUs (0: none) and then each move at its new width are placed. The
    allocator (``placement.cluster.ClusterAllocator``) is left as it was."""
    saved = {key: got for key in moves if (got := alloc.allocation(key)) is not None}
    for key in saved:
        alloc.free(key)
    taken, ok = [], True
    try:
        asks = [(("resize-probe", None), width)]
        asks += [(("resize-probe", key), n) for key, n in moves.items()]
        for key, n in asks:
            if n <= 0:
                continue
            if n > alloc.total_gpus or alloc.allocate(key, n) is None:
                ok = False
                break
            taken.append(key)
    finally:
        for key in taken:
            alloc.free(key)
        for key, allocation in saved.items():
            for node, gpus in allocation.parts:
                alloc.hold(key, node, gpus)
    return ok


@dataclass
class Resizer:
    """The pass's ``resize`` step: counts what it did."""

    narrow: int = 0
    shrinks: int = 0
    grows: int = 0

    def step(self, p: Pass, now_s: float) -> None:
        for _ in range(ROUNDS):
            head = p.scheduler.blocked()
            if head is None:
                self._grow(p, now_s)
                return
            if not self._start_narrower(p, head, now_s):
                return
            p.launch(now_s)  # the jobs behind it, up to the next that does not fit

    def _start_narrower(self, p: Pass, head: QueuedJob, now_s: float) -> bool:
        """Start the blocked head narrower; else shrink running jobs for it. Returns
        whether it started narrower."""
        scheduler, state = p.scheduler, p.state
        decision = scheduler.decision_of(head.id)
        width = width_of(head, decision, now_s)
        running = state.running(now_s)
        if any(r.checkpointing for r in running):
            return False  # a resize (or the guard) is under way: its GPUs are not free yet
        if bounds(head)[0] >= width and not any(resizable(r) for r in running):
            return False  # it cannot start narrower, and nobody can shrink for it
        alloc = state.alloc
        nodes = by_node(alloc, running)
        wait = node_wait_s(width, alloc, nodes, now_s)
        n = narrow_width(head, width, wait, lambda k: fits_after(alloc, k, {}))
        if n is None:
            self._shrink(p, width, wait, running, nodes, now_s)
            return False
        narrower = replace(decision, gpus=n)
        started = scheduler.launch_out_of_order(
            head.id, lambda job, _d: state.allocate(job, narrower, now_s)
        )
        if started is None:
            return False
        state.launch(started[0], narrower, started[2], now_s)
        self.narrow += 1
        return True

    def _shrink(
        self, p: Pass, width: int, wait: float, running: list, nodes: dict, now_s: float
    ) -> None:
        state, head = p.state, p.scheduler.blocked()
        alloc = state.alloc
        if width > alloc.max_node_gpus:  # whole nodes: any running job may give GPUs
            groups = [(alloc.free_gpus, running)]
        else:  # one node: its own jobs give them
            groups = [(len(alloc.free_on(n)), nodes[n]) for n in alloc.node_names if n in nodes]
        plan: list[Resize] = []
        for free, group in groups:
            if not any(resizable(r) for r in group):
                continue
            got = plan_shrinks(width, wait, free, group, lambda k, m: fits_after(alloc, k, m))
            if got and sum(r.gain_s for r in got) > sum(r.gain_s for r in plan):
                plan = got
        if not plan:
            return
        runs = {r.key: r for r in running}
        done = [r for r in plan if state.resize(runs[r.key], r.to_gpus, now_s)]
        if not done:
            return
        self.shrinks += len(done)
        state.reap(now_s)  # those that left go back to the queue, behind the head
        scheduler = p.scheduler
        started = scheduler.launch_out_of_order(head.id, p._allocate(now_s))
        if started is not None:
            state.launch(*started, now_s)
        p.plan(now_s)
        p.launch(now_s)

    def _grow(self, p: Pass, now_s: float) -> None:
        state = p.state
        alloc = state.alloc
        if alloc is None or alloc.free_gpus <= 0:
            return
        running = [r for r in state.running(now_s) if resizable(r)]
        if not running:
            return
        standing = None

        def held(until_s: float) -> int:
            nonlocal standing
            if standing is None:
                standing = p.scheduler.standing()
            return peak_held(standing, now_s, until_s)

        plan = plan_grows(
            running, alloc.free_gpus, lambda k, m: fits_after(alloc, k, m), held, now_s
        )
        runs = {r.key: r for r in running}
        done = [r for r in plan if state.resize(runs[r.key], r.to_gpus, now_s)]
        if done:
            self.grows += len(done)
            state.reap(now_s)
            p.plan(now_s)
            p.launch(now_s)
