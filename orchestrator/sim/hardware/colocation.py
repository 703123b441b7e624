"""Co-location in what-if runs (EaCO): two jobs on one GPU.

A share of the jobs (``[jobs] share``, ``simulate --share``, drawn with the scenario's
seed) may share their GPUs. When one of them is about to start, it joins the GPUs where
another such job of the same width runs alone (a job on k GPUs shares all k with one other
job on the same k: each of its data-parallel replicas is paired as a single-GPU pair), if
the interference model (``planning.devices.interference``, fitted on Gavel's pairs)
predicts that

- each keeps at least ``MIN_SPEED`` of its speed alone, and each still ends by its
  deadline at that speed (the one already running: its work left; the newcomer: all of
  it), and
- the energy per unit of work falls: the shared GPU's draw (the larger draw alone plus
  10 %, at most the boards' limit) over both jobs' combined speed is below their draws
  alone.

Among the GPUs that qualify it takes the one where the pair's energy per unit of work is
lowest; otherwise it gets GPUs of its own as usual.

Co-location moves (``[jobs] moves``, off by default; ``_regroup``, after each pass): a
job alone that may share and be interrupted is checkpointed and restarts next to another
job running alone, by the rule above, in a pass at once (it loses ``checkpoint_cost`` of
run time, as any restart does). Two kinds, ``true`` for both:

- ``"waiting-jobs"``: while a job waits for GPUs, one whose GPUs let it start moves when
  ``interference.move_gain_j`` says the pair saves more than twice what the checkpoint
  costs, jobs on the emptiest servers first, one move per waiting job;
- ``"empty-servers"``: while no job waits, with right-sizing on, the jobs of a server that
  all run alone move when that empties the server and pays, idle draw included
  (``sim.hardware.evacuation``).

Measured on the co-location benchmark, moves for waiting jobs cost the cluster energy (the
queue drains sooner and the GPUs it freed then idle on servers kept on); moves that empty
servers save it. With no job waiting and no server to empty, no move: it would slow two
jobs down for a GPU nobody needs (measured: at 300 jobs, such moves doubled the JCT
increase). From the moment they pair until one of them
leaves (it ends, or is suspended), each runs at its predicted speed and is charged its
share of the GPU's draw (``interference.split``: the parts sum to the GPU's); the one left
runs alone at full speed again, and may take a new partner. The GPU stays held until both
have left. Elastic jobs and the clairvoyant policy never share; the deadline guard never
suspends a job that shares (that frees no GPU). Instead, a pair whose true speeds put one
job's deadline at risk is split (``sim.hardware.splits``, always on): ``MOVE_AFTER_S``
after they paired, that job, if it may be interrupted and alone would keep its deadline,
is checkpointed and restarts at once alone (``result.splits``).

Each job's model (its Gavel job type or family) is the one the simulator's GPU types use
(``planning.devices.gputypes.model_mix``: Philly's jobs get Gavel's mix by seed).
"""

from __future__ import annotations

import signal

import numpy as np

from orchestrator.planning.devices.interference import (
    MIN_SPEED,
    MOVE_AFTER_S,
    Interference,
    job_types,
    may_move_again,
    move_gain_j,
    shared_power_w,
    split,
    worth_sharing,
)
from orchestrator.planning.pieces import piece_index, width_of
from orchestrator.planning.policies.base import Decision
from orchestrator.sim.engine import SimDaemon
from orchestrator.sim.hardware.evacuation import evacuations
from orchestrator.sim.hardware.splits import Splits
from orchestrator.sim.inputs import SimInputs
from orchestrator.sim.scenario import EMPTY_SERVERS, WAITING_JOBS
from placement.cluster import Allocation, ClusterAllocator


def may_share(n: int, share: float, seed: int) -> np.ndarray:
    """Which of ``n`` jobs may share a GPU: a ``share`` of them, drawn with ``seed``."""
    return np.random.default_rng([seed, 11]).uniform(0, 1, n) < share


def job_kinds(inputs: SimInputs) -> list[str]:
    """Each job's Gavel job type (a traced name that is one: ``"ResNet-50 (batch size
    64)"``), else its family as the simulator's GPU types read it (``resnet50``: the
    family's mean), else the type drawn from Gavel's mix (``sim.hardware.devices``)."""
    families = inputs.families or ["any"] * len(inputs.jobs)
    known = set(job_types())
    return [
        name if name in known else family
        for name, family in zip(inputs.jobs.names or families, families, strict=True)
    ]


def frees_room(head, node: str, free_after: int, alloc) -> bool:
    """Whether ``free_after`` GPUs free on ``node`` let the waiting job ``head`` start there
    (its narrowest width on one server, of the GPU type it asked for)."""
    typed = head.gpu_type is None or alloc.type_of(node) == head.gpu_type
    return typed and free_after >= (head.min_gpus or head.gpus)


def daemon_class(inputs: SimInputs) -> type[SimDaemon]:
    """The simulator to run: with co-location when some jobs may share."""
    return SharingDaemon if inputs.scenario.jobs.share > 0 else SimDaemon


class _SharedAllocator(ClusterAllocator):
    """The cluster's allocator, asking the simulator before it frees a shared GPU."""

    def __init__(self, topology, on_free) -> None:
        super().__init__(topology)
        self._on_free = on_free

    def free(self, key: object) -> None:
        if self._on_free(key):
            super().free(key)


class SharingDaemon(SimDaemon):
    """``SimDaemon`` whose jobs may share a GPU, two at a time."""

    def __init__(self, inputs: SimInputs, policy, forecaster, progress=None) -> None:
        super().__init__(inputs, policy, forecaster, progress)
        self.alloc = _SharedAllocator(inputs.topology, self._released)
        self.interference = Interference()
        self._may = may_share(self.n, inputs.scenario.jobs.share, inputs.scenario.seed)
        self._kinds = job_kinds(inputs)
        self._att_of: dict[int, int] = {}  # job -> its running attempt
        self._open: dict[int, int] = {}  # jobs alone on their GPUs that may take a partner
        self._pending: dict[int, tuple[int, float, float]] = {}  # newcomer -> host, speeds
        self._partner: dict[int, int] = {}
        self._held_by: dict[int, int] = {}  # job -> the job whose allocation holds its GPU
        self.pairs: list[tuple[int, int, float]] = []  # (running job, newcomer, when) formed
        self._moving: dict[int, tuple] = {}  # checkpointed to join a host: host, speeds, cap
        self._reserved: set[int] = set()  # hosts a moving job will join in this pass
        self.moves = 0
        self.splits = Splits(self)  # pairs split to keep a deadline (``splits``)

    def run(self):
        result = super().run()
        result.pairs = list(self.pairs)
        result.moves = self.moves
        result.splits = self.splits.count
        return result

    # -- the pass's steps --------------------------------------------------------------
    def allocate(self, job, decision, now: float):
        i = job.id
        alone = i in self.splits.alone_next  # split from a partner: alone this time
        if self._may[i] and not alone and not self.clairvoyant and job.min_gpus == job.max_gpus:
            cap = decision.piece_config(piece_index(decision, now))[1]
            host = self._moving.pop(i, None)
            if host is not None:  # moved to join it: still alone?
                self._reserved.discard(host[0])
                host = host[:3] if host[0] in self._open else None
            if host is None:
                host = self._host_for(job, width_of(job, decision, now), cap, now)
            if host is not None:  # claimed until the next pass (backfill may not start it)
                self._pending[i] = host
                parts = self.alloc.allocation(("job", host[0])).parts
                return Allocation(("job", i), parts)
        return super().allocate(job, decision, now)

    def tick(self, now: float) -> None:
        self._pending.clear()
        super().tick(now)
        self._moving.clear()  # a moved job the pass did not start plans again as any other
        self._reserved.clear()
        split = self.splits.step(now)  # a pair's job at risk of its deadline: alone
        if self._regroup(now) or split:
            self.loop.schedule(now)  # a pass at once: the moved job restarts next to its host

    def _requeue(self, att, now: float) -> None:
        """A job checkpointed to move restarts now (next to its host, ``allocate``)."""
        i = att.job.id
        if self.splits.requeue(att, now):
            return  # split from its partner: restarts at once, alone
        if i not in self._moving:
            return super()._requeue(att, now)
        left = self._duration[i] * (1.0 - self.done[i]) + self.inputs.checkpoint_s
        cap = self._moving[i][3]  # the cap its plan gave it
        self.scheduler.add_planned(self._queued(i, left), Decision(now, gpus=att.gpus, cap=cap))

    def launch(self, job, decision, allocation, now: float) -> None:
        super().launch(job, decision, allocation, now)
        i = job.id
        self._att_of[i] = self._attempt_id
        pending = self._pending.pop(i, None)
        alone = i in self.splits.alone_next
        self.splits.alone_next.discard(i)
        if pending is not None and self._open.pop(pending[0], None) is not None:
            self._pair(i, *pending, now)
        elif self._may[i] and not alone and job.min_gpus == job.max_gpus:
            self._open[i] = allocation.gpus

    def make_room(self, width: int, movable: dict, gpu_type: str | None = None) -> list:
        """The guard never suspends a job sharing its GPU: that frees no GPU."""
        alone = {k: v for k, v in movable.items() if k[1] not in self._partner}
        return super().make_room(width, alone, gpu_type)

    def cluster(self, now: float) -> tuple:
        alloc, ends = super().cluster(now)
        for i, host in self._held_by.items():
            key, other = ("job", host), ("job", i)
            if key in ends and other in ends:
                ends[key] = max(ends[key], ends[other])
        return alloc, ends

    # -- pairs ---------------------------------------------------------------------------
    def _regroup(self, now: float) -> bool:
        """After a pass: while a job waits for GPUs, move a job alone that may share and
        be interrupted, whose GPUs let the waiting job start, next to another job alone on
        the same GPU type where that pays (``move_gain_j``); while none waits, the moves
        that empty servers (``evacuations``). True when one was checkpointed (it restarts
        in a pass at this time)."""
        head, mode = self.scheduler.blocked(), self.inputs.scenario.jobs.moves
        if not mode or self.clairvoyant:
            return False
        if head is None:  # nobody waits: only moves that empty a server (to power it down)
            if mode not in (True, EMPTY_SERVERS) or not self.power.enabled:
                return False
            moves = evacuations(self, now)
            for x, host in moves:
                self._move(x, host)
            self._wake_when_movable(now)
            return bool(moves)
        if mode not in (True, WAITING_JOBS):
            return False
        movers = [x for x in self._open if self._interruptible[x]]
        if not movers or len(self._open) < 2:
            return False
        ckpt, alloc = self.inputs.checkpoint_s, self.alloc
        free = {name: len(alloc.free_on(name)) for name in alloc.node_names}
        movers.sort(key=lambda x: -free.get(alloc.node_of(("job", x)), 0))  # emptiest first
        for x in movers:
            att = self._running.get(self._att_of.get(x, -1))
            node = alloc.node_of(("job", x))
            if att is None or node is None or att.suspend_event is not None:
                continue  # ending, or stopping at its piece's end anyway
            if not may_move_again(now - att.start_s, ckpt):
                continue  # never twice in quick succession (the daemon's rule)
            if not frees_room(head, node, free[node] + att.gpus, alloc):
                continue  # cheap first: the GPUs it frees are too few or of another type
            left, done = self.executor.remaining_s(att.handle), self.executor.done_now(att.handle)
            cap_w = self.executor.cap_of(att.handle)  # (cap, watts) it runs at now
            if None in (left, done, cap_w) or not self._lets_start(head, ("job", x)):
                continue
            job = self._queued(x, self._duration[x] * (1.0 - done) + ckpt)
            gpu, best = self._gpu_type(x), None
            for _, h, speed_x, speed_h, left_h in self._hosts(job, att.gpus, cap_w[0], now):
                host_w = self.executor.cap_of(self._running[self._att_of[h]].handle)
                if self._gpu_type(h) != gpu or host_w is None:
                    continue  # its draw and time left are on its own type
                gain = move_gain_j(cap_w[1], host_w[1], speed_x, speed_h, left, left_h, ckpt)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, h, speed_x, speed_h)
            if best is not None:
                self._move(x, best[1:])
                return True  # one move per waiting job: it fits now
        self._wake_when_movable(now)  # one may move later, the job still waiting
        return False

    def _wake_when_movable(self, now: float) -> None:
        """A pass when the next job alone that may be interrupted has run long enough to
        move (``may_move_again``), as the daemon's passes would find it."""
        ckpt, due = self.inputs.checkpoint_s, []
        for x in self._open:
            att = self._running.get(self._att_of.get(x, -1))
            if att is not None and self._interruptible[x]:
                due.append(att.start_s + 2.0 * ckpt + MOVE_AFTER_S + 1e-6)  # not rounded under
        later = [at for at in due if at > now]
        if later:
            self._wake(min(later))

    def _move(self, x: int, host: tuple[int, float, float]) -> None:
        """Checkpoint job ``x`` to restart next to ``host`` (job, speeds) in this pass."""
        att = self._running[self._att_of[x]]
        # it restarts at its planned cap (the site limit may lower it at launch, not for good)
        planned = att.decision.piece_config(piece_index(att.decision, self.loop.now))[1]
        self._moving[x] = (*host, planned)
        self._reserved.add(host[0])
        self.moves += 1
        self.executor.signal(att.handle, signal.SIGTERM)

    def _lets_start(self, head, key) -> bool:
        """Whether the waiting job ``head`` could be placed only with ``key``'s GPUs free
        (the allocator's own answer on a copy: buddy blocks, nodes off, its GPU type; one
        that fits already waits for something else, such as the site's power)."""
        return self.alloc.room_if_freed(key, head.min_gpus or head.gpus, head.gpu_type)

    def _host_for(self, job, width: int, cap: float, now: float) -> tuple | None:
        """The job running alone on ``width`` GPUs that ``job`` should join (and their
        speeds), or None: the one where the pair's energy per unit of work is lowest."""
        best = min(self._hosts(job, width, cap, now), default=None)
        return None if best is None else best[1:4]

    def _hosts(self, job, width: int, cap: float, now: float):
        """Each job running alone on ``width`` GPUs that ``job`` may join by the rule, as
        (the pair's energy per unit of work, that job, the two speeds, its time left)."""
        if not self._open:
            return
        i, kind = job.id, self._kinds[job.id]
        power_i = self._model(i).power_w(width, cap)
        deadline_i = self._deadline[i]
        seen = {}
        claimed = {host for host, _, _ in self._pending.values()} | self._reserved
        for h, held in self._open.items():
            if held != width or h in claimed or h == i:
                continue
            gpu = self._gpu_type(h)
            if self._wants[i] is not None and gpu != self._wants[i]:
                continue  # it asked for another GPU type
            pair = (self._kinds[h], gpu)
            if pair not in seen:
                seen[pair] = self.interference.speeds(kind, pair[0], gpu)
            speed_i, speed_h = seen[pair]
            att = self._running[self._att_of[h]]
            power_h = att.power_w
            if att.suspend_event is not None:
                continue  # it stops at its piece's end
            if not worth_sharing(speed_i, speed_h, power_i, power_h, MIN_SPEED):
                continue
            if deadline_i is not None and now + job.duration_s / speed_i > deadline_i:
                continue
            left = self.executor.remaining_s(att.handle)
            deadline_h = self._deadline[h]
            if left is None or (deadline_h is not None and now + left / speed_h > deadline_h):
                continue
            yield shared_power_w(power_i, power_h) / (speed_i + speed_h), h, speed_i, speed_h, left

    def _gpu_type(self, job_id: int) -> str:
        node = self.alloc.node_of(("job", self._held_by.get(job_id, job_id)))
        return (node and self.alloc.type_of(node)) or self.inputs.cluster.gpu

    def _pair(self, i: int, host: int, speed_i: float, speed_h: float, now: float) -> None:
        att_i, att_h = self._running[self._att_of[i]], self._running[self._att_of[host]]
        if self.inputs.pair_speeds is not None:  # they run at what Gavel measured; the
            speed_i, speed_h = self._measured(i, host, speed_i, speed_h)  # model learns it
        power_i, power_h = att_i.power_w, att_h.power_w
        total = shared_power_w(power_i, power_h, max(self._limit_w(host), power_i, power_h))
        share_i, share_h = split(total, power_i, power_h, speed_i, speed_h)
        self._partner[i], self._partner[host] = host, i
        self._held_by[i] = host
        for att, speed, share, power in (
            (att_i, speed_i, share_i, power_i),
            (att_h, speed_h, share_h, power_h),
        ):
            self.executor.rescale(att.handle, speed, share / power, 0.5)  # half each GPU
            self._expect_end(att, now)
        self.pairs.append((host, i, now))
        self.splits.paired(i, speed_i, now)
        self.splits.paired(host, speed_h, now)

    def _measured(self, i: int, h: int, speed_i: float, speed_h: float) -> tuple[float, float]:
        """The pair's speeds as Gavel measured them (the prediction where it did not),
        each then put in place of the model's prediction for that pair (refined online)."""
        gpu = self._gpu_type(h)
        key = (gpu or "").lower()
        kinds = self._kinds[i], self._kinds[h]
        got = []
        for (a, b), predicted in ((kinds, speed_i), (kinds[::-1], speed_h)):
            speed = self.inputs.pair_speeds.get((key, a, b), predicted)
            if (key, a, b) in self.inputs.pair_speeds:
                self.interference.observe(a, b, gpu, speed)
            got.append(speed)
        return got[0], got[1]

    def _limit_w(self, job_id: int) -> float:
        """The facility draw of ``job_id``'s GPUs at their board limit: a shared GPU draws
        no more (``SHARED_EXTRA`` is capped there)."""
        m = self._running_model(job_id)
        n = self._running[self._att_of[job_id]].gpus
        return n * (m.curve.max_limit_w * m.power_scale + m.host_w_per_gpu) * m.pue

    def _released(self, key) -> bool:
        """Job ``key`` leaves its GPU: True when the allocator should free it."""
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == "job"):
            return True  # a probe (backfill's)
        i = key[1]
        self._open.pop(i, None)
        self._att_of.pop(i, None)
        other = self._partner.pop(i, None)
        if other is None:
            return True
        del self._partner[other]
        self.splits.left(i)
        self.splits.left(other)
        att = self._running.get(self._att_of.get(other, -1))
        if att is not None:  # alone again: full speed, its own draw
            self.executor.rescale(att.handle, 1.0, 1.0, 1.0)
            self._expect_end(att, self.loop.now)
            self._open[other] = att.gpus
        if self._held_by.pop(i, None) is not None:
            return False  # a newcomer leaves: its host keeps the GPU
        parts = self.alloc.allocation(key).parts  # the host leaves: the GPU passes on
        ClusterAllocator.free(self.alloc, key)
        del self._held_by[other]
        for node, gpus in parts:
            self.alloc.hold(("job", other), node, gpus)
        return False

    def _expect_end(self, att, now: float) -> None:
        left = self.executor.remaining_s(att.handle)
        if left is not None and att.suspend_event is None:
            att.end_s = now + left
