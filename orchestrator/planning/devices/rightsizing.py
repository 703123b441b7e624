"""Right-sizing (CE-DLA): which nodes to power off now, which to wake for the plan.

One pure decision, taken by the simulator (``orchestrator.sim.power``) and the live daemon
(``orchestrator.daemon.energy.rightsizing``) alike, from what each knows now:

- each node's state (``on``, ``off``, ``waking``), its GPUs and free GPUs, since when it
  has been idle (every GPU free), its wake-up time and its ``idle_off_after`` (None: it is
  never powered down);
- the plan's next needs: each planned start's time and GPU count (queued jobs, including
  those waiting now: a start at or before ``now_s``).

Rules:

- **Wake**: the needs due within a node's wake-up time (they start before it could answer
  if woken later) that the GPUs of nodes on or waking cannot hold wake off nodes, the
  quickest to wake first (then the largest), until they fit.
- **Power off**: a node on, idle for at least its ``idle_off_after``, is powered off when
  the needs due within its wake-up time still fit on the other nodes on or waking (so no
  planned start has to wait for a wake-up because of it); the longest idle first.

Fitting is per node, not in plain GPU counts: a need no wider than a node takes the
fullest node that holds it (best fit), a wider one takes whole free nodes (as
``placement.cluster`` places them; buddy alignment inside a node is not modelled). No
clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ON, OFF, WAKING = "on", "off", "waking"
STATES = (ON, OFF, WAKING)


@dataclass(frozen=True)
class NodePower:
    """One node as right-sizing sees it."""

    name: str
    gpus: int  # GPUs on the node
    free_gpus: int  # GPUs no job holds (all of them when off or waking)
    state: str = ON  # on | off | waking
    idle_since_s: float | None = None  # since when every GPU is free (None: one is held)
    wake_s: float = 300.0  # from power_on to usable
    idle_off_after_s: float | None = None  # None: never powered off

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"node {self.name}: state must be one of {STATES}, not {self.state}")
        if not 0 <= self.free_gpus <= self.gpus:
            raise ValueError(f"node {self.name}: {self.free_gpus} free of {self.gpus} GPUs")
        if self.wake_s < 0 or (self.idle_off_after_s is not None and self.idle_off_after_s < 0):
            raise ValueError(f"node {self.name}: wake and idle times must not be negative")


@dataclass(frozen=True)
class Need:
    """A planned start: ``gpus`` GPUs from ``start_s`` (at or before now: waiting now)."""

    start_s: float
    gpus: int
    job: object = None  # the caller's id, for its own use


@dataclass(frozen=True)
class PowerActions:
    power_off: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    # when to decide again at the latest: the earliest time an idle node reaches its
    # idle_off_after, or a later need comes within an off node's wake-up time (None:
    # nothing due); a new plan or a job's end may come earlier
    next_check_s: float | None = None


def right_size(nodes: Sequence[NodePower], needs: Iterable[Need], now_s: float) -> PowerActions:
    """The nodes to power off now and those to wake now (see the module's rules)."""
    needs = sorted((n for n in needs if n.gpus > 0), key=lambda n: n.start_s)
    by_name = {n.name: n for n in nodes}
    if len(by_name) != len(nodes):
        raise ValueError("node names must be unique")
    up = {n.name: (n.gpus if n.state == WAKING else n.free_gpus) for n in nodes if n.state != OFF}
    size = {n.name: n.gpus for n in nodes}

    def due(horizon_s: float) -> list[int]:
        return [n.gpus for n in needs if n.start_s <= now_s + horizon_s]

    wake: list[str] = []
    off_nodes = sorted((n for n in nodes if n.state == OFF), key=lambda n: (n.wake_s, -n.gpus))
    for node in off_nodes:
        if fits(due(node.wake_s), up, size):
            continue
        wake.append(node.name)
        up[node.name] = node.gpus
    power_off: list[str] = []
    still_off = [n for n in off_nodes if n.name not in wake]
    slowest = max((n.wake_s for n in still_off), default=None)
    later = [n.start_s for n in needs if slowest is not None and n.start_s > now_s + slowest]
    next_check = later[0] - slowest if later else None
    idle = [
        n
        for n in nodes
        if n.state == ON
        and n.idle_off_after_s is not None
        and n.idle_since_s is not None
        and n.free_gpus == n.gpus
    ]
    for node in sorted(idle, key=lambda n: (n.idle_since_s, n.name)):
        ripe_s = node.idle_since_s + node.idle_off_after_s
        if ripe_s > now_s:
            next_check = ripe_s if next_check is None else min(next_check, ripe_s)
            continue
        rest = {k: v for k, v in up.items() if k != node.name}
        if fits(due(node.wake_s), rest, size):
            power_off.append(node.name)
            up = rest
    return PowerActions(tuple(power_off), tuple(wake), next_check)


def fits(widths: Iterable[int], free: dict[str, int], size: dict[str, int]) -> bool:
    """Whether requests of these widths all fit on nodes with these free GPUs: the widest
    first, each no wider than a node on the fullest node that holds it, each wider one on
    whole free nodes."""
    free = dict(free)
    largest = max(size.values(), default=0)
    for width in sorted(widths, reverse=True):
        if width <= largest:
            holds = [(f, name) for name, f in free.items() if f >= width]
            if not holds:
                return False
            f, name = min(holds)
            free[name] = f - width
            continue
        whole = sorted((name for name, f in free.items() if f == size[name] and f), key=size.get)
        whole.reverse()
        taken = 0
        for name in whole:
            if taken >= width:
                break
            taken += free.pop(name)
        if taken < width:
            return False
    return True
