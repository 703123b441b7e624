"""Backfill behind a blocked head of the queue, with reservations.

When the first due job in queue order does not fit, later due jobs that fit now may start
ahead of it, as long as that cannot delay it:

- ``conservative`` (the default; what Slurm's backfill scheduler does): every due job it
  looks at, in queue order (up to ``MAX_RESERVATIONS`` of them), gets a reservation (GPUs
  over a time span, on a profile of what is held when: ``planning.profile``), as Slurm's
  backfill plans the pending jobs it looks at (``bf_max_job_test``); a later job may
  start now only if it cannot delay any of them: it holds none of their GPUs before they
  give them back. Jobs past the first ``MAX_RESERVATIONS`` get none.
- ``easy`` (EASY backfilling): only the blocked head gets a *reservation*: the
  earliest time it fits, from the running jobs' expected ends, released in order on a copy
  of the cluster's allocator (so per node and per buddy block, not in plain GPU counts: a
  job that must fit one node waits for one node to have room). A later job may start now
  if it gives its GPUs back by then, or if the head still fits at its reservation with the
  job's GPUs (and those of the jobs backfilled before it) still held. Cheaper, but a
  backfilled job may delay every job behind the head.
- ``strict``: no backfill; the first job that does not fit blocks every job behind it.

Run times come from the plans (a job's planned piece or expected end) and from what the
state knows of running jobs' ends (``Cluster.ends``, the pass's ``Running.remaining_s``).
A job whose run time nobody knows holds its GPUs forever as far as backfill is concerned:
it backfills only where holding them forever delays nobody, and a reservation that waits
for such a job's end cannot be made, so nothing backfills behind a job that needs one.
Only a promise counts as known (``--duration``, history: ``running_end_s``,
``QueuedJob.run_known``); a job backfilled on one is held to it (``promise_s``: the
daemon stops it past that while a job it passed waits). A job not due yet (planned for
later) that is ahead in queue order is not delayed either (``Backfill.planned``).
Pure and in memory: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import accumulate

from orchestrator.errors import SpecError
from orchestrator.planning.pieces import piece_index, width_of
from orchestrator.planning.policies.base import Decision, QueuedJob
from orchestrator.planning.profile import Profile, Reservation
from placement.cluster import ClusterAllocator
from placement.errors import PlacementError

EASY, CONSERVATIVE, STRICT = "easy", "conservative", "strict"
MODES = (EASY, CONSERVATIVE, STRICT)
DEFAULT_BACKFILL = CONSERVATIVE
# jobs behind the head that get a reservation of their own in one pass (``conservative``),
# as Slurm's bf_max_job_test bounds its backfill: each is a walk over the profile
MAX_RESERVATIONS = 50

Allocate = Callable[[QueuedJob, Decision], object | None]


def check_backfill(text: str) -> str:
    """``easy``, ``conservative`` or ``strict``; one clear SpecError otherwise."""
    mode = str(text).strip().lower()
    if mode not in MODES:
        raise SpecError(f"unknown backfill {text!r}; use easy, conservative or strict")
    return mode


def job_key(job_id: int) -> tuple:
    """The key under which ``allocate`` holds a started job's new GPUs in the allocator."""
    return ("job", job_id)


@dataclass(slots=True)
class Cluster:
    """What holds GPUs now: the live allocator (the one ``allocate`` takes from), and when
    each of its holders is expected to give its GPUs back (missing or None: unknown)."""

    alloc: ClusterAllocator
    ends: dict[Hashable, float | None] = field(default_factory=dict)


def hold_until_s(
    job: QueuedJob, decision: Decision, now_s: float, pieces_release: bool = True
) -> float | None:
    """When a job started now gives its GPUs back, by its plan: the end of the piece it
    starts in when more follow (``pieces_release``: suspended by SIGTERM; suspended by
    SIGSTOP it keeps them to its last piece's end), else its expected end; None: nobody
    knows."""
    pieces = decision.intervals
    if pieces:
        k = piece_index(decision, now_s)
        if k < len(pieces) - 1:
            return pieces[k][1] if pieces_release else pieces[-1][1]
    if not job.run_known:
        return None  # a guess (the lab's default run time) is nobody's promise
    if decision.end_s is not None and decision.end_s > decision.start_s:
        return now_s + (decision.end_s - decision.start_s)
    if job.duration_s is None:
        return None
    cap = decision.piece_config(piece_index(decision, now_s))[1]
    width, model = width_of(job, decision, now_s), job.model
    if model is None or (width == job.gpus and cap >= 1.0 - 1e-9) or not width:
        return now_s + job.duration_s
    return now_s + job.duration_s * model.throughput(job.gpus, 1.0) / model.throughput(width, cap)


# the lab's own default run time is nobody's promise: a job with no --duration nor history
# runs for a time nobody knows (``accounting.estimates`` sources)
PROMISED_SOURCES = ("duration", "history")


def running_end_s(
    now_s: float,
    run_s: float | None,
    source: str | None,
    ran_s: float,
    reported_left_s: float | None = None,
    leaves_at_s: float | None = None,
) -> float | None:
    """When a running job gives its GPUs back, as far as reservations may trust it: by
    ``leaves_at_s`` when it is told to leave (checkpointing: SIGTERM sent, plus its
    grace); else by its run time ``run_s`` (trusted only from ``--duration`` or its
    history, not the lab's default nor its own progress reports) less the ``ran_s`` it
    ran; its own report of what is left (``reported_left_s``) may bring that end closer,
    never push it later. None: unknown, also once it ran past its estimate."""
    if leaves_at_s is not None:
        return max(now_s, leaves_at_s)
    if run_s is None or source not in PROMISED_SOURCES or ran_s >= run_s:
        return None
    left_s = run_s - ran_s
    if reported_left_s is not None:
        left_s = min(left_s, max(0.0, reported_left_s))
    return now_s + left_s


# a job backfilled on its run time keeps its GPUs this much longer before it breaks its
# promise (Slurm's OverTimeLimit): at least PROMISE_GRACE_S, or this share of its run time
PROMISE_GRACE_S, PROMISE_GRACE_SHARE = 300.0, 0.1


def promise_s(now_s: float, until_s: float) -> float:
    """By when a job backfilled now to give its GPUs back by ``until_s`` must have given
    them back: its run time and a grace."""
    return until_s + max(PROMISE_GRACE_S, PROMISE_GRACE_SHARE * max(0.0, until_s - now_s))


class Backfill:
    """One pass's backfill behind a blocked head. ``fill(queue)`` takes the due jobs in
    queue order, the first of them blocked (it did not fit), and starts those it may
    through ``allocate``; it returns their indices in ``queue`` with what ``allocate``
    gave each."""

    def __init__(
        self, mode: str, now_s: float, cluster: Cluster, allocate: Allocate,
        pieces_release: bool = True,
    ) -> None:  # fmt: skip
        self.mode, self.now_s, self.cluster, self.allocate = mode, now_s, cluster, allocate
        self.pieces_release = pieces_release  # False: suspended jobs keep their GPUs
        # jobs not due yet with their planned starts, earliest first (``fill``'s caller)
        self.planned: list[tuple[QueuedJob, Decision]] = []
        self.alloc = cluster.alloc
        # holders of GPUs and when each gives them back: running jobs, then those started
        self.held = self.alloc.held_masks()
        self.ends: dict[Hashable, float | None] = {key: cluster.ends.get(key) for key in self.held}

    def fill(self, queue: list[tuple[QueuedJob, Decision]]) -> list[tuple[int, object]]:
        if self.mode == STRICT or len(queue) < 2:
            return []
        # the least width from each place in the queue on: once it exceeds the free GPUs,
        # no job from there starts now, and reservations protect only jobs that start now
        self.least = list(accumulate(
            (width_of(job, d, self.now_s) for job, d in reversed(queue)), min
        ))[::-1]  # fmt: skip
        if self.least[1] > self.alloc.free_gpus:
            return []
        if self.mode == CONSERVATIVE:
            return self._conservative(queue)
        return self._easy(queue)

    # -- EASY ---------------------------------------------------------------------------
    def _easy(self, queue: list[tuple[QueuedJob, Decision]]) -> list[tuple[int, object]]:
        now, alloc = self.now_s, self.alloc
        head, head_decision = queue[0]
        width, head_type = width_of(head, head_decision, now), head.gpu_type
        shadow, at = self._shadow_for(width, head_type)
        if shadow is None:
            return []  # its reservation waits for a run time nobody knows
        started: list[tuple[int, object]] = []
        no_fit: set[int] = set()  # widths that did not fit now (nor will, as GPUs go)
        for index in range(1, len(queue)):
            if alloc.free_gpus == 0:
                break
            job, decision = queue[index]
            k = width_of(job, decision, now)
            if k in no_fit or k > alloc.free_gpus:
                continue
            until = hold_until_s(job, decision, now, self.pieces_release)
            late = until is None or until > at

            asked: list[bool] = []

            def may(key: Hashable, held, job=job, until=until, late=late, asked=asked) -> bool:
                asked.append(True)  # it fitted somewhere
                # held None: it took no new GPUs (resumed, CPU only)
                if (
                    held is not None
                    and late
                    and not _still_fits(shadow, key, held.parts, width, head_type)
                ):
                    return False  # it would delay the head: not now
                if held is not None and self._delays_planned(job, until):
                    if shadow.allocation(key) is not None:  # it would delay a job ahead
                        shadow.free(key)  # of it planned to start soon
                    return False
                return True

            allocation = self._allocate_where(job, decision, may)
            if allocation is None:
                if not asked:
                    no_fit.add(k)
                continue
            started.append((index, allocation))
        return started

    def _allocate_where(
        self, job: QueuedJob, decision: Decision, may: Callable[[Hashable, object], bool]
    ) -> object | None:
        """``allocate``, kept only if ``may(key, what it holds)``; a job that asked for no
        GPU type is tried again off the types it was refused on (the GPUs a typed job ahead
        waits for are of its type only: the others may serve it now)."""
        alloc, key, block = self.alloc, job_key(job.id), ("backfill", "other types")
        refused: set = set()
        try:
            while True:
                allocation = self.allocate(job, decision)
                if allocation is None:
                    return None
                held = alloc.allocation(key)
                if may(key, held):
                    return allocation
                alloc.free(key)
                if held is None or job.gpu_type is not None:
                    return None
                refused |= {alloc.type_of(node) for node, _ in held.parts}
                if not set(alloc.types()) - refused:
                    return None
                for node in alloc.node_names:  # keep them off those types' free GPUs
                    if alloc.type_of(node) in refused and (free := alloc.free_on(node)):
                        alloc.hold(block, node, free)
        finally:
            if alloc.allocation(block) is not None:
                alloc.free(block)

    def _delays_planned(self, job: QueuedJob, until: float | None) -> bool:
        """Whether ``job``, holding its GPUs until ``until`` (None: unknown), keeps a job
        ahead of it in queue order that is planned to start before then (``planned``: not
        due yet, e.g. waiting for low carbon) from fitting now: GPUs ending before its
        start are not counted, so this errs on the side of the job ahead."""
        mine = (-job.priority, job.submitted_s)
        for other, plan in self.planned:
            if until is not None and plan.start_s >= until:
                break  # sorted by start: the rest start after it has gone
            ahead = (-other.priority, other.submitted_s) < mine
            width = width_of(other, plan, plan.start_s)
            if ahead and not _fits(self.alloc, width, other.gpu_type):
                return True
        return False

    def _shadow_for(
        self, width: int, gpu_type: str | None = None
    ) -> tuple[ClusterAllocator | None, float]:
        """A copy of the allocator as it will be when a request of ``width`` GPUs (of
        ``gpu_type``, when given) first fits (running jobs released in the order of their
        ends), and that time; (None, inf) when that waits for a job whose end nobody
        knows."""
        shadow = self.alloc.copy()
        typed = sum(n.gpus for n in shadow.topology.nodes if n.gpu == gpu_type)
        if gpu_type is not None and typed < width:
            return shadow, float("inf")  # more than its type's GPUs: it never starts here
        known = sorted((end, str(key), key) for key, end in self.ends.items() if end is not None)
        at = self.now_s
        for n, (end, _, key) in enumerate(known):
            shadow.free(key)
            if n + 1 < len(known) and known[n + 1][0] <= end:
                continue  # others end at the same time: release them too first
            if _fits(shadow, width, gpu_type):
                return shadow, max(at, end)
        return None, float("inf")

    # -- conservative -------------------------------------------------------------------
    def _conservative(self, queue: list[tuple[QueuedJob, Decision]]) -> list[tuple[int, object]]:
        now, alloc = self.now_s, self.alloc
        profile = Profile(alloc.topology, now)
        stride = profile.stride
        for key, parts in self.held.items():
            packed = 0
            for i, mask in parts:
                packed |= mask << i * stride
            profile.hold_packed(packed, self.ends.get(key))
        # past the last job without GPUs, once the reservations are made and no GPU is
        # free, nothing more starts
        last_cpu = max((n for n, (job, _) in enumerate(queue) if not job.gpus), default=-1)
        reservations: list[Reservation] = []
        started: list[tuple[int, object]] = []
        for index, (job, decision) in enumerate(queue):
            if self.least[index] > alloc.free_gpus:
                break  # none of the jobs left fits now (GPUs only get fewer)
            full = len(reservations) >= MAX_RESERVATIONS
            if full and not alloc.free_gpus and index > last_cpu:
                break
            k = width_of(job, decision, now)
            if full and (index == 0 or k > alloc.free_gpus):
                continue  # it neither starts now nor gets a reservation
            until = hold_until_s(job, decision, now, self.pieces_release)
            if index > 0 and k <= alloc.free_gpus:

                def may(key: Hashable, held, job=job, until=until) -> bool:
                    masks = {} if held is None else profile.masks(held.parts)
                    packed = profile.pack(masks)
                    if any(r.packed & packed and r.overlaps(masks, now, until)
                           for r in reservations) or (
                        held is not None and self._delays_planned(job, until)
                    ):  # fmt: skip
                        return False
                    profile.hold(masks, until)
                    return True

                allocation = self._allocate_where(job, decision, may)
                if allocation is not None:
                    started.append((index, allocation))
                    continue
            if len(reservations) >= MAX_RESERVATIONS:
                continue  # no reservation of its own: it starts only where it fits
            run_s = None if until is None else until - now
            reservation = profile.reserve(k, run_s, reservations, job.gpu_type)
            if reservation is None:
                break  # it waits for a run time nobody knows: nothing may pass it
            reservations.append(reservation)
        return started


def _still_fits(
    shadow: ClusterAllocator, key: Hashable, parts, width: int, gpu_type: str | None = None
) -> bool:
    """Hold ``parts`` on the shadow; keep them if a request of ``width`` still fits."""
    _hold(shadow, key, parts)
    if _fits(shadow, width, gpu_type):
        return True
    shadow.free(key)
    return False


def _fits(alloc: ClusterAllocator, width: int, gpu_type: str | None = None) -> bool:
    """Whether a request of ``width`` GPUs (of ``gpu_type``, when given) fits now."""
    if width <= 0:
        return True
    if width > alloc.free_gpus:
        return False
    try:
        got = alloc.allocate(("fit",), width, gpu_type=gpu_type)
    except PlacementError:
        return False  # more than that type's GPUs: never
    if got is None:
        return False
    alloc.free(("fit",))
    return True


def _hold(alloc: ClusterAllocator, key: Hashable, parts) -> None:
    for node, gpus in parts:
        alloc.hold(key, node, gpus)
