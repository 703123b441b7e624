"""What the site power limit (``daemon.energy.sitelimit``) reads from the store: each
right-sized server's stored power state, each GPU's power limit range as SSH discovery
last read it (``Gpu.power_min_w``, ``power_max_w``, ``power_default_w``: for a server off
or down at start, whose GPUs cannot be read), and which jobs still wait."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import select

from orchestrator.errors import ConfigError
from orchestrator.queue.db import Database
from orchestrator.queue.models import Gpu, Job, Node
from orchestrator.queue.states import JobState


@dataclass(frozen=True)
class StoredRange:
    low_w: float | None  # its lowest limit (None: never read)
    high_w: float | None  # the higher of its maximum and its default (after a boot)


def stored_power(db: Database | None, nodes: list) -> dict[str, str | None]:
    """Each right-sized server's (of ``nodes``) power state as its row says (a daemon
    left it)."""
    names = [n.name for n in nodes if n.config and n.config.power_off and n.config.power_on]
    if not names or db is None:
        return {}
    with db.read() as session:
        rows = {r.name: r.power_state for r in session.exec(select(Node)).all()}
    return {n: rows.get(n) for n in names}


def stored_ranges(db: Database | None, names: list[str]) -> dict[tuple[str, int], StoredRange]:
    """(node, GPU index) -> the range discovery stored for the GPUs of ``names``."""
    if not names or db is None:
        return {}
    with db.read() as session:
        rows = session.exec(select(Gpu).where(Gpu.node.in_(names))).all()  # type: ignore[attr-defined]
    out = {}
    for g in rows:
        highs = [w for w in (g.power_max_w, g.power_default_w) if w]
        out[(g.node, g.index)] = StoredRange(g.power_min_w or None, max(highs) if highs else None)
    return out


def range_of(ranges: dict, node: str, index: int, fallback_w: float, min_fraction: float,
             sized: bool, type_known: bool = True) -> tuple[float, float]:  # fmt: skip
    """A GPU's (lowest, highest) limits as discovery stored them, else from its type's
    curve (``fallback_w``, ``min_fraction``); never read, a right-sized (``sized``)
    server's is refused, and so is one whose type has no known board limit
    (``type_known`` false: the generic curve's 300 W would undercount an H100's 700 W):
    one line, how to fix it."""
    got = ranges.get((node, index), StoredRange(None, None))
    if got.high_w is None and (sized or not type_known):
        why = "(right-sized) " if sized else ""
        raise ConfigError(
            f"invalid --power-limit: node {node} {why}does not answer and its GPUs' power "
            "limit range was never read"
            + ("" if sized else ", nor is its GPU type's highest limit known")
            + ": power it on once (gridshift discovers its GPUs) before starting the "
            "daemon with a site limit"
        )
    high = got.high_w or fallback_w
    return min(got.low_w or min_fraction * high, high), high


def still_waiting(db: Database, ids: list[int]) -> set[int]:
    """Those of ``ids`` whose jobs still wait (queued or planned)."""
    waiting = (JobState.QUEUED, JobState.PLANNED)
    with db.read() as session:
        rows = session.exec(select(Job.id).where(Job.id.in_(ids), Job.state.in_(waiting)))  # type: ignore[attr-defined]
        return set(rows.all())
