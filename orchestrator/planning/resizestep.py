"""The ``resize`` step of the one pass (``orchestrator.planning.onepass``): carries out the
decisions of ``orchestrator.planning.resize`` through the pass's state, on its allocator
(``placement.cluster.ClusterAllocator``): a blocked job's wait and the jobs that may shrink
for it per node, what fits once jobs are resized, and the checkpoints
(``state.resize(run, width, now_s)``: the job leaves and starts again at once on ``width``
GPUs; the simulator at once, the daemon once its process has checkpointed and exited).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.planning.pieces import width_of
from orchestrator.planning.policies.base import Commitment, Decision, QueuedJob
from orchestrator.planning.resize import (
    ROUNDS,
    Resize,
    Running,
    bounds,
    narrow_width,
    peak_held,
    plan_grows,
    plan_shrinks,
    resizable,
    wait_s,
)
from placement.errors import PlacementError

Pass = Any  # ``onepass.Pass`` (which imports this module): its state, scheduler and steps


def pin_resized(scheduler, resize_to: dict[int, int], now_s: float) -> None:
    """Resized jobs waiting to start again start now on their new width, whatever the
    plan just made says (a joint replan plans every queued job again). The daemon and the
    simulator call it after every plan, until the job starts."""
    if not resize_to:
        return
    for view, _ in scheduler.planned():
        width = resize_to.get(view.id)
        if width is not None:
            scheduler.add_planned(view, Decision(now_s, gpus=width))


def reserve_resized(alloc, pending: dict[int, tuple[Hashable, int]]) -> None:
    """Hold, for each job a grow is checkpointing (job id -> its attempt's allocation
    key, the width it starts again on), the GPUs it grows into on its node, under
    ``("resize", job id)``: a launch in the meantime does not take them. A job that has
    left its GPUs (or spans nodes) holds nothing."""
    for job_id, (key, width) in pending.items():
        node, got = alloc.node_of(key), alloc.allocation(key)
        if node is None or got is None or alloc.allocation(("resize", job_id)) is not None:
            continue
        extra = width - sum(len(gpus) for _, gpus in got.parts)
        free = alloc.free_on(node)[: max(0, extra)]
        if free:
            alloc.hold(("resize", job_id), node, free)


def plans_held(planned: list[tuple[QueuedJob, Decision]]) -> list[Commitment]:
    """The GPUs the plans of queued jobs hold, each piece to its planned end; a plan
    without one (``fifo``, ``lowest-window``: no end estimated) to its start plus the
    job's run time, and without that to no end (``Scheduler.standing`` skips them)."""
    out = []
    for job, d in planned:
        end_s = d.end_s
        if end_s is None:
            end_s = d.start_s + job.duration_s if job.duration_s is not None else math.inf
        for i, (a, b) in enumerate(d.intervals or ((d.start_s, end_s),)):
            gpus, _, watts = d.piece_config(i)
            out.append(Commitment(job.id, gpus or job.gpus, watts or 0.0, a, b))
    return out


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


def fits_after(alloc, width: int, moves: dict, gpu_type: str | None = None) -> bool:
    """Whether, with each of ``moves`` (allocation key -> new width) released, a request
    of ``width`` GPUs (0: none; of ``gpu_type``, when given) and then each move at its new
    width (on the type it runs on) are placed. The
    allocator (``placement.cluster.ClusterAllocator``) is left as it was."""
    saved = {key: got for key in moves if (got := alloc.allocation(key)) is not None}
    for key in saved:
        alloc.free(key)
    taken, ok = [], True
    try:
        asks = [(("resize-probe", None), width, gpu_type)]
        for key, n in moves.items():  # each on the type it runs on (one type: it stays)
            types = {alloc.type_of(node) for node, _ in saved[key].parts} if key in saved else ()
            asks.append((("resize-probe", key), n, next(iter(types)) if len(types) == 1 else None))
        for key, n, typed in asks:
            if n <= 0:
                continue
            try:
                got = n <= alloc.total_gpus and alloc.allocate(key, n, gpu_type=typed)
            except PlacementError:  # more than that type's GPUs
                got = None
            if not got:
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
        if decision.cap < 1.0:
            return False  # its plan chose its width and power cap: not ours to change
        width = width_of(head, decision, now_s)
        running = state.running(now_s)
        if any(r.checkpointing for r in running):
            return False  # a resize (or the guard) is under way: its GPUs are not free yet
        if bounds(head)[0] >= width and not any(resizable(r) for r in running):
            return False  # it cannot start narrower, and nobody can shrink for it
        alloc = state.alloc
        nodes = by_node(alloc, running)
        wait = node_wait_s(width, alloc, nodes, now_s)
        n = narrow_width(head, width, wait, lambda k: fits_after(alloc, k, {}, head.gpu_type))
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
            got = plan_shrinks(
                width, wait, free, group, lambda k, m, t=head.gpu_type: fits_after(alloc, k, m, t)
            )
            if got and sum(r.gain_s for r in got) > sum(r.gain_s for r in plan):
                plan = got
        if not plan:
            return
        runs = {r.key: r for r in running}
        done = [r for r in plan if state.resize(runs[r.key], r.to_gpus, now_s)]
        if not done:
            return
        self.shrinks += len(done)
        p.start_ahead(head.id, now_s)

    def _grow(self, p: Pass, now_s: float) -> None:
        state = p.state
        alloc = state.alloc
        if alloc is None or alloc.free_gpus <= 0:
            return
        everyone = state.running(now_s)
        # a node where a job checkpoints (a resize, the guard): what is free there may be
        # promised; the others' jobs may grow (the GPUs a grow waits for are held)
        busy = {alloc.node_of(r.key) for r in everyone if r.checkpointing}
        if None in busy:
            return  # one that spans nodes (or is not placed): anywhere
        running = [r for r in everyone if resizable(r) and alloc.node_of(r.key) not in busy]
        if not running:
            return
        standing = None

        def held(until_s: float) -> int:
            nonlocal standing
            if standing is None:
                standing = plans_held(p.scheduler.planned())
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
