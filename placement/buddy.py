"""Buddy allocation of the GPUs of one node, on a bitmask of buddy-order positions.

Blocks have 1, 2, 4, 8 ... positions and are aligned (a block of size s starts at a
multiple of s), so in buddy order the GPUs of a block share the fastest link the node can
offer that many GPUs. Allocation takes an aligned free block of the request's size from
the smallest maximal free block that has one (best fit: larger free blocks stay whole);
freeing returns the positions, and coalescing is implicit because maximal free blocks are
always read off the mask.

Requests that are not a power of two: k GPUs are served from an aligned block of
2^⌈log2 k⌉ positions; the job takes its first k positions and the rest stay free as
smaller buddy blocks (3 GPUs take positions 0-2 of block 0-3 and leave 3 free). The job
still gets GPUs that share one block's link, and no GPU is held unused. A node whose GPU
count is not a power of two has no block beyond its last GPU.

Choices are precomputed per node size into a table indexed by (free mask, request), so an
allocation is a lookup.
"""

from __future__ import annotations

from functools import cache


def next_pow2(k: int) -> int:
    return 1 << (k - 1).bit_length() if k > 1 else 1


def _maximal_block(n: int, free: int, start: int, size: int) -> int:
    """Size of the largest aligned free block containing [start, start+size)."""
    while True:
        parent = size * 2
        pstart = start - start % parent
        if pstart + parent > n:
            return size
        pmask = ((1 << parent) - 1) << pstart
        if free & pmask != pmask:
            return size
        start, size = pstart, parent


def choose(n: int, free: int, k: int) -> int:
    """The positions (a mask) to give a request of ``k`` GPUs on a node of ``n`` GPUs
    whose free positions are ``free``; 0 when no legal block exists."""
    if k <= 0 or k > n:
        return 0
    s = next_pow2(k)
    block = (1 << s) - 1
    best, best_key = 0, None
    for start in range(0, n - s + 1, s):
        mask = block << start
        if free & mask == mask:
            key = _maximal_block(n, free, start, s)
            if best_key is None or key < best_key:
                best, best_key = start, key
                if key == s:
                    break  # cannot do better than an exact fit
    if best_key is None:
        return 0
    return ((1 << k) - 1) << best


@cache
def table(n: int) -> tuple[tuple[int, ...], ...]:
    """``table(n)[free][k]`` = ``choose(n, free, k)`` for every mask of an n-GPU node.
    Built once per node size (n ≤ 16); larger nodes use ``choose`` directly."""
    return tuple(tuple(choose(n, free, k) for k in range(n + 1)) for free in range(1 << n))


def positions(mask: int) -> list[int]:
    out, i = [], 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out
