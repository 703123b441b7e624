"""The cluster's GPUs over time, for conservative backfill's reservations: per node, a
bitmask of buddy-order positions (as ``placement.buddy``) held by the running jobs until
their expected ends, and by the reservations made so far over their spans.

``Profile.reserve(width, run_s, reservations, gpu_type)`` finds the earliest time from now
at which ``width`` GPUs (on nodes of ``gpu_type``, when given) are free for ``run_s``
(None: for ever) of every holder and reservation, and which: a buddy block on the fullest
node that has one (as the allocator's best fit), or, for a job wider than every node (of
that type), whole idle nodes, largest first. A reservation holds
the whole buddy block its job is served from (a 3-GPU job needs an aligned block of 4).
Masks, not an allocator per candidate time: a reservation is a sweep over the holders'
ends. Pure and in memory.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from placement.buddy import choose, next_pow2, table
from placement.topology import ClusterTopology

Masks = dict[int, int]  # node index -> positions


@dataclass(slots=True)
class Reservation:
    start_s: float
    end_s: float | None  # None: never given back, as far as anyone knows
    masks: Masks
    width: int = 0  # what it was asked for: GPUs, and for how long (None: for ever)
    run_s: float | None = None
    packed: int = 0  # its masks on one integer (``Profile.pack``)
    gpu_type: str | None = None  # kept to nodes of this type (None: any)

    def overlaps(self, masks: Masks, now_s: float, until_s: float | None) -> bool:
        """Would holding ``masks`` from now until ``until_s`` (None: for ever) take any of
        this reservation's GPUs before it gives them back?"""
        if not any(self.masks.get(i, 0) & m for i, m in masks.items()):
            return False
        return (until_s is None or until_s > self.start_s) and (
            self.end_s is None or self.end_s > now_s
        )


class Profile:
    def __init__(self, topology: ClusterTopology, now_s: float) -> None:
        self.now_s = now_s
        nodes = topology.nodes
        self.sizes = [n.gpus for n in nodes]
        self.types = [n.gpu for n in nodes]
        self.full = [(1 << n.gpus) - 1 for n in nodes]
        self.where = {
            n.name: (i, {g: p for p, g in enumerate(n.order)}) for i, n in enumerate(nodes)
        }
        self.max_node = max(self.sizes, default=0)
        self.tables = [table(n) if n <= 8 else None for n in self.sizes]
        # the whole cluster on one integer: node i at bit i * stride, so that an aligned
        # block of up to ``stride`` positions never straddles two nodes
        self.stride = next_pow2(self.max_node)
        self.full_packed = self.pack(dict(enumerate(self.full)))
        self.holders: list[tuple[float, int]] = []  # (end, packed); inf: unknown
        self._steps: tuple[list[float], list[int]] | None = None  # see ``steps``
        self._first: dict[int, int | None] = {}  # see ``first_step``

    def pack(self, masks: Masks) -> int:
        out, stride = 0, self.stride
        for i, m in masks.items():
            out |= m << i * stride
        return out

    def unpack(self, packed: int) -> list[int]:
        stride = self.stride
        one = (1 << stride) - 1
        return [packed >> i * stride & one for i in range(len(self.sizes))]

    def _block_free(self, width: int, free: int) -> bool:
        """Has some node an aligned free block of ``next_pow2(width)`` positions?
        (``width`` ≤ the largest node: exactly when ``_place`` finds one.)"""
        size, step = next_pow2(width), 1
        while step < size:  # bit j stays set when positions j .. j + 2 * step - 1 are free
            free &= free >> step
            step *= 2
        return bool(free & _aligned(size, len(self.sizes) * self.stride))

    def masks(self, parts: Iterable[tuple[str, Iterable[int]]]) -> Masks:
        """An allocation's (node, GPU ids) parts as masks."""
        out: Masks = {}
        for node, gpus in parts:
            i, pos = self.where[node]
            for g in gpus:
                out[i] = out.get(i, 0) | 1 << pos[g]
        return out

    def hold(self, masks: Masks, end_s: float | None) -> None:
        """GPUs held from now until ``end_s`` (None: unknown)."""
        self.hold_packed(self.pack(masks), end_s)

    def hold_packed(self, packed: int, end_s: float | None) -> None:
        """``hold`` for masks already on one integer (``pack``)."""
        self.holders.append((float("inf") if end_s is None else end_s, packed))
        self._steps, self._first = None, {}

    def steps(self) -> tuple[list[float], list[int]]:
        """When what the holders hold changes, from now (the first), and what they hold
        from each of those times on (packed); kept until the next ``hold``."""
        if self._steps is None:
            now, busy = self.now_s, 0
            for _, packed in self.holders:
                busy |= packed
            times, held = [now], [busy]
            for end, packed in sorted(self.holders, key=lambda h: h[0]):
                if end == float("inf"):
                    break
                busy &= ~packed
                if end <= now:
                    held[0] = busy
                elif end == times[-1]:
                    held[-1] = busy
                else:
                    times.append(end)
                    held.append(busy)
            self._steps = times, held
        return self._steps

    def first_step(self, width: int) -> int | None:
        """The first of ``steps`` from which the holders alone leave room for ``width``
        GPUs (an aligned block on a node; wider than every node: as many free GPUs, a bound);
        None: never. Holders only give GPUs back, so none before it fits, whatever the
        reservations."""
        if width not in self._first:
            _, held = self.steps()
            low, high, full = 0, len(held), self.full_packed
            while low < high:
                mid = (low + high) // 2
                free = full & ~held[mid]
                if (
                    free.bit_count() >= width
                    if width > self.max_node
                    else self._block_free(width, free)
                ):
                    high = mid
                else:
                    low = mid + 1
            self._first[width] = low if low < len(held) else None
        return self._first[width]

    def reserve(
        self, width: int, run_s: float | None, reservations: list[Reservation],
        gpu_type: str | None = None,
    ) -> Reservation | None:  # fmt: skip
        """``gpu_type``: only on nodes of that type (a request wider than that type's
        nodes together holds nothing: it never starts here)."""
        now = self.now_s
        typed = [i for i, t in enumerate(self.types) if t == gpu_type]
        if width <= 0 or (gpu_type is not None and sum(self.sizes[i] for i in typed) < width):
            return Reservation(now, None if run_s is None else now + run_s, {}, width, run_s)
        step_s, held = self.steps()
        # the profile only fills up as a pass goes on, so a narrower (or as wide) request
        # of the same type for no longer that found its earliest time at t_A means none
        # before t_A fits
        from_s = now
        max_node = self.max_node if gpu_type is None else max(self.sizes[i] for i in typed)
        wide = width > max_node
        for r in reservations:
            if (
                r.width > 0
                and r.width <= width
                and r.gpu_type == gpu_type
                and (r.width > max_node) == wide
                and (run_s is None or (r.run_s is not None and r.run_s <= run_s))
                and r.start_s > from_s
            ):
                from_s = r.start_s
        other = 0  # positions of other types: held for ever, as far as this request goes
        if gpu_type is not None:
            other = self.full_packed & ~self.pack({i: self.full[i] for i in typed})
        else:
            first = self.first_step(width)
            if first is None:
                return None
            from_s = max(from_s, step_s[first])
        # candidate times from ``from_s``: the holders' steps and the reservations' ends
        ends = sorted({r.end_s for r in reservations if r.end_s is not None and r.end_s >= from_s})
        full, inf = self.full_packed, float("inf")
        spans = [  # the reservations not given back before from_s: (start, end, packed)
            (r.start_s, inf if r.end_s is None else r.end_s, r.packed)
            for r in reservations
            if r.end_s is None or r.end_s > from_s
        ]
        i, j = bisect_left(step_s, from_s), 0
        while i < len(step_s) or j < len(ends):
            a = step_s[i] if i < len(step_s) else inf
            b = ends[j] if j < len(ends) else inf
            t = min(a, b)
            i, j = i + (a == t), j + (b == t)
            window = held[bisect_right(step_s, t) - 1] | other  # held at t
            end = inf if run_s is None else t + run_s
            for start, stop, packed in spans:
                if start < end and stop > t:
                    window |= packed
            if wide:
                if (full & ~window).bit_count() < width:
                    continue  # too few free GPUs, idle nodes or not
                masks = self._place(width, self.unpack(window), whole=True)
            else:
                masks = self._place_one(width, full & ~window)
            if masks is not None:
                end_s = None if run_s is None else end
                packed = self.pack(masks)
                return Reservation(t, end_s, masks, width, run_s, packed, gpu_type)
        return None

    def _place_one(self, width: int, free: int) -> Masks | None:
        """``_place`` for a request that fits one node, on the packed free positions: the
        fullest node with an aligned free block (the first such, on ties), that block."""
        size, step, starts = next_pow2(width), 1, free
        while step < size:  # bit j stays set when positions j .. j + 2 * step - 1 are free
            starts &= starts >> step
            step *= 2
        stride = self.stride
        starts &= _aligned(size, len(self.sizes) * stride)
        one, best = (1 << stride) - 1, None
        while starts:
            i = ((starts & -starts).bit_length() - 1) // stride
            starts &= ~(one << i * stride)  # the next candidate is on a later node
            f, n = free >> i * stride & one, self.sizes[i]
            if best is not None and f.bit_count() >= best[0]:
                continue
            tab = self.tables[i]
            mask = tab[f][width] if tab is not None else choose(n, f, width)
            start = (mask & -mask).bit_length() - 1
            best = (f.bit_count(), i, ((1 << size) - 1) << start & self.full[i])
        return None if best is None else {best[1]: best[2]}

    def _place(self, width: int, busy: list[int], whole: bool = False) -> Masks | None:
        free = [f & ~b for f, b in zip(self.full, busy, strict=True)]
        if width <= self.max_node and not whole:  # the fullest node with a block
            best = None
            for i, f in enumerate(free):
                n = self.sizes[i]
                if n < width:
                    continue
                tab = self.tables[i]
                mask = tab[f][width] if tab is not None else choose(n, f, width)
                if mask and (best is None or f.bit_count() < best[0]):
                    # the whole buddy block it is served from must stay free for it
                    start = (mask & -mask).bit_length() - 1
                    block = ((1 << next_pow2(width)) - 1) << start & self.full[i]
                    best = (f.bit_count(), i, block)
            if best is not None or any(s >= width for s in self.sizes):
                return None if best is None else {best[1]: best[2]}
        idle = sorted(
            (i for i, f in enumerate(free) if f == self.full[i]), key=lambda i: -self.sizes[i]
        )
        out, total = {}, 0
        for i in idle:
            if total >= width:
                break
            out[i], total = self.full[i], total + self.sizes[i]
        return out if total >= width else None


@cache
def _aligned(size: int, bits: int) -> int:
    """Bits at every multiple of ``size`` below ``bits``."""
    out = 0
    for j in range(0, bits, size):
        out |= 1 << j
    return out
