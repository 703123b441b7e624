"""The part of a new job's outlook (``ops.outlook``) that right-sizing decides: a job that
fits on no server that is on now (each too small, of another GPU type, or its GPUs held)
but on one right-sizing powered off waits for that server to wake (``RightSizer.allocate``
wakes it), about the server's configured ``wake``; where every server that could take it
had its wake fail, it waits for the retry after a back-off. From what the store knows:
the servers' power states and GPUs (the node rows) and the GPUs held by jobs now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orchestrator.daemon.energy.powercmd import SHOWN_CHARS, escape
from orchestrator.daemon.energy.rightsizing import RETRY_MAX_S, RETRY_MIN_S, WAKE_FAILED
from orchestrator.planning.devices.rightsizing import ON, WAKING, serves
from orchestrator.timeparse import format_duration


@dataclass(frozen=True)
class Server:
    name: str
    state: str  # on, off, powering off, waking, wake failed
    gpus: int
    free: int  # GPUs no job holds now
    gpu_type: str | None = None
    wake_s: float | None = None  # its configured wake (managed servers)
    since: datetime | None = None  # of its power state
    error: str | None = None  # its last power command's failure


def wake_wait(width: int, gpu_type: str | None, servers: list[Server], now: datetime):
    """What a job of ``width`` GPUs (of ``gpu_type``) waits for, as a dict (``nodes``,
    ``power_state``: waking, off or wake failed, ``wake_s``: about how long, or None) and
    its words (``names``: ``gpu1 or gpu2``, ``span``: `` (about 2m)`` or empty; or
    ``failed``: the failure, escaped and cut); None when a server that is on holds it
    now, or none that is off could (a job across servers, or waiting for GPUs: no word
    here)."""
    if width <= 0:  # a CPU-only job: the first node, no GPUs, no wake (RunningViews)
        return None
    fitting = [s for s in servers if s.gpus >= width and serves(s.gpu_type, gpu_type)]
    if not fitting or any(s.state == ON and s.free >= width for s in fitting):
        return None
    waiting = [s for s in fitting if s.state != ON]
    wakeable = [s for s in waiting if s.state != WAKE_FAILED]
    if wakeable:
        waking = [s for s in wakeable if s.state == WAKING]
        picked = waking or wakeable  # one under way first: it answers soonest
        left = [_left_s(s, now) for s in picked]
        known = [t for t in left if t is not None]
        about = None if len(known) < len(left) or not known else max(known)
        span = "" if about is None or about <= 0 else f" (about {_span(known)})"
        return {"nodes": [s.name for s in picked], "power_state": picked[0].state,
                "wake_s": about, "names": " or ".join(s.name for s in picked),
                "span": span}  # fmt: skip
    if not waiting or any(s.state == ON for s in fitting):
        return None  # nothing to wake, or it starts on a server that is on once it frees
    first = waiting[0]
    error = escape(first.error or "no reason given")[:SHOWN_CHARS]
    names = " or ".join(s.name for s in waiting)
    retry = f"{format_duration(RETRY_MIN_S)} doubling up to {format_duration(RETRY_MAX_S)}"
    return {
        "nodes": [s.name for s in waiting],
        "power_state": WAKE_FAILED,
        "wake_s": None,
        "failed": f"{names}, whose wake failed ({first.name}: {error}); the daemon tries "
        f"again after a back-off ({retry}): gridshift status says when",
    }


def _left_s(s: Server, now: datetime) -> float | None:
    """About how long until ``s`` answers: its wake, less what passed since it was woken."""
    if s.wake_s is None:
        return None
    if s.state == WAKING and s.since is not None:
        return max(0.0, s.wake_s - (now - s.since).total_seconds())
    return s.wake_s


def _span(seconds: list[float]) -> str:
    low, high = min(seconds), max(seconds)
    if round(low) == round(high):
        return format_duration(high)
    return f"{format_duration(low)} to {format_duration(high)}"


def servers(session, settings) -> list[Server]:
    """The servers as the store knows them; none where right-sizing manages no server
    (every server is on: nothing to say)."""
    from sqlmodel import col, select

    from orchestrator.planning.devices.typenames import type_of
    from orchestrator.queue.attempts import ON_GPU, AttemptState, parts_of, values
    from orchestrator.queue.models import Attempt, Node

    managed = {c.name: c for c in settings.nodes if c.power_off and c.power_on}
    if not managed:
        return []
    held: dict[str, int] = {}
    live = values([AttemptState.LAUNCHING, *ON_GPU])
    for att in session.exec(select(Attempt).where(col(Attempt.state).in_(live))):
        for node, gpus in parts_of(att):  # a job across servers: each part's
            held[node] = held.get(node, 0) + len(gpus)
    out = []
    for row in session.exec(select(Node).order_by(Node.name)).all():
        cfg = managed.get(row.name)
        out.append(Server(
            row.name, (row.power_state or ON) if cfg else ON, row.gpus,
            max(0, row.gpus - held.get(row.name, 0)), type_of(row.gpu_model),
            cfg.seconds("wake") if cfg is not None and cfg.wake else None,
            row.power_since,
            row.power_error if cfg else None,
        ))  # fmt: skip
    return out
