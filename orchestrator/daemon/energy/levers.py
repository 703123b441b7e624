"""The daemon's energy levers, wired into its pass: right-sizing (``rightsizing``) and the
idle-energy meter (``idle``). ``Daemon`` builds one ``Levers`` and calls ``after_pass``
as a step after the launches, ``start`` once it serves and ``stop`` when it stops."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from orchestrator.daemon.contain import OncePerReason
from orchestrator.daemon.energy.idle import IdleMeter
from orchestrator.daemon.energy.powercmd import SHOWN_CHARS, escape
from orchestrator.daemon.energy.rightsizing import WAKE_FAILED, RightSizer
from orchestrator.errors import GridshiftError
from orchestrator.nodes.wakenotes import WakeNotes
from orchestrator.planning.devices.rightsizing import OFF, ON, WAKING

log = logging.getLogger(__name__)


@dataclass
class Levers:
    power: RightSizer | None
    idle: IdleMeter
    _faults: OncePerReason = field(
        default_factory=lambda: OncePerReason(log, "energy levers", "the daemon goes on")
    )
    _notes: WakeNotes = field(default_factory=WakeNotes)
    # each its own: a step that works must not re-arm another's log (once per reason)
    _reading_notes: OncePerReason = field(
        default_factory=lambda: OncePerReason(log, "wake notes", "no note this pass")
    )
    _writing_notes: OncePerReason = field(
        default_factory=lambda: OncePerReason(log, "writing wake notes", "none changes")
    )
    _plan_waits: dict = field(default_factory=dict)  # server -> the plan's jobs due on it

    @classmethod
    def build(cls, settings, nodes: list, links: dict, db, carbon=None, caps=None) -> Levers:
        power = RightSizer.build(settings.nodes, links, db)

        def off(name: str) -> bool:
            p = power.nodes.get(name) if power is not None else None
            return p is not None and p.state in (OFF, WAKE_FAILED)

        idle = IdleMeter(
            db, {n.name: n.executor for n in nodes}, {c.name: c for c in settings.nodes},
            settings.daemon.pue, carbon=carbon or (lambda _a, _b: None), off=off,
            local_ctl=next((caps.by_node[n.name].ctl for n in nodes if n.executor == "local"
                            and caps is not None and n.name in caps.by_node), None),
        )  # fmt: skip
        return cls(power, idle)

    def idle_cost(self, nodes: list) -> tuple[float, float | None] | None:
        """With right-sizing, what the planner counts for keeping a server on while a job
        waits (as the simulator does, ``sim.power.plan_idle``): the cluster's idle draw
        per GPU (every GPU idle, servers on, times the PUE) and, when every server may be
        powered off, the longest idle_off_after plus wake (what a wait costs at most)."""
        counted = [n for n in nodes if n.executor in ("local", "ssh") and n.gpu_count]
        if self.power is None or not counted:
            return None
        watts = sum(self.idle.draw_w(n.name, n.gpu_count, 0) for n in counted)
        per_gpu_w = watts / sum(n.gpu_count for n in counted)
        p = [self.power.nodes.get(n.name) for n in counted]
        offs = [x.seconds("idle_off_after") + x.seconds("wake") for x in p
                if x is not None and x.cfg.idle_off_after is not None]  # fmt: skip
        return per_gpu_w, (max(offs) if len(offs) == len(counted) else None)

    def emptiable(self) -> set[str]:
        """The servers right-sizing may power off once idle: on, with ``idle_off_after``,
        whose last ``power_off`` since they came on did not fail nor was refused (someone
        logged in must not make a server a standing target for checkpoints); co-location
        moves may empty them (``daemon.energy.emptying``)."""
        if self.power is None:
            return set()
        return {n for n, p in self.power.nodes.items()
                if p.state == ON and not p.busy and p.error is None
                and p.cfg.idle_off_after is not None}  # fmt: skip

    def it_idle_w(self, name: str, gpus: int, busy: int) -> float:
        """A server's idle draw with ``busy`` of its ``gpus`` held, IT power (no PUE): on
        the basis co-location gains are (``daemon.energy.emptying``)."""
        return self.idle.draw_w(name, gpus, busy, facility=False)

    def power_view(self) -> dict[str, dict]:
        """Each managed server's power, for ``status`` (its health's ``nodes_power``):
        ``power_state`` (on, off, powering off, waking, wake failed), since when, the last
        power command's failure (escaped, cut) and, after a failed wake, when it is tried
        again (ISO times, UTC)."""
        out: dict[str, dict] = {}
        for name, p in sorted(self.power.nodes.items()) if self.power is not None else ():
            failed = p.state == WAKE_FAILED
            out[name] = {
                "power_state": p.state,
                "since": _iso(p.since_s) if p.since_s else None,
                "error": escape(p.error)[:SHOWN_CHARS] if p.error else None,
                "retry_at": _iso(p.retry_at_s) if failed and p.retry_at_s else None,
            }
        return out

    def awake(self, links: dict) -> dict:
        """The SSH links of servers that are on (discovery leaves the others alone)."""
        if self.power is None:
            return links
        return {n: link for n, link in links.items()
                if n not in self.power.nodes or self.power.nodes[n].state == ON}  # fmt: skip

    def remember(self) -> dict[str, dict]:
        """Each node row's power state and idle-energy cursor, read before the daemon
        replaces the inventory at start (``sync_inventory``), for ``start``."""
        from sqlmodel import select

        from orchestrator.queue.models import Node

        keys = ("power_state", "power_since", "power_error", "idle_until")
        with self.idle.db.read() as session:
            return {row.name: {k: getattr(row, k) for k in keys}
                    for row in session.exec(select(Node)).all()}  # fmt: skip

    def start(self, now_s: float, kept: dict[str, dict]) -> None:
        """The daemon serves: the idle-energy cursors back on the new node rows (nothing
        is counted twice across a restart), and each server's power state."""
        from orchestrator.queue.models import Node

        with self.idle.db.write() as session:
            for name, row in kept.items():
                node = session.get(Node, name)
                if node is not None and row["idle_until"] is not None:
                    node.idle_until = row["idle_until"]
                    session.add(node)
        if self.power is not None:
            self.power.restore(now_s, kept)

    def after_pass(self, queue, scheduler, now_s: float) -> None:
        """Idle energy up to now, then right-sizing on this pass's reading. A failure of
        either is logged (once per reason) and the daemon goes on: the jobs come first."""
        with self._faults.step():
            self.idle.step(queue.alloc, now_s)
            if self.power is not None:
                planned = scheduler.planned() if scheduler is not None else []
                self.power.step(queue.alloc, planned, now_s)
                self._plan_waits = _plan_waits(self.power, queue.alloc, planned, now_s)

    def wake_notes(self, now_s: float, refused: dict | None = None) -> dict[int, str]:
        """Each job waiting for a right-sized server to wake (it fits only with that
        server: ``RightSizer.allocate``; or the plan's, due within its wake and fitting
        there: ``_plan_waits``), and why, in words: for ``show`` and ``ls`` (a job the site
        power limit keeps from waking it, ``refused``: that note says why). A failure is
        logged once and no note changes this pass: notes are words, no job waits on them."""
        with self._reading_notes.step():
            return self._wake_notes(now_s, refused)
        return {}

    def _wake_notes(self, now_s: float, refused: dict | None) -> dict[int, str]:
        out: dict[int, str] = {}
        for name, p in sorted(self.power.nodes.items()) if self.power is not None else ():
            if p.state not in (WAKING, WAKE_FAILED):
                p.waiters.clear()  # on: they launch; off (not woken for them): not waiting
                continue
            note = f"due; waiting for {name} to wake: "
            if p.state == WAKING:
                note += f"woken at {_hms(p.since_s)}"
            else:
                again = f"at {_hms(p.retry_at_s)}" if p.retry_at_s > now_s else "when next due"
                failed = escape(p.error or "no reason given")[:SHOWN_CHARS]
                note += f"its wake failed ({failed}); tried again {again}"
            keys = p.waiters | {("job", j) for j in self._plan_waits.get(name, ())}
            for key in sorted(keys, key=str):  # ("job", id): RightSizer.allocate's
                if isinstance(key, tuple) and key[0] == "job" and key[1] not in (refused or {}):
                    out.setdefault(key[1], note)
        return out

    def write_wake_notes(self, notes: dict[int, str]) -> None:
        """``wake_notes`` on the jobs' rows (a note no longer true cleared); a job that no
        longer waits is forgotten."""
        if self.power is None:
            return
        with self._writing_notes.step():  # logged once; the pass goes on
            gone = {("job", j) for j in self._notes.write(self.power.db, notes)}
            for p in self.power.nodes.values():
                p.waiters -= gone

    def stop(self, now_s: float) -> None:
        if self.power is not None:
            self.power.stop()
        if self.idle._last_s is not None:
            try:
                self.idle.flush(now_s)
            except GridshiftError as exc:  # the store is gone: the last seconds are lost
                log.warning("idle energy: the last stretch was not written: %s", exc)


def _plan_waits(power: RightSizer, alloc, planned: list, now_s: float) -> dict[str, set[int]]:
    """For each server waking or whose wake failed, the plan's jobs due within its wake
    that fit there (its GPU count, its type) and on no server on now (one that does
    waits for its turn there, not for a wake): right-sizing woke it for them."""
    from orchestrator.planning.devices.rightsizing import serves

    out: dict[str, set[int]] = {}
    for name, p in power.nodes.items():
        if p.state not in (WAKING, WAKE_FAILED) or name not in alloc.node_names:
            continue
        due_s, size = now_s + (p.seconds("wake") or 0.0), len(alloc.gpus_of(name))
        out[name] = {
            job.id
            for job, d in planned
            if d.start_s <= due_s and (d.gpus or job.gpus) <= size
            and serves(alloc.type_of(name), getattr(job, "gpu_type", None))
            and not alloc.fits_now(d.gpus or job.gpus, getattr(job, "gpu_type", None))
        }  # fmt: skip
    return out


def _hms(t_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t_s, UTC).strftime("%H:%M:%S UTC")


def _iso(t_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t_s, UTC).isoformat(timespec="seconds")
