"""One power cap per GPU, also where two attempts share it (co-location).

A GPU's limit is one board setting: where two attempts hold it, the cap in force is the
lowest of theirs (an uncapped attempt counts as 1.0: a capped partner's plan still
holds), recomputed whenever one of them launches, ends, resumes and when the daemon
starts (``reconcile``). A GPU is restored to its default only once no attempt holds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import col, select

from orchestrator.queue.attempts import HOLDING, values
from orchestrator.queue.models import Attempt


def combine(caps: Iterable[float | None]) -> float | None:
    """The cap in force for the attempts' ``caps`` on one GPU (None: uncapped)."""
    capped = [c for c in caps if c is not None and c < 1.0]
    return min(capped) if capped else None


def caps_on(session, node: str, gpus: list[int], without: int | None = None) -> dict:
    """GPU -> the caps of the attempts holding it on ``node`` (less ``without``)."""
    rows = session.exec(
        select(Attempt).where(Attempt.node == node, col(Attempt.state).in_(values(HOLDING)))
    ).all()
    out: dict[int, list[float | None]] = {g: [] for g in gpus}
    for att in rows:
        if att.id == without or att.parts:
            continue
        for g in att.gpu_ids or ():
            if g in out:
                out[g].append(att.cap)
    return out


def settle(caps, db, node: str, gpus: list[int], without: int | None = None,
           plus: tuple = ()) -> None:  # fmt: skip
    """Each of ``gpus`` to the cap its holders (less ``without``, plus the caps ``plus``)
    agree on; to its default where nobody holds it."""
    if caps is None or not gpus or not caps.enabled_on(node):
        return
    with db.read() as session:
        on = caps_on(session, node, gpus, without)
    for gpu, held in on.items():
        held = [*held, *plus]
        if held:
            caps.apply(node, [gpu], combine(held))
        else:
            caps.restore(node, [gpu])


def held_caps(rows: list[Attempt]) -> dict[str, dict[int, float | None]]:
    """Node -> GPU -> the cap in force, over the attempts on GPUs (``reconcile``)."""
    held: dict[str, dict[int, list[float | None]]] = {}
    for att in rows:
        for g in att.gpu_ids or ():
            held.setdefault(att.node, {}).setdefault(g, []).append(att.cap)
    return {n: {g: combine(c) for g, c in gs.items()} for n, gs in held.items()}
