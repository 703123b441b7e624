"""The cluster's GPUs over time, for conservative backfill's reservations: per node, a
bitmask of buddy-order positions (as ``placement.buddy``) held by the running jobs until
their expected ends, and by the reservations made so far over their spans.

``Profile.reserve(width, run_s, reservations)`` finds the earliest time from now at which
``width`` GPUs are free for ``run_s`` (None: for ever) of every holder and reservation,
and which: a buddy block on the fullest node that has one (as the allocator's best fit),
or, for a job wider than every node, whole idle nodes, largest first. A reservation holds
the whole buddy block its job is served from (a 3-GPU job needs an aligned block of 4).
Masks, not an allocator per candidate time: a reservation is a sweep over the holders'
ends. Pure and in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from placement.buddy import choose, next_pow2, table
from placement.topology import ClusterTopology

Masks = dict[int, int]  # node index -> positions


@dataclass(slots=True)
class Reservation:
    start_s: float
    end_s: float | None  # None: never given back, as far as anyone knows
    masks: Masks

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
        self.full = [(1 << n.gpus) - 1 for n in nodes]
        self.where = {
            n.name: (i, {g: p for p, g in enumerate(n.order)}) for i, n in enumerate(nodes)
        }
        self.max_node = max(self.sizes, default=0)
        self.holders: list[tuple[float, Masks]] = []  # (end, masks); inf: unknown

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
        self.holders.append((float("inf") if end_s is None else end_s, masks))

    def reserve(
        self, width: int, run_s: float | None, reservations: list[Reservation]
    ) -> Reservation | None:
        now = self.now_s
        if width <= 0:
            return Reservation(now, None if run_s is None else now + run_s, {})
        holders = sorted(self.holders, key=lambda h: h[0])
        busy = [0] * len(self.sizes)
        for _, masks in holders:
            for i, m in masks.items():
                busy[i] |= m
        times = {now} | {e for e, _ in holders if now < e < float("inf")}
        times |= {r.end_s for r in reservations if r.end_s is not None and r.end_s > now}
        k = 0
        for t in sorted(times):
            while k < len(holders) and holders[k][0] <= t:  # given back by then
                for i, m in holders[k][1].items():
                    busy[i] &= ~m
                k += 1
            end = None if run_s is None else t + run_s
            window = list(busy)
            for r in reservations:
                if (end is None or r.start_s < end) and (r.end_s is None or r.end_s > t):
                    for i, m in r.masks.items():
                        window[i] |= m
            masks = self._place(width, window)
            if masks is not None:
                return Reservation(t, end, masks)
        return None

    def _place(self, width: int, busy: list[int]) -> Masks | None:
        free = [f & ~b for f, b in zip(self.full, busy, strict=True)]
        if width <= self.max_node:  # the fullest node with a block
            best = None
            for i, f in enumerate(free):
                n = self.sizes[i]
                if n < width:
                    continue
                mask = table(n)[f][width] if n <= 8 else choose(n, f, width)
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
