"""Right-sizing (CE-DLA): which nodes to power off now, which to wake for the plan.

One pure decision, taken by the simulator (``orchestrator.sim.hardware.power``) and the live daemon
(``orchestrator.daemon.energy.rightsizing``) alike, from what each knows now:

- each node's state (``on``, ``off``, ``waking``), its GPUs and free GPUs, since when it
  has been idle (every GPU free), its wake-up time and its ``idle_off_after`` (None: it is
  never powered down);
- the plan's next needs: each planned start's time, GPU count and GPU type, if it asks
  for one (queued jobs, including those waiting now: a start at or before ``now_s``);
- optionally, the GPUs running jobs will free and when (``frees``: their expected ends):
  GPUs freed before an off node could answer serve a need as well as waking it would.

Rules:

- **Wake**: the needs due within a node's wake-up time (they start before it could answer
  if woken later) that the GPUs of nodes on or waking (and those running jobs free by
  then) cannot hold wake off nodes of a type they may use, the quickest to wake first
  (then the largest), until they fit.
- **Power off**: a node on, idle for at least its ``idle_off_after``, is powered off when
  the needs due within its wake-up time still fit on the other nodes on or waking (so no
  planned start has to wait for a wake-up because of it); the longest idle first.

Fitting is per node and per GPU type, not in plain GPU counts: a need that asks for a
type fits only on nodes of that type (or of none stated), so an off node of another type
is never woken for it, nor a free node of another type taken as room for it; a need no
wider than a node takes the fullest node that holds it (best fit), a wider one takes
whole free nodes (as ``placement.cluster`` places them; buddy alignment inside a node is
not modelled). Waking stops as soon as the needs due fit on all the nodes up (a need
wider than a node may use a node on and one woken). No clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush

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
    gpu_type: str | None = None  # its GPUs' type (None: not stated, serves any need)

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
    gpu_type: str | None = None  # the type it asks for (None: any)


@dataclass(frozen=True)
class PowerActions:
    power_off: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    # when to decide again at the latest: the earliest time an idle node reaches its
    # idle_off_after, or a later need comes within an off node's wake-up time (None:
    # nothing due); a new plan or a job's end may come earlier
    next_check_s: float | None = None


def right_size(
    nodes: Sequence[NodePower],
    needs: Iterable[Need],
    now_s: float,
    frees: Iterable[tuple[str, float, int]] = (),
) -> PowerActions:
    """The nodes to power off now and those to wake now (see the module's rules).
    ``frees``: (node, when, GPUs) that running jobs free at their expected ends."""
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError("node names must be unique")
    off_nodes = sorted((n for n in nodes if n.state == OFF), key=lambda n: (n.wake_s, -n.gpus))
    idle = [
        n
        for n in nodes
        if n.state == ON
        and n.idle_off_after_s is not None
        and n.idle_since_s is not None
        and n.free_gpus == n.gpus
    ]
    if not off_nodes and not idle:
        return PowerActions()  # nothing to power off or wake (a busy cluster: often)
    needs = sorted((n for n in needs if n.gpus > 0), key=lambda n: n.start_s)
    starts = [n.start_s for n in needs]
    up = {n.name: (n.gpus if n.state == WAKING else n.free_gpus) for n in nodes if n.state != OFF}
    size = {n.name: n.gpus for n in nodes}
    types = {n.name: n.gpu_type for n in nodes}
    freed = sorted((at, name, g) for name, at, g in frees if name in up and g > 0)

    def due(horizon_s: float) -> list[tuple[int, str | None]]:
        return [(n.gpus, n.gpu_type) for n in needs[: bisect_right(starts, now_s + horizon_s)]]

    def room(free: dict[str, int], horizon_s: float) -> dict[str, int]:
        """``free`` with the GPUs running jobs free before ``now + horizon``."""
        out = dict(free)
        for at, name, g in freed:
            if at > now_s + horizon_s:
                break
            if name in out:
                out[name] = min(size[name], out[name] + g)
        return out

    wake: list[str] = []
    k = 0
    while k < len(off_nodes):  # by wake-up time: the starts each could serve in time
        horizon = off_nodes[k].wake_s
        group = [n for n in off_nodes[k:] if n.wake_s == horizon]
        k += len(group)
        unmet = unplaced_typed(due(horizon), room(up, horizon), size, types)
        for node in group:  # the largest first, until the needs due fit on all nodes up
            if not unmet:
                break
            if not any(serves(node.gpu_type, t) for _, t in unmet):
                continue  # of another type than every need left unmet
            wake.append(node.name)
            up[node.name] = node.gpus
            unmet = unplaced_typed(due(horizon), room(up, horizon), size, types)
    power_off: list[str] = []
    still_off = [n for n in off_nodes if n.name not in wake]
    slowest = max((n.wake_s for n in still_off), default=None)
    later = bisect_right(starts, now_s + slowest) if slowest is not None else len(starts)
    next_check = starts[later] - slowest if later < len(starts) else None
    for node in sorted(idle, key=lambda n: (n.idle_since_s, n.name)):
        ripe_s = node.idle_since_s + node.idle_off_after_s
        if ripe_s > now_s:
            next_check = ripe_s if next_check is None else min(next_check, ripe_s)
            continue
        rest = {k: v for k, v in up.items() if k != node.name}
        if not unplaced_typed(due(node.wake_s), room(rest, node.wake_s), size, types):
            power_off.append(node.name)
            up = rest
    return PowerActions(tuple(power_off), tuple(wake), next_check)


def serves(node_type: str | None, need_type: str | None) -> bool:
    """Whether a node of this type may hold a need asking for that one."""
    return need_type is None or node_type is None or node_type == need_type


def unplaced_typed(
    needs: Sequence[tuple[int, str | None]],
    free: dict[str, int],
    size: dict[str, int],
    types: dict[str, str | None],
) -> list[tuple[int, str | None]]:
    """The (width, type) requests that do not fit: those asking for a type first, each
    type on its nodes (and nodes of no stated type), then the rest on what is left."""
    left = {name: f for name, f in free.items() if f > 0}
    out: list[tuple[int, str | None]] = []
    for t in sorted({t for _, t in needs if t is not None}):
        pool = {n: f for n, f in left.items() if serves(types.get(n), t)}
        for n in pool:
            del left[n]
        out += [(w, t) for w in _place([w for w, tt in needs if tt == t], pool, size)]
        left.update(pool)
    return out + [(w, None) for w in _place([w for w, t in needs if t is None], left, size)]


def fits(widths: Iterable[int], free: dict[str, int], size: dict[str, int]) -> bool:
    """Whether requests of these widths all fit on nodes with these free GPUs."""
    return not unplaced(widths, free, size)


def unplaced(widths: Iterable[int], free: dict[str, int], size: dict[str, int]) -> list[int]:
    """The requests (widths) that do not fit on nodes with these free GPUs, placed the
    widest first: one no wider than a node on the fullest node that holds it (the first
    name on ties), a wider one on whole free nodes (the largest first)."""
    return _place(widths, {name: f for name, f in free.items() if f > 0}, size)


def _place(widths: Iterable[int], left: dict[str, int], size: dict[str, int]) -> list[int]:
    """``unplaced`` on ``left`` (free GPUs per node, none zero), taking what it places
    out of ``left``."""
    total = sum(left.values())
    largest = max(size.values(), default=0)
    buckets: dict[int, list[str]] = {}  # free count -> names, as heaps (stale entries skipped)
    for name, f in sorted(left.items()):
        buckets.setdefault(f, []).append(name)
    unmet: list[int] = []
    for width in sorted(widths, reverse=True):
        if width > total:
            unmet.append(width)
            continue
        if width <= largest:
            name = _fullest(buckets, left, width, largest)
            if name is None:
                unmet.append(width)
                continue
            left[name] -= width
            total -= width
            if left[name]:
                heappush(buckets.setdefault(left[name], []), name)
            continue
        whole = sorted((n for n, f in left.items() if f == size[n]), key=lambda n: (-size[n], n))
        chosen, taken = [], 0
        for name in whole:
            if taken >= width:
                break
            chosen.append(name)
            taken += left[name]
        if taken < width:
            unmet.append(width)
            continue
        for name in chosen:
            total -= left.pop(name)
    return unmet


def _fullest(buckets: dict, left: dict[str, int], width: int, largest: int) -> str | None:
    """The node with the fewest free GPUs that still holds ``width`` (taken out of its
    bucket), or None."""
    for count in range(width, largest + 1):
        heap = buckets.get(count)
        while heap:
            name = heappop(heap)
            if left.get(name) == count:
                return name
    return None
