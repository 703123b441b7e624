"""Idle power and right-sizing in the simulator: each node's power state (on, off, waking),
the energy of idle GPUs and powered-on idle servers, and the nodes powered down.

What a node that is on draws besides its jobs (each job pays its GPUs' draw and its host
share per GPU, ``JobModel.power_w``): for each free GPU, the GPU's idle draw
(``gpu_idle_w``; default 20 % of the GPU type's maximum limit, as ``JobModel.idle_power_w``)
and its share of the server's idle draw (``node_idle_w`` × free GPUs / the node's GPUs),
all × PUE. A node waking up draws as one that is on and idle; a node that is off draws
nothing (standby power is not modelled).

Right-sizing (``idle_off_after`` set, for the cluster or a node): after every pass the
pure decision ``planning.devices.rightsizing.right_size`` is taken on the nodes' states
and the plan's next starts. A node powered off has its GPUs held in the allocator (under
``("off", name)``), so no job is placed there; the planner sees them as committed until
the node could answer (``committed``: now + its wake-up time, or the end of a wake-up
under way), so a start that needs them is planned after the wake-up, and a node is woken
when a start due within its wake-up time does not fit on the nodes on (of the type the job
asked for; GPUs a running job frees before the wake-up would end count as room). A job
with a deadline counts as due a slot before its latest start at the latest: the planner
starts jobs on slot edges, so a node woken for the planned start alone could answer a slot
too late.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.dependencies import planned_end_s
from orchestrator.planning.devices.rightsizing import (
    OFF,
    ON,
    WAKING,
    Need,
    NodePower,
    right_size,
    unplaced_typed,
)
from orchestrator.planning.pieces import width_of
from orchestrator.planning.policies.base import Commitment

DEFAULT_NODE_IDLE_W = 150.0  # CPUs, memory, fans, network of a server on (ClusterPower's)
DEFAULT_WAKE = "5m"


@dataclass
class IdleAccount:
    """The idle draw over a run, as stretches of constant cluster-wide idle power."""

    start_s: np.ndarray
    end_s: np.ndarray
    power_w: np.ndarray
    power_offs: int = 0
    wakes: int = 0
    right_sizing: bool = False

    def padded(self, end_s: float) -> IdleAccount:
        """The same account to ``end_s`` (no earlier than its own end), its last draw held
        meanwhile: runs ending at different times compared over one window."""
        last = float(self.end_s[-1])
        if end_s <= last:
            return self
        final_w = self.power_w[np.searchsorted(self.start_s, last, side="right") - 1]
        return IdleAccount(
            np.append(self.start_s, last), np.append(self.end_s, end_s),
            np.append(self.power_w, final_w), self.power_offs, self.wakes, self.right_sizing,
        )  # fmt: skip


@dataclass
class _Node:
    name: str
    gpus: int
    wake_s: float
    off_after_s: float | None
    idle_w: float  # all GPUs free: the server's and the GPUs' idle draw, before PUE
    gpu_type: str | None = None
    state: str = ON
    idle_since_s: float | None = None
    ready_s: float = 0.0  # waking: when it answers
    free: int = 0


@dataclass
class SimPower:
    """The nodes' power states in one run; ``step`` is a step of the pass (after launch)."""

    daemon: object  # orchestrator.sim.engine.SimDaemon: its allocator, loop and scheduler
    nodes: list[_Node] = field(default_factory=list)
    _t: list[float] = field(default_factory=list)
    _w: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        inputs = self.daemon.inputs
        self.pue = inputs.cluster.pue
        self.nodes = node_settings(inputs)
        self.enabled = any(n.off_after_s is not None for n in self.nodes)
        self.plan_idle = plan_idle(self.nodes, inputs.cluster, self.enabled)
        self._offs: list[float] = []  # when each power-off and wake-up was decided
        self._wakes: list[float] = []
        self._checks: set[float] = set()
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._seen = tuple(n.gpus for n in self.nodes)  # free GPUs per node, last step
        self._node_w = np.array([float(n.idle_w) for n in self.nodes])  # each one's idle draw
        self._mark: tuple | None = None  # the queue's size and replans at the last decision
        self._due_s = -np.inf  # when right-sizing must decide again, at the latest
        self._dirty = True
        # no right-sizing and one idle draw per GPU everywhere: the cluster's idle draw
        # is that × its free GPUs (each pass then costs nothing more)
        per_gpu = {n.idle_w / n.gpus for n in self.nodes}
        self._uniform_w = per_gpu.pop() if len(per_gpu) == 1 and not self.enabled else None
        start = float(inputs.jobs.submit_s[0])
        for n in self.nodes:
            n.free, n.idle_since_s = n.gpus, start
        # nodes right-sizing may power off (on, every GPU free), and nodes off or waking:
        # with neither, it has nothing to decide
        self._idle = {i for i, n in enumerate(self.nodes) if n.off_after_s is not None}
        self._down: set[int] = set()
        self._ripe_s: float | None = None  # when the first idle node may go off (None: stale)
        self._views = [self._view(n) for n in self.nodes]  # as right_size sees each node
        self._t, self._w = [start], [float(self._node_w.sum()) * self.pue]

    # -- the pass's step ----------------------------------------------------------------
    def step(self, now: float) -> None:
        """Note the nodes whose free GPUs changed; right-size when anything it reads did
        (free GPUs, the queue, a plan, a wake-up, a time it asked to decide again at);
        record the idle draw from now. Cheap when nothing changed (every pass runs it)."""
        if self._uniform_w is not None:
            self._record(now, self._uniform_w * self.daemon.alloc.free_gpus)
            return
        free = self.daemon.alloc.free_per_node()
        changed = free != self._seen
        if changed:
            for i in [i for i, (a, b) in enumerate(zip(free, self._seen, strict=True)) if a != b]:
                n = self.nodes[i]
                if n.state != ON:
                    continue  # held while off or waking: its draw is set with its state
                n.free = free[i]
                if n.free < n.gpus:
                    n.idle_since_s = None
                    self._idle.discard(i)
                elif n.idle_since_s is None:
                    n.idle_since_s = now
                    if n.off_after_s is not None:
                        self._idle.add(i)
                self._node_w[i] = n.idle_w * n.free / n.gpus
                self._views[i] = self._view(n)
            self._seen, self._ripe_s = free, None
        sched = self.daemon.scheduler
        if self.enabled and ((self._down and len(sched)) or now >= self._ripe()):
            mark = (len(sched), sched.replans)
            if changed or self._dirty or mark != self._mark or now >= self._due_s:
                self._mark, self._dirty = mark, False
                self._right_size(now)
        elif self.enabled and self._ripe() < np.inf:  # nothing to decide before then
            self._due_s = min(self._due_s, self._ripe())
            self._check_at(self._ripe())
        self._record(now, float(self._node_w.sum()))

    def _right_size(self, now: float) -> None:
        sched = self.daemon.scheduler
        needs = [
            Need(need_start_s(job, d, self.daemon.slot_s), width_of(job, d, max(now, d.start_s)),
                 job.id, job.gpu_type)
            for job, d in sched.planned()
        ]  # fmt: skip
        actions = right_size(self._views, needs, now, self._frees())
        alloc = self.daemon.alloc
        for name in actions.power_off:
            node = self.nodes[self._index[name]]
            alloc.hold(("off", name), name, alloc.gpus_of(name))
            node.state, node.free, node.idle_since_s = OFF, 0, None
            self._node_w[self._index[name]] = 0.0
            self._idle.discard(self._index[name])
            self._down.add(self._index[name])
            self._ripe_s = None
            self._views[self._index[name]] = self._view(node)
            self._offs.append(now)
        limit = getattr(self.daemon, "limit", None)  # a wake is an admission under it
        for name in actions.wake:
            node = self.nodes[self._index[name]]
            if limit is not None and not limit.wake_fits(node.idle_w * self.pue, now):
                continue  # it stays off until an end frees power (decided again then)
            node.state, node.ready_s = WAKING, now + node.wake_s
            self._node_w[self._index[name]] = node.idle_w
            self._views[self._index[name]] = self._view(node)
            self.daemon.loop.schedule(node.ready_s, lambda node=node: self._woken(node), 0)
            self._wakes.append(now)
        if actions.power_off or actions.wake:
            sched.invalidate()  # the capacity the plan saw changed
        self._due_s = np.inf if actions.next_check_s is None else actions.next_check_s
        if actions.next_check_s is not None:
            self._check_at(actions.next_check_s)

    def _frees(self) -> list[tuple[str, float, int]]:
        """(node, expected end, GPUs) of each running job: GPUs a start may wait for."""
        masks, names = self.daemon.alloc.held_masks(), self.daemon.alloc.node_names
        return [
            (names[i], att.end_s, mask.bit_count())
            for att in self.daemon._running.values()
            for i, mask in masks.get(att.key, ())
        ]

    def _check_at(self, at: float) -> None:
        if at not in self._checks:
            self._checks.add(at)
            self.daemon.loop.schedule(at)

    def _ripe(self) -> float:
        """When the first idle node reaches its idle_off_after."""
        if self._ripe_s is None:
            nodes = (self.nodes[i] for i in self._idle)
            self._ripe_s = min((n.idle_since_s + n.off_after_s for n in nodes), default=np.inf)
        return self._ripe_s

    @staticmethod
    def _view(n: _Node) -> NodePower:
        free = n.free if n.state == ON else n.gpus
        return NodePower(
            n.name, n.gpus, free, n.state, n.idle_since_s, n.wake_s, n.off_after_s, n.gpu_type
        )

    def _woken(self, node: _Node) -> None:
        """The end of a wake-up: the node answers and its GPUs may be allocated."""
        if node.state == WAKING:
            self.daemon.alloc.free(("off", node.name))
            node.state, node.free, node.idle_since_s = ON, node.gpus, self.daemon.loop.now
            i = self._index[node.name]
            self._down.discard(i)
            if node.off_after_s is not None:
                self._idle.add(i)
            self._views[i], self._ripe_s = self._view(node), None
            seen = list(self._seen)
            seen[i] = -1  # the next step reads its GPUs again
            self._seen, self._dirty = tuple(seen), True
            self.daemon.scheduler.invalidate()

    # -- what the planner sees ----------------------------------------------------------
    def committed(self, now: float) -> list[Commitment]:
        """The GPUs of nodes off or waking, as held until the node could answer."""
        nodes = [(k, self.nodes[k]) for k in sorted(self._down)]
        return [
            Commitment(
                -1 - k,
                n.gpus,
                0.0,
                now,
                n.ready_s if n.state == WAKING else now + n.wake_s,
                n.gpu_type,
            )
            for k, n in nodes
        ]

    def context(self, now: float, running: list[Commitment]) -> dict:
        """The planner's view: running jobs and nodes off as committed, and what keeping
        a server on costs a job that waits (``plan_idle``; by default with right-sizing,
        for at most idle_off_after and a wake-up)."""
        out: dict = {"committed": running + self.committed(now)}
        if self.plan_idle:
            out["idle_w_per_gpu"], out["idle_wait_s"] = self.plan_idle
        return out

    def answers_in_time(self, width: int, gpu_type: str | None) -> bool:
        """Whether the blocked head of the queue (``width`` GPUs of ``gpu_type``) fits on
        the GPUs free on nodes on and those of nodes off or waking that answer by its
        latest start: the deadline guard then waits for the wake-up (right-sizing wakes
        them: the head is due) rather than suspending a running job."""
        latest = self.daemon.scheduler.blocked_latest_start_s()
        if not self._down or latest is None:
            return False
        now, free_now = self.daemon.loop.now, self.daemon.alloc.free_per_node()
        free = {}
        for n, f in zip(self.nodes, free_now, strict=True):
            ready = n.ready_s if n.state == WAKING else now + n.wake_s
            if n.state == ON or ready <= latest:
                free[n.name] = f if n.state == ON else n.gpus
        size, types = {n.name: n.gpus for n in self.nodes}, {n.name: n.gpu_type for n in self.nodes}
        return not unplaced_typed([(width, gpu_type)], free, size, types)

    def is_on(self, node: str) -> bool:
        return next(n.state == ON for n in self.nodes if n.name == node)

    # -- accounts -----------------------------------------------------------------------
    def _record(self, now: float, node_w: float) -> None:
        watts = node_w * self.pue
        if watts != self._w[-1]:
            self._t.append(now)
            self._w.append(watts)

    def account(self, end_s: float) -> IdleAccount:
        """The idle stretches from the first arrival to ``end_s`` (the last job's end), and
        the power-offs and wake-ups until then."""
        t = np.minimum(np.asarray([*self._t, max(end_s, self._t[-1])]), end_s)
        offs = sum(at <= end_s for at in self._offs)
        wakes = sum(at <= end_s for at in self._wakes)
        return IdleAccount(t[:-1], t[1:], np.asarray(self._w), offs, wakes, self.enabled)


def need_start_s(job, decision, slot_s: float) -> float:
    """When right-sizing should count a planned start as due: its start, or for a job with
    a deadline, a slot before its latest start at the latest (the planner starts jobs on
    slot edges: a node woken for the planned start alone may answer a slot too late)."""
    if job.deadline_s is None:
        return decision.start_s
    run_s = planned_end_s(decision, job.duration_s) - decision.start_s
    return min(decision.start_s, job.deadline_s - run_s - slot_s)


def plan_idle(nodes: list[_Node], cluster, right_sizing: bool) -> tuple | None:
    """(idle W per GPU, the longest wait it is counted for) for the planner, or None.

    Only what a deferral adds is counted: always on, the cluster's idle GPU-hours do not
    depend on when a job starts (nothing); right-sized, a job's wait keeps its GPUs' server
    on for at most ``idle_off_after`` and a wake-up. Off unless ``plan_idle = true``: on the
    planner benchmark's stretch it raised jobs' and idle carbon together."""
    if not cluster.plan_idle or not right_sizing or not nodes:
        return None
    offs = [n.off_after_s + n.wake_s for n in nodes if n.off_after_s is not None]
    if len(offs) != len(nodes):
        return None  # a node always on: waiting there adds nothing
    per_gpu_w = sum(n.idle_w for n in nodes) / sum(n.gpus for n in nodes) * cluster.pue
    return per_gpu_w, max(offs)


def node_settings(inputs) -> list[_Node]:
    """Each node's wake-up, idle_off_after and idle draw: its own, else the cluster's."""
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.timeparse import parse_duration_s

    cfg = inputs.cluster
    by_name = {n.name: n for n in cfg.nodes or ()}
    out = []
    for topo in inputs.topology.nodes:
        own = by_name.get(topo.name)
        # an idle GPU: 20 % of its type's maximum limit (a node's own type, where nodes
        # have one, else the cluster's)
        gpu_type = getattr(topo, "gpu", None) or getattr(own, "gpu", None)
        gpu_idle_default = 0.2 * (curve_for(gpu_type) if gpu_type else inputs.curve).max_limit_w

        def pick(attr: str, own=own):
            value = getattr(own, attr, None) if own is not None else None
            return value if value is not None else getattr(cfg, attr)

        off_after = pick("idle_off_after")
        gpu_idle = pick("gpu_idle_w")
        gpu_idle = gpu_idle_default if gpu_idle is None else gpu_idle
        out.append(
            _Node(
                topo.name,
                topo.gpus,
                parse_duration_s(pick("wake")),
                None if off_after in (None, "never") else parse_duration_s(off_after),
                pick("node_idle_w") + topo.gpus * gpu_idle,
                gpu_type,
            )
        )
    return out


def idle_metrics(inputs, idle: IdleAccount | None) -> dict:
    """``simulate --json``'s idle keys: the idle energy and its carbon, and right-sizing's
    power-offs and wake-ups."""
    if idle is None:
        return {}
    span = idle.end_s - idle.start_s
    energy_j = float(np.sum(idle.power_w * span))
    carbon_g = float(np.sum(idle.power_w * inputs.carbon.integral(idle.start_s, idle.end_s)))
    return {
        "idle_energy_kwh": round(energy_j / J_PER_KWH, 3),
        "idle_carbon_kg": round(carbon_g / J_PER_KWH / 1000, 3),
        "power_offs": idle.power_offs,
        "wakes": idle.wakes,
    }
