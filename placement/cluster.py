"""Placement across nodes: buddy blocks inside a node, network packing across nodes.

- A job that fits in one node goes to the *fullest* node that has a legal buddy block for
  it (best fit): whole nodes stay free for wide jobs, and idle nodes can be powered down.
- A job wider than every node takes whole idle nodes (``ceil(k / node size)`` of them; a
  remainder on the last node is held, so no other job shares those nodes' network), from
  as few racks as possible: the rack with the least idle capacity that still holds it,
  else the racks with the most idle nodes first.
- ``fragmentation(k)``: free GPUs that cannot serve a request of ``k`` (the largest
  waiting); ``idle_nodes()``: nodes with every GPU free.
- ``allocate(key, k, gpu_type=...)`` keeps to nodes of one GPU type (a job wider than a
  node takes whole nodes of that type); ``types()``, ``fits_now(k, gpu_type)``: the
  types a request could start on now, for the caller's choice among them.
- ``make_room(k, movable, gpu_type)``: which of the ``movable`` allocations (jobs that may
  be suspended) to release so that a request of ``k`` (on nodes of ``gpu_type``, when
  given) fits, releasing as few GPUs as it can: the deadline guard's choice of whom to
  suspend.

Pure and in memory: no clock, no I/O. Built for speed (see benchmarks/placement.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from placement.buddy import choose, positions, table
from placement.errors import PlacementError
from placement.topology import ClusterTopology


@dataclass(frozen=True)
class Allocation:
    key: object
    parts: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices) per node

    @property
    def gpus(self) -> int:
        return sum(len(g) for _, g in self.parts)


@lru_cache(maxsize=1 << 20)
def _choose_cached(n: int, free: int, k: int) -> int:
    return choose(n, free, k)


class ClusterAllocator:
    def __init__(self, topology: ClusterTopology) -> None:
        self.topology = topology
        nodes = topology.nodes
        self._names = [n.name for n in nodes]
        self._orders = [n.order for n in nodes]
        self._types = [n.gpu for n in nodes]
        self._size = [n.gpus for n in nodes]
        self._full = [(1 << n.gpus) - 1 for n in nodes]
        self._free = list(self._full)
        self._table = [table(s) if s <= 8 else None for s in self._size]
        self.max_node_gpus = max(self._size, default=0)
        # nodes by free-GPU count, as insertion-ordered dicts (ordered sets)
        self._buckets: list[dict[int, None]] = [{} for _ in range(self.max_node_gpus + 1)]
        for i, s in enumerate(self._size):
            self._buckets[s][i] = None
        self._count = list(self._size)
        self._free_total = sum(self._size)
        self._held: dict[object, list[tuple[int, int]]] = {}
        self._racks: dict[str | None, list[int]] = {}
        for i, n in enumerate(nodes):
            self._racks.setdefault(n.rack, []).append(i)

    # -- queries ------------------------------------------------------------------------
    @property
    def total_gpus(self) -> int:
        return sum(self._size)

    @property
    def free_gpus(self) -> int:
        return self._free_total

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(self._names)

    def gpus_of(self, node: str) -> tuple[int, ...]:
        """The GPU indices of one node (free or not)."""
        return tuple(self._orders[self._names.index(node)])

    def free_on(self, node: str) -> list[int]:
        """The free GPU indices of one node."""
        i = self._names.index(node)
        return [g for p, g in enumerate(self._orders[i]) if self._free[i] >> p & 1]

    def free_per_node(self) -> tuple[int, ...]:
        """Free GPUs of each node, in ``node_names`` order."""
        return tuple(self._count)

    def idle_nodes(self) -> int:
        return sum(1 for i, c in enumerate(self._count) if c == self._size[i])

    def types(self) -> tuple[str | None, ...]:
        """The GPU types of the nodes, each once, in node order."""
        return tuple(dict.fromkeys(self._types))

    def type_of(self, node: str) -> str | None:
        return self._types[self._names.index(node)]

    def fits_now(self, k: int, gpu_type: str | None = None) -> bool:
        """Whether ``allocate(key, k, gpu_type)`` would find GPUs now (nothing changes)."""
        ok = range(len(self._size)) if gpu_type is None else self._of_type(gpu_type)
        if k <= self.max_node_gpus and any(self._pick(i, k) for i in ok):
            return True
        if any(self._size[i] >= k for i in ok):
            return False
        return self._whole_nodes(k, gpu_type) is not None

    def _of_type(self, gpu_type: str | None) -> list[int]:
        return [i for i, t in enumerate(self._types) if t == gpu_type]

    def fragmentation(self, largest_waiting: int) -> int:
        """Free GPUs that cannot serve a request of ``largest_waiting`` GPUs."""
        k = largest_waiting
        if k > self.max_node_gpus:  # only whole idle nodes serve it
            return sum(c for i, c in enumerate(self._count) if c != self._size[i])
        return sum(c for i, c in enumerate(self._count) if c and not self._pick(i, k))

    # -- allocate and free --------------------------------------------------------------
    def allocate(self, key: object, k: int, gpu_type: str | None = None) -> Allocation | None:
        """GPUs for request ``key`` of ``k`` GPUs (on nodes of ``gpu_type`` only, when
        given), or None when it must wait. Raises PlacementError when the cluster (its
        nodes of that type) could never hold it."""
        if key in self._held:
            raise PlacementError(f"allocation {key!r} already exists")
        if k <= 0:
            raise PlacementError(f"a request needs at least one GPU, not {k}")
        sizes = self._size
        if gpu_type is not None:
            sizes = [self._size[i] for i in self._of_type(gpu_type)]
            if sum(sizes) < k:
                raise PlacementError(f"needs {k} {gpu_type} GPUs; the cluster has {sum(sizes)}")
        if k > self.total_gpus:
            raise PlacementError(f"needs {k} GPUs; the cluster has {self.total_gpus}")
        typed = gpu_type is not None
        if k <= self.max_node_gpus:
            for count in range(k, self.max_node_gpus + 1):
                for i in self._buckets[count]:
                    if typed and self._types[i] != gpu_type:
                        continue
                    mask = self._pick(i, k)
                    if mask:
                        self._take(i, mask)
                        self._held[key] = [(i, mask)]
                        return self._allocation(key)
            if any(s >= k for s in sizes):
                return None
        nodes = self._whole_nodes(k, gpu_type)
        if nodes is None:
            return None
        parts = []
        for i in nodes:
            mask = self._free[i]
            self._take(i, mask)
            parts.append((i, mask))
        self._held[key] = parts
        return self._allocation(key)

    def allocate_preferring(
        self, key: object, k: int, later: Iterable[str], **options
    ) -> Allocation | None:
        """``allocate``, keeping off the nodes named in ``later`` (e.g. powered off: a job
        there waits for a wake-up) while it fits elsewhere: packing prefers nodes on."""
        parked = []
        for name in dict.fromkeys(later):
            free = self.free_on(name)
            if free:
                self.hold(("later", key, name), name, free)
                parked.append(("later", key, name))
        try:
            got = self.allocate(key, k, **options)
        finally:
            for held in parked:
                self.free(held)
        return got if got is not None or not parked else self.allocate(key, k, **options)

    def hold(self, key: object, node: str, gpu_indices) -> None:
        """Mark GPUs as held by ``key`` as they are (e.g. running jobs found in the
        database), whether or not they form a buddy block."""
        i = self._names.index(node)
        where = {g: p for p, g in enumerate(self._orders[i])}
        mask = 0
        for g in gpu_indices:
            if g not in where:
                raise PlacementError(f"node {node} has no GPU {g}")
            mask |= 1 << where[g]
        if mask & ~self._free[i]:
            raise PlacementError(f"GPUs {sorted(gpu_indices)} on {node} are already held")
        self._take(i, mask)
        self._held.setdefault(key, []).append((i, mask))

    def free(self, key: object) -> None:
        for i, mask in self._held.pop(key):
            old = self._count[i]
            self._free[i] |= mask
            new = old + mask.bit_count()
            del self._buckets[old][i]
            self._buckets[new][i] = None
            self._count[i] = new
            self._free_total += new - old

    def copy(self) -> ClusterAllocator:
        """A plain allocator holding what this one holds (to try placements on)."""
        out = ClusterAllocator(self.topology)
        for key, parts in self.allocations().items():
            for node, gpus in parts.parts:
                out.hold(key, node, gpus)
        return out

    def room_if_freed(self, key: object, k: int, gpu_type: str | None = None) -> bool:
        """Whether ``k`` GPUs (of ``gpu_type``) that do not fit now would fit once
        ``key``'s GPUs were free; tried on a copy, this allocator is left as it was."""
        if self.allocation(key) is None:
            return False
        probe = self.copy()
        try:
            if probe.allocate(("room probe",), k, gpu_type=gpu_type) is not None:
                return False  # it fits already: GPUs are not what it waits for
            probe.free(key)
            return probe.allocate(("room probe",), k, gpu_type=gpu_type) is not None
        except PlacementError:
            return False

    def allocations(self) -> dict[object, Allocation]:
        return {key: self._allocation(key) for key in self._held}

    def held_masks(self) -> dict[object, tuple[tuple[int, int], ...]]:
        """What each key holds as (node index, mask of buddy-order positions) pairs:
        ``allocations`` without naming the GPUs, for callers that work on masks."""
        return {key: tuple(parts) for key, parts in self._held.items()}

    def allocation(self, key: object) -> Allocation | None:
        """What ``key`` holds (None: nothing)."""
        return self._allocation(key) if key in self._held else None

    def node_of(self, key: object) -> str | None:
        """The node ``key`` holds GPUs on (None: nothing, or several nodes)."""
        parts = self._held.get(key)
        return self._names[parts[0][0]] if parts is not None and len(parts) == 1 else None

    def make_room(
        self, k: int, movable: Iterable[object], gpu_type: str | None = None
    ) -> list[object] | None:
        """Allocations among ``movable`` (keys) whose release lets a request of ``k`` GPUs
        (on nodes of ``gpu_type``, when given) fit, releasing as few GPUs as it can; None
        when releasing them all would not do. Nothing changes: the caller releases them
        (suspends their jobs) and allocates."""
        ok = [gpu_type is None or t == gpu_type for t in self._types]  # nodes it may use
        # in the caller's order (a set's would follow string hashing, which varies per
        # process): ties go to the first, the same in every run
        movable = [key for key in dict.fromkeys(movable) if key in self._held]
        size = {key: sum(m.bit_count() for _, m in self._held[key]) for key in movable}
        if k <= max((s for s, y in zip(self._size, ok, strict=True) if y), default=0):
            # one node: the cheapest set of its movable holders
            on_node: dict[int, list[tuple[int, object, int]]] = {}
            for key in movable:
                for i, mask in self._held[key]:
                    on_node.setdefault(i, []).append((size[key], key, mask))
            best: tuple[int, list[object]] | None = None
            for i, items in on_node.items():
                if self._size[i] < k or not ok[i]:
                    continue
                free, keys, cost = self._free[i], [], 0
                for n, key, mask in sorted(items, key=lambda x: x[0]):
                    if self._fits(i, free, k):
                        break
                    free, cost = free | mask, cost + n
                    keys.append(key)
                if self._fits(i, free, k) and (best is None or cost < best[0]):
                    best = (cost, keys)
            return None if best is None else best[1]
        # wider than a node: whole nodes whose every holder may move, the least used first
        holders: dict[int, set[object]] = {}
        for key, parts in self._held.items():
            for i, _ in parts:
                holders.setdefault(i, set()).add(key)
        clearable = sorted(
            (sum(size[key] for key in holders.get(i, ())), i)
            for i in range(len(self._size))
            if ok[i] and holders.get(i, set()) <= set(movable)
        )
        total, out = 0, set()
        for _, i in clearable:
            if total >= k:
                break
            total += self._size[i]
            out |= holders.get(i, set())
        return sorted(out, key=str) if total >= k else None

    # -- internals ----------------------------------------------------------------------
    def _pick(self, i: int, k: int) -> int:
        if k > self._size[i]:
            return 0
        return self._fits(i, self._free[i], k)

    def _fits(self, i: int, free: int, k: int) -> int:
        """A buddy block of ``k`` GPUs inside the free mask ``free`` of node ``i`` (0: none)."""
        tab = self._table[i]
        if tab is not None:
            return tab[free][k]
        return _choose_cached(self._size[i], free, k)

    def _take(self, i: int, mask: int) -> None:
        old = self._count[i]
        self._free[i] &= ~mask
        new = old - mask.bit_count()
        del self._buckets[old][i]
        self._buckets[new][i] = None
        self._count[i] = new
        self._free_total -= old - new

    def _whole_nodes(self, k: int, gpu_type: str | None = None) -> list[int] | None:
        typed = gpu_type is not None
        idle_by_rack = {
            rack: [
                i
                for i in members
                if self._count[i] == self._size[i] and not (typed and self._types[i] != gpu_type)
            ]
            for rack, members in self._racks.items()
        }
        capacity = {r: sum(self._size[i] for i in nodes) for r, nodes in idle_by_rack.items()}
        if sum(capacity.values()) < k:
            return None
        fitting = [r for r, c in capacity.items() if c >= k]
        if fitting:
            racks = [min(fitting, key=lambda r: (capacity[r], str(r)))]
        else:
            racks = sorted(capacity, key=lambda r: (-capacity[r], str(r)))
        chosen, total = [], 0
        for rack in racks:
            for i in sorted(idle_by_rack[rack], key=lambda i: -self._size[i]):
                if total >= k:
                    break
                chosen.append(i)
                total += self._size[i]
        return chosen

    def _allocation(self, key: object) -> Allocation:
        parts = []
        for i, mask in self._held[key]:
            order = self._orders[i]
            parts.append((self._names[i], tuple(sorted(order[p] for p in positions(mask)))))
        return Allocation(key=key, parts=tuple(parts))
