"""Capacity by GPU type for a planner that plans on one pool of GPUs (``Problem``).

On a cluster of one type the pool is the whole story. On a mixed one it is not: a job
that asked for no type runs on one type when some type has GPUs enough for it
(``choose_type`` among those with room), so a job wider than a small type's GPUs can only
run on the larger types, and a job wider than every type's GPUs takes whole nodes, the
largest first. The pool alone would plan an 8-GPU job now on 8 V100s and 4 K80s with
5 V100s free and 3 K80s idle: a start the cluster cannot give it. The plan of everything
after it then rests on that start, and nothing starts while it waits.

The types' GPU counts, largest first, cut the widths into *tiers*: the jobs wider than
the next count need the types with at least this count (nested sets: a tier's types are
also in every later tier's). Each tier has its own free GPUs per slot: its types' GPUs,
less what runs on them (a running job's type is known), less what the plan puts there (a
job of width k takes min(k, the tier's GPUs) of every tier whose floor it is wider than;
a narrower one may go to any type and takes from the pool only). An option fits when the
pool and every tier it needs have room: a necessary condition, no more (types are per
node, and which type a narrow job gets is the dispatcher's choice when it starts).

``Tiers.room_for(widest, pool, tiers)`` folds the tiers into one free vector as a job
whose widest option is ``widest`` sees it (``Problem.room_for(j, ...)``), so the pool's
code (``Problem.fits``, ``cheapest_pieces``) takes it unchanged; a narrower option of an
elastic job is held to the same tiers (on the safe side). With one type there are no
tiers and the pool comes back as it is.
"""

from __future__ import annotations

import itertools

import numpy as np


def type_tiers(type_gpus: dict | None) -> list[tuple[int, frozenset, int]]:
    """Per tier, largest GPU count first: (the width a job must exceed to need it, its
    types, their GPUs). None, or one type with GPUs (a CPU-only node's holds nobody): none."""
    type_gpus = {t: n for t, n in (type_gpus or {}).items() if n > 0}
    if len(type_gpus) < 2:
        return []
    counts = sorted(set(type_gpus.values()), reverse=True)
    out = []
    for count, below in itertools.pairwise(counts):
        types = frozenset(t for t, n in type_gpus.items() if n >= count)
        out.append((below, types, sum(type_gpus[t] for t in types)))
    return out


class Tiers:
    def __init__(self, type_gpus: dict | None, slots: int) -> None:
        self.tiers = type_tiers(type_gpus)
        self.free = np.array([np.full(slots, float(cap)) for _, _, cap in self.tiers])
        self.free = self.free.reshape(len(self.tiers), slots)

    def __bool__(self) -> bool:
        return bool(self.tiers)

    def need(self, gpus: int, gpu_type=None) -> list[float]:
        """GPUs each tier gives a job of ``gpus`` (on ``gpu_type`` when known, else by
        its width)."""
        if gpu_type is not None:
            return [float(gpus) if gpu_type in types else 0.0 for _, types, _ in self.tiers]
        return [float(min(gpus, cap)) if gpus > floor else 0.0 for floor, _, cap in self.tiers]

    def take(self, tiers: np.ndarray, gpus: int, a: int, b: int, gpu_type=None) -> None:
        """Take ``gpus`` (negative: give them back) from slots ``a:b`` of ``tiers``."""
        sign = 1.0 if gpus >= 0 else -1.0
        for i, n in enumerate(self.need(abs(gpus), gpu_type)):
            if n:
                tiers[i, a:b] -= sign * n

    def room_for(self, widest: int, pool: np.ndarray, tiers: np.ndarray) -> np.ndarray:
        """The free GPUs per slot a job whose widest option is ``widest`` may count on:
        ``pool``, less where a tier it needs has less room (``pool`` itself when none)."""
        out = pool
        for (floor, _, cap), row in zip(self.tiers, tiers, strict=True):
            if widest > floor:  # row ≥ min(widest, cap) ⟺ row + widest − min(…) ≥ widest
                out = np.minimum(out, row + (widest - min(widest, cap)))
        return out
