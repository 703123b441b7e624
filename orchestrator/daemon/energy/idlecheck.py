"""Whether a managed SSH server is idle, beyond what gridshift holds there.

On a shared SSH server, GPUs may run work gridshift did not start (a user's own
training): right-sizing powers a server off only when its latest discovery is newer than
the start of its idle stretch and shows no use on any GPU (``discovered_idle``), and,
just before ``power_off``, the server itself says so over SSH (``nodes.idleask``): no GPU
compute process, no GPU memory in use or utilisation, nobody logged in. Any doubt (no
discovery, a value nvidia-smi did not give, a command that fails) counts as busy.
"""

from __future__ import annotations

from datetime import datetime

from orchestrator.nodes.idleask import gpu_use
from orchestrator.queue.db import Database


def discovered_idle(db: Database, names: list[str]) -> dict[str, float | None]:
    """Per server: when its latest discovery saw it with no GPU in use (epoch seconds);
    None where it never did, or saw one in use (or could not say)."""
    from sqlmodel import select

    from orchestrator.queue.models import Gpu, Node

    out: dict[str, float | None] = dict.fromkeys(names)
    with db.read() as session:
        for name in names:
            node = session.get(Node, name)
            if node is None or node.last_seen is None or not node.reachable:
                continue
            gpus = session.exec(select(Gpu).where(Gpu.node == name)).all()
            if gpus and all(gpu_use(g.memory_used_mb, g.utilization_pct) is None for g in gpus):
                out[name] = _epoch(node.last_seen)
    return out


def _epoch(at: datetime) -> float:
    from datetime import UTC

    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
