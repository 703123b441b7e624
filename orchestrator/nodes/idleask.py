"""Whether an SSH server is idle, as it says itself (right-sizing asks it just before
``power_off``): no GPU in use, no GPU compute process, nobody logged in. Any doubt (a
value nvidia-smi did not give, a command that fails) counts as busy.

Whether discovery last saw it idle (``discovered_idle``): on a shared SSH server, GPUs may
run work gridshift did not start (a user's own training); right-sizing powers a server
off only when its latest discovery is newer than the start of its idle stretch and shows
no use on any GPU, and, just before ``power_off``, the server itself says so.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from executors.errors import ExecutorError, GpuControlError
from executors.gpu.smi import gpu_status
from orchestrator.nodes.ssh import smi_runner

if TYPE_CHECKING:
    from orchestrator.queue.db import Database

BUSY_MEMORY_MB = 100  # more GPU memory in use than this: something runs there


def gpu_use(memory_used_mb: int | None, utilization_pct: float | None) -> str | None:
    """Why a GPU counts as in use (None: it is not)."""
    if memory_used_mb is None or utilization_pct is None:
        return "GPU use unknown"
    if memory_used_mb > BUSY_MEMORY_MB or utilization_pct > 0:
        return f"GPU in use ({memory_used_mb} MB, {utilization_pct:g} %)"
    return None


def asked_idle(link) -> str | None:
    """Asks the server itself, just before powering it off: None when idle, else why not
    (a failure to ask is a reason too)."""
    try:
        for g in gpu_status(smi_runner(link)):
            if (why := gpu_use(g.memory_used_mb, g.utilization_pct)) is not None:
                return f"GPU {g.index}: {why}"
        apps = link.text(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
        if apps.strip():
            return f"GPU compute processes: {' '.join(apps.split())[:80]}"
        users = link.text(["who"])
        if users.strip():
            return f"logged in: {' '.join(u.split()[0] for u in users.splitlines() if u)[:80]}"
    except (ExecutorError, GpuControlError) as exc:
        return f"cannot ask it: {exc}"
    return None


def boot_id(link) -> str | None:
    """The server's ``/proc/sys/kernel/random/boot_id`` (a new one at each boot; cut to
    64 printable characters), or None when it does not answer."""
    try:
        got = link.text(["cat", "/proc/sys/kernel/random/boot_id"])
    except (ExecutorError, GpuControlError):
        return None
    return "".join(c for c in got.strip() if c.isprintable())[:64]


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
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
