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
when a start due within its wake-up time does not fit on the nodes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.devices.rightsizing import OFF, ON, WAKING, Need, NodePower, right_size
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


@dataclass
class _Node:
    name: str
    gpus: int
    wake_s: float
    off_after_s: float | None
    idle_w: float  # all GPUs free: the server's and the GPUs' idle draw, before PUE
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
        start = float(inputs.jobs.submit_s[0])
        for n in self.nodes:
            n.free, n.idle_since_s = n.gpus, start
        self._t, self._w = [start], [float(self._node_w.sum()) * self.pue]

    # -- the pass's step ----------------------------------------------------------------
    def step(self, now: float) -> None:
        """Note the nodes whose free GPUs changed; right-size when anything it reads did
        (free GPUs, the queue, a plan, a wake-up, a time it asked to decide again at);
        record the idle draw from now. Cheap when nothing changed (every pass runs it)."""
        free = self.daemon.alloc.free_per_node()
        changed = free != self._seen
        if changed:
            for i in np.flatnonzero(np.asarray(free) != np.asarray(self._seen)).tolist():
                n = self.nodes[i]
                if n.state != ON:
                    continue  # held while off or waking: its draw is set with its state
                n.free = free[i]
                if n.free < n.gpus:
                    n.idle_since_s = None
                elif n.idle_since_s is None:
                    n.idle_since_s = now
                self._node_w[i] = n.idle_w * n.free / n.gpus
            self._seen = free
        if self.enabled:
            sched = self.daemon.scheduler
            mark = (len(sched), sched.replans)
            if changed or self._dirty or mark != self._mark or now >= self._due_s:
                self._mark, self._dirty = mark, False
                self._right_size(now)
        self._record(now)

    def _right_size(self, now: float) -> None:
        sched = self.daemon.scheduler
        needs = [
            Need(d.start_s, width_of(job, d, max(now, d.start_s)), job.id)
            for job, d in sched.planned()
        ]
        states = [
            NodePower(n.name, n.gpus, n.free if n.state == ON else n.gpus, n.state,
                      n.idle_since_s, n.wake_s, n.off_after_s)
            for n in self.nodes
        ]  # fmt: skip
        actions = right_size(states, needs, now)
        alloc = self.daemon.alloc
        for name in actions.power_off:
            node = self.nodes[self._index[name]]
            alloc.hold(("off", name), name, alloc.gpus_of(name))
            node.state, node.free, node.idle_since_s = OFF, 0, None
            self._node_w[self._index[name]] = 0.0
            self._offs.append(now)
        for name in actions.wake:
            node = self.nodes[self._index[name]]
            node.state, node.ready_s = WAKING, now + node.wake_s
            self._node_w[self._index[name]] = node.idle_w
            self.daemon.loop.schedule(node.ready_s, lambda node=node: self._woken(node), 0)
            self._wakes.append(now)
        if actions.power_off or actions.wake:
            sched.invalidate()  # the capacity the plan saw changed
        self._due_s = np.inf if actions.next_check_s is None else actions.next_check_s
        if actions.next_check_s is not None and actions.next_check_s not in self._checks:
            self._checks.add(actions.next_check_s)
            self.daemon.loop.schedule(actions.next_check_s)

    def _woken(self, node: _Node) -> None:
        """The end of a wake-up: the node answers and its GPUs may be allocated."""
        if node.state == WAKING:
            self.daemon.alloc.free(("off", node.name))
            node.state, node.free, node.idle_since_s = ON, node.gpus, self.daemon.loop.now
            seen = list(self._seen)
            seen[self._index[node.name]] = -1  # the next step reads its GPUs again
            self._seen, self._dirty = tuple(seen), True
            self.daemon.scheduler.invalidate()

    # -- what the planner sees ----------------------------------------------------------
    def committed(self, now: float) -> list[Commitment]:
        """The GPUs of nodes off or waking, as held until the node could answer."""
        return [
            Commitment(-1 - k, n.gpus, 0.0, now, n.ready_s if n.state == WAKING else now + n.wake_s)
            for k, n in enumerate(self.nodes)
            if n.state != ON
        ]

    def context(self, now: float, running: list[Commitment]) -> dict:
        """The planner's view: running jobs and nodes off as committed, and what keeping
        a server on costs a job that waits (``plan_idle``; by default with right-sizing,
        for at most idle_off_after and a wake-up)."""
        out: dict = {"committed": running + self.committed(now)}
        if self.plan_idle:
            out["idle_w_per_gpu"], out["idle_wait_s"] = self.plan_idle
        return out

    def is_on(self, node: str) -> bool:
        return next(n.state == ON for n in self.nodes if n.name == node)

    # -- accounts -----------------------------------------------------------------------
    def _record(self, now: float) -> None:
        watts = float(self._node_w.sum()) * self.pue
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


def plan_idle(nodes: list[_Node], cluster, right_sizing: bool) -> tuple | None:
    """(idle W per GPU, the longest wait it is counted for) for the planner, or None."""
    wanted = cluster.plan_idle if cluster.plan_idle is not None else right_sizing
    if not wanted or not nodes:
        return None
    per_gpu_w = sum(n.idle_w for n in nodes) / sum(n.gpus for n in nodes) * cluster.pue
    offs = [n.off_after_s + n.wake_s for n in nodes if n.off_after_s is not None]
    return per_gpu_w, (max(offs) if right_sizing and len(offs) == len(nodes) else None)


def node_settings(inputs) -> list[_Node]:
    """Each node's wake-up, idle_off_after and idle draw: its own, else the cluster's."""
    from orchestrator.timeparse import parse_duration_s

    cfg = inputs.cluster
    by_name = {n.name: n for n in cfg.nodes or ()}
    gpu_idle_default = 0.2 * inputs.curve.max_limit_w
    out = []
    for topo in inputs.topology.nodes:
        own = by_name.get(topo.name)

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
