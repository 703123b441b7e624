"""A job wider than one server, on whole SSH servers (network packing holds them all),
placed the way right-sizing places every job: through its placer, so a part on a server
that is off wakes that server and the job waits (it never launches onto a server off)."""

from __future__ import annotations

from collections.abc import Callable

Placer = Callable[[object, int, object], object]  # (key, width, gpu_type) -> Allocation | None


def across_servers(alloc, ssh: set[str], key: tuple, held, width: int, gpu_type,
                   place: Placer | None = None):  # fmt: skip
    """``(node, gpus, parts)`` for ``key`` on SSH servers only (packed again there when
    ``held`` has a part elsewhere), the width spread as evenly as their sizes allow, each
    part on its server's first GPUs; None while it must wait."""
    if any(node not in ssh for node, _ in held):  # packed again, on SSH servers alone
        others = ("not ssh", key[1])
        alloc.free(key)
        hidden = [n for n in alloc.node_names if n not in ssh and alloc.free_on(n)]
        for name in hidden:
            alloc.hold(others, name, alloc.free_on(name))
        try:
            if place is not None:  # right-sizing: servers on first, an off one woken
                allocation = place(key, width, gpu_type)
            else:
                allocation = alloc.allocate(key, width, gpu_type=gpu_type)
        finally:
            if hidden:
                alloc.free(others)
        if allocation is None:
            return None  # it waits for enough idle SSH servers (or for one to wake)
        held = allocation.parts
    counts = spread(width, [len(gpus) for _, gpus in held])
    parts = [(node, list(gpus[:n])) for (node, gpus), n in zip(held, counts, strict=True)]
    return (parts[0][0], parts[0][1], parts)


def spread(width: int, sizes: list[int]) -> list[int]:
    """GPUs of each server for a job of ``width`` GPUs on servers of ``sizes`` GPUs (at
    least ``width`` in all): as even as they allow, a small server all it has."""
    out, left = [0] * len(sizes), width
    for pos, i in enumerate(sorted(range(len(sizes)), key=lambda i: sizes[i])):
        out[i] = min(sizes[i], -(-left // (len(sizes) - pos)))
        left -= out[i]
    return out
