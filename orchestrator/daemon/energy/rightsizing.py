"""Right-sizing on the live daemon: SSH servers powered off when idle, woken for a job.

A server with ``power_off`` and ``power_on`` in its ``[[nodes]]`` table is managed here;
what to do is decided by the pure ``planning.devices.rightsizing.right_size`` (the one
the simulator takes too), from each node's state, since when it is idle, its wake-up
time and the plan's next needs (each queued job's planned start and width).

- **Power off.** A server on, idle for its ``idle_off_after`` (nothing held there: no
  job, resize reservation or backfill block; its latest discovery, newer than the start
  of that stretch, sees no GPU in use: ``nodes.idleask``), whose GPUs none of the jobs planned
  within its ``wake`` need, is asked itself (no GPU in use, no compute process, nobody
  logged in: ``nodes.idleask``; any doubt: it stays on), then gets ``power_off``
  (``powercmd``: argv from the root-owned config, a timeout, its output not believed).
  Exit 0 is not off: the server is ``powering off`` until it does not answer
  ``OFF_MISSES`` times in a row (then ``off``), or still ``on`` with an error if it
  answers ``wake_timeout`` later. A failure leaves it ``on`` (the error shown by
  ``nodes``) and idle time counts again from then.
- **Packing prefers servers on.** A job is placed on servers that are on when it fits
  there (``allocate``); one that fits only with a server that is off (or whose wake
  failed, once its retry is due; before that it is as if down) wakes it and waits:
  ``power_on``, then the server must answer over SSH, once seen down or with a new
  ``boot_id`` (a server still going down answers a while); then it is ``on`` and the job
  launches at the next pass. A job wider than one server goes the same way (``across``).
  The plan's needs due within a server's wake time wake it ahead of them too.
- **Never a stalled daemon.** Each command, and the wait for the server to answer, runs
  on a thread of its own; a pass only looks at how they ended. A wake that fails (the
  command fails or hangs, or the server does not answer within ``wake_timeout``) marks
  the server ``wake failed`` with its reason, and it is tried again after a back-off
  (1 minute, doubling up to 30 minutes) while a job needs it.
- **Stored.** Each state is written on the node's row (``power_state``, ``power_since``,
  ``power_error``) for ``nodes``; a daemon that starts finds servers it left off as off
  (on if their GPUs answer: ``answering``); a wake or power_off left under way is waited
  for as if this daemon had sent it (until ``power_since`` + wake_timeout + ``MARGIN_S``).
  A server off or whose wake failed is asked every ``RECHECK_S`` (on a thread) whether
  it answers: on if so (powered on by hand, a BMC's power restore, a late power_on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.daemon.energy.powercmd import SHOWN_CHARS, Outcome, escape, run_power_command
from orchestrator.nodes.idleask import asked_idle, boot_id, discovered_idle
from orchestrator.planning.devices.rightsizing import OFF, ON, WAKING, Need, NodePower, right_size
from orchestrator.queue.db import Database
from orchestrator.settings.nodes import NodeConfig

log = logging.getLogger(__name__)
POWERING_OFF, WAKE_FAILED = "powering off", "wake failed"
MAY_BE_ON = "may be on"  # how the site power limit counts a server waking or uncertain
RETRY_MIN_S, RETRY_MAX_S = 60.0, 1800.0  # a failed wake is tried again after this
PROBE_EVERY_S = 1.0  # how often a woken server is asked whether it answers
OFF_MISSES = 3  # no answer this many times in a row after power_off: the server is off
RECHECK_S = 300.0  # how often a server off, or whose wake failed, is asked if it answers
MARGIN_S = 30.0  # a wake or power_off a restarted daemon resumes: its wake_timeout and this


@dataclass
class Power:
    """One managed server's power, as this daemon knows it."""

    cfg: NodeConfig
    state: str = ON
    since_s: float = 0.0
    idle_since_s: float | None = None
    error: str | None = None
    retry_at_s: float = 0.0
    backoff_s: float = RETRY_MIN_S
    result: Outcome | None = None  # set by the command's thread when it ends
    busy: bool = False  # a command's thread is under way
    stored: bool = False  # the row says what ``state`` says
    down_seen: bool = False  # seen not answering since it was last on (power_off's end)
    checking: bool = False  # the thread under way only asks whether it answers
    check_at_s: float = 0.0  # when a server whose wake failed is asked again
    waiters: set = field(default_factory=set)  # jobs that fit only with it: wait for it

    def seconds(self, name: str) -> float | None:
        return self.cfg.seconds(name) if getattr(self.cfg, name) is not None else None


@dataclass
class RightSizer:
    db: Database
    nodes: dict[str, Power]
    probe: Callable[[str], str | None]  # None: the server answers; else why not
    ask_idle: Callable[[str], str | None] = lambda _n: "not asked"  # None: idle; else why not
    boot: Callable[[str], str | None] = lambda _n: None  # the server's boot_id; None: no answer
    lease_check: Callable | None = None  # raises LeaseLost inside a write transaction
    may_wake: Callable[[str, object], bool] = lambda _n, _k: True  # the site limit admits it
    answering: Callable[[], set[str]] = set  # servers whose GPUs answered at start (on)
    unreachable: Callable[[], dict] = dict  # the executor's: not powered off (it may be busy)
    _stop: threading.Event = field(default_factory=threading.Event)
    _gen: int = 0  # bumped when the lease is lost: older threads' outcomes are dropped

    @classmethod
    def build(cls, configs: list[NodeConfig], links: dict, db: Database) -> RightSizer | None:
        managed = {c.name: Power(c) for c in configs if c.power_off and c.power_on}
        if not managed:
            return None
        return cls(db, managed, probe=lambda name: answers(links[name]),
                   ask_idle=lambda name: asked_idle(links[name]),
                   boot=lambda name: boot_id(links[name]))  # fmt: skip

    # -- the pass's two hooks ------------------------------------------------------------
    def placer(self, alloc, now_s: float) -> Callable:
        """``allocate`` as ``daemon.energy.gputypes.allocate_typed`` places a job once it
        chose its GPU type."""
        return lambda key, width, gpu_type: self.allocate(alloc, key, width, now_s, gpu_type)

    def allocate(self, alloc, key: object, width: int, now_s: float, gpu_type=None):
        """GPUs for ``key`` on servers that are on; None while it must wait. One that fits
        only with a server that is off wakes that server (the job waits for it)."""
        barred = [n for n in self._barred(now_s) if n in alloc.node_names]  # as if down
        blocked = [n for n, p in self.nodes.items()
                   if p.state != ON and n in alloc.node_names and n not in barred]  # fmt: skip
        if not blocked and not barred:
            return alloc.allocate(key, width, gpu_type=gpu_type)
        down = {n: alloc.allocation(("down", n)) for n in blocked + barred}  # it is off
        down = {n: a for n, a in down.items() if a is not None}
        for name in down:
            alloc.free(("down", name))
        for name in barred:  # a wake that failed, its retry not due: no GPU there
            if alloc.free_on(name):
                alloc.hold(("barred", name), name, alloc.free_on(name))
        try:  # placement.cluster: servers off only when it fits nowhere else
            got = alloc.allocate_preferring(key, width, blocked, gpu_type=gpu_type)
            woken = {node for node, _ in got.parts} & set(blocked) if got is not None else set()
            if woken:
                alloc.free(key)
                for name in sorted(woken):
                    self.nodes[name].waiters.add(key)  # its wake note: levers.wake_notes
                    self.wake(name, now_s, f"for {_job(key)}", key)
                got = None
        finally:
            for name in barred:
                if alloc.allocation(("barred", name)) is not None:
                    alloc.free(("barred", name))
            for name, held in down.items():
                alloc.hold(("down", name), name, [g for _, gpus in held.parts for g in gpus])
        return got

    def _barred(self, now_s: float) -> set[str]:
        """Servers whose wake failed and whose retry is not due: down until then."""
        return {n for n, p in self.nodes.items() if p.state == WAKE_FAILED and now_s < p.retry_at_s}

    def step(self, alloc, planned: Iterable[tuple], now_s: float) -> None:
        """After the launches: how the commands under way ended, since when each server
        is idle, and what ``right_size`` says to power off and to wake."""
        for name, p in self.nodes.items():
            self._settle(name, p, now_s)
            if p.state in (OFF, WAKE_FAILED) and not p.busy and now_s >= p.check_at_s:
                p.check_at_s = now_s + RECHECK_S  # on after all (power_on late, by hand)?
                self._check(name, p)
        if alloc is None:
            return self._store()
        views, held, barred = [], _held_gpus(alloc), self._barred(now_s)
        seen = discovered_idle(self.db, [n for n, p in self.nodes.items() if p.state == ON])
        for name in alloc.node_names:
            total, free = len(alloc.gpus_of(name)), len(alloc.free_on(name))
            p = self.nodes.get(name)
            if name in barred:  # its wake failed, its retry not due: as if down
                continue
            gpu_type = alloc.type_of(name)  # a typed job's need fits only on its type
            if p is None:  # not managed: capacity that is on
                views.append(NodePower(name, total, free, gpu_type=gpu_type))
                continue
            free = total - held.get(name, 0)  # idle: nothing held (unreachable: still idle)
            idle_since = None
            if p.state == ON:  # idle: nothing held, and discovery sees no GPU in use
                idle = free == total and not p.busy and seen.get(name) is not None
                p.idle_since_s = (
                    (now_s if p.idle_since_s is None else p.idle_since_s) if idle else None
                )  # idle only as of a discovery newer than the idle stretch's start
                if p.idle_since_s is not None and seen[name] >= p.idle_since_s:
                    idle_since = p.idle_since_s
            state = {ON: ON, WAKING: WAKING}.get(p.state, OFF)
            views.append(NodePower(
                name, total, total if state != ON else free, state,
                idle_since, p.seconds("wake") or 0.0,
                p.seconds("idle_off_after"), gpu_type,
            ))  # fmt: skip
        needs = [Need(d.start_s, d.gpus or job.gpus, job.id, getattr(job, "gpu_type", None))
                 for job, d in planned]  # fmt: skip
        actions = right_size(views, needs, now_s)
        lost = self.unreachable()
        for name in (n for n in actions.power_off if n not in lost):
            if name in self.nodes and self.nodes[name].state == ON and not self.nodes[name].busy:
                self._power_off(name, now_s)
        for name in actions.wake:
            if name in self.nodes:
                self.wake(name, now_s, "for the plan's next jobs")
        return self._store()

    def stop(self) -> None:
        """The daemon stops: waits for servers to answer end, commands are killed."""
        from orchestrator.daemon.energy.powercmd import kill_running

        self._stop.set()
        kill_running()

    def reset(self) -> None:
        """The lease is lost: commands and waits under way end, what ended is dropped,
        and the states are read again from the rows when this daemon serves again."""
        self.stop()
        self._stop = threading.Event()  # for the next serving; the old threads saw theirs
        self._gen += 1
        for p in self.nodes.values():
            p.result, p.checking, p.stored = None, False, True

    def counted(self, name: str) -> str:
        """How the site power limit counts a server (``sitelimit``): ON (its limits read
        and set), OFF (0 W), POWERING_OFF (its parked limits until off), else MAY_BE_ON
        (waking or a failed wake: its GPUs at their highest)."""
        p = self.nodes.get(name)
        if p is None or p.state in (ON, POWERING_OFF):
            return ON if p is None else p.state
        return OFF if p.state == OFF else MAY_BE_ON

    # -- transitions ---------------------------------------------------------------------
    def wake(self, name: str, now_s: float, why: str, key: object = None) -> None:
        """Wake a server for job ``key`` (None: the plan's next jobs) if the site power
        limit admits it (``may_wake``, else it stays off and the job waits)."""
        p = self.nodes[name]
        if p.busy or p.state in (ON, WAKING, POWERING_OFF):
            return  # on, on its way, or powering off (woken once off)
        if p.state == WAKE_FAILED and now_s < p.retry_at_s:
            return
        if not self.may_wake(name, key):
            return
        log.info("node %s: waking it (%s)", name, why)
        self._set(p, WAKING, now_s)
        self._store()  # with the lease checked: a daemon that lost it runs no command
        self._start(name, p, lambda: self._wake(name, p))

    def _power_off(self, name: str, now_s: float) -> None:
        p = self.nodes[name]
        log.info("node %s: idle since %s: powering it off", name, _iso(p.idle_since_s or now_s))
        self._set(p, POWERING_OFF, now_s)
        self._store()  # with the lease checked: a daemon that lost it runs no command
        self._start(name, p, lambda: self._off(name, p))

    def _off(self, name: str, p: Power) -> Outcome:
        """power_off, once the server itself says it is idle (on this thread)."""
        why = self.ask_idle(name)
        if why is not None:
            return Outcome(False, f"not idle: {why}")
        got = run_power_command(p.cfg.power_off, p.seconds("power_timeout"))
        return self._until_down(name, p) if got.ok else got

    def _until_down(self, name: str, p: Power, left_s: float | None = None) -> Outcome:
        """Exit 0 from power_off is not off (ipmitool power soft, systemctl suspend end at
        once): off once the server does not answer OFF_MISSES times in a row, within its
        wake_timeout; else it is still on."""
        left_s = p.seconds("wake_timeout") if left_s is None else left_s
        deadline, misses, stop = time.monotonic() + left_s, 0, self._stop
        while not stop.is_set():
            misses = misses + 1 if self.probe(name) is not None else 0
            if misses >= OFF_MISSES:
                p.down_seen = True
                return Outcome(True, "no answer")
            if time.monotonic() >= deadline and not misses:  # going down: it may end
                break
            stop.wait(PROBE_EVERY_S)
        return Outcome(False, f"still answers {p.cfg.wake_timeout} after power_off (exit 0)")

    def _wake(self, name: str, p: Power) -> Outcome:
        """power_on, then wait for the server to answer (on this thread), within its
        wake_timeout of power_on's start."""
        deadline, stop = time.monotonic() + p.seconds("wake_timeout"), self._stop
        # an answer counts once the server was seen down, or booted again (a server
        # still going down answers for a while)
        before = None if p.down_seen else self.boot(name)
        down_seen, same_boot = before is None, False  # same_boot: answers, not booted again
        got = run_power_command(p.cfg.power_on, p.seconds("power_timeout"))
        if not got.ok:
            return got
        while not stop.is_set():
            now_id = self.boot(name)
            if now_id is None:
                down_seen = True
            elif down_seen or now_id != before:
                return Outcome(True, "answers")
            same_boot = not down_seen
            if time.monotonic() >= deadline:
                break
            stop.wait(PROBE_EVERY_S)
        if same_boot:
            return _late(p, "it answers but did not boot again", "same boot_id")
        return _late(p, "no answer")

    def _check(self, name: str, p: Power) -> None:
        """Ask (on a thread) whether a server whose state is uncertain answers: on if so."""
        p.checking = True

        def ask() -> Outcome:
            why = self.probe(name)
            return Outcome(why is None, why or "answers")

        self._start(name, p, ask)

    def _start(self, name: str, p: Power, fn: Callable[[], Outcome]) -> None:
        p.busy, p.result, gen = True, None, self._gen

        def run() -> None:
            try:
                got = fn()
            except Exception as exc:  # a bug in a thread: the node's failure, said once
                log.exception("node %s: power command", name)
                got = Outcome(False, f"{type(exc).__name__}: {exc}")
            finally:
                p.busy = False
            if gen == self._gen:  # else the lease was lost meanwhile: not ours to say
                # what commands and servers said: one line, cut, for the log and the row
                p.result = Outcome(got.ok, escape(got.detail)[:SHOWN_CHARS])

        threading.Thread(target=run, name=f"gridshift-power-{name}", daemon=True).start()

    def _settle(self, name: str, p: Power, now_s: float) -> None:
        """A command that ended: its outcome becomes the node's state."""
        if p.busy or p.result is None:
            return
        got, p.result = p.result, None
        if p.checking:  # uncertain: on if it answers, else as it was
            p.checking = False
            if got.ok:
                log.info("node %s: answers: it is on", name)
                self._set(p, ON, now_s)
                p.idle_since_s, p.backoff_s = now_s, RETRY_MIN_S
        elif p.state == POWERING_OFF:
            if got.ok:
                log.info("node %s: powered off", name)
                self._set(p, OFF, now_s)
                p.check_at_s = now_s + RECHECK_S
            else:
                log.warning("node %s: power_off failed: %s; it stays on", name, got.detail)
                self._set(p, ON, now_s, error=f"power_off: {got.detail}")
                p.idle_since_s = now_s  # idle time counts again from now
        elif p.state == WAKING:
            if got.ok:
                log.info("node %s: awake and answering", name)
                self._set(p, ON, now_s)
                p.idle_since_s, p.backoff_s, p.down_seen = now_s, RETRY_MIN_S, False
            else:
                p.retry_at_s = now_s + p.backoff_s
                log.warning("node %s: wake failed: %s; tried again after %s if still needed",
                            name, got.detail, _iso(p.retry_at_s))  # fmt: skip
                self._set(p, WAKE_FAILED, now_s, error=f"power_on: {got.detail}")
                p.backoff_s = min(RETRY_MAX_S, p.backoff_s * 2)

    def _set(self, p: Power, state: str, now_s: float, error: str | None = None) -> None:
        p.state, p.since_s, p.stored, p.error = state, now_s, False, error
        if state != ON:
            p.idle_since_s = None

    # -- the node rows -------------------------------------------------------------------
    def restore(self, now_s: float, kept: dict[str, dict]) -> None:
        """At start, from what the node rows said before the inventory was replaced
        (``levers.remember``): servers stored on are on, off are off (on if their GPUs
        answered the site limit's probe: ``answering``); a wake or power_off a daemon left
        under way is waited for as if this one had sent it, until ``power_since`` plus
        the server's wake_timeout (and ``MARGIN_S``); a failed wake is asked whether it
        answers (on a thread) and is on if so."""
        answering = self.answering()
        for name, p in self.nodes.items():
            row = kept.get(name, {})
            stored = row.get("power_state")
            state = stored if stored in (ON, OFF, WAKING, POWERING_OFF, WAKE_FAILED) else ON
            state = ON if state == OFF and name in answering else state  # on by hand
            p.state, p.error, p.stored = state, row.get("power_error"), False
            since = row.get("power_since")
            p.since_s = since.timestamp() if since else now_s
            p.idle_since_s = now_s if state == ON else None
            p.check_at_s = now_s + RECHECK_S
            left_s = max(0.0, p.since_s + p.seconds("wake_timeout") + MARGIN_S - now_s)
            if state == WAKING:  # its power_on was sent: it answers by then, or failed
                self._start(name, p, lambda n=name, q=p, s=left_s: self._until_up(n, q, s))
            elif state == POWERING_OFF:  # off once it stops answering, else still on
                self._start(name, p, lambda n=name, q=p, s=left_s: self._until_down(n, q, s))
            elif state == WAKE_FAILED:
                self._check(name, p)
        self._store()

    def _until_up(self, name: str, p: Power, left_s: float) -> Outcome:
        """A wake a previous daemon started: the server answers within ``left_s``."""
        deadline, stop, why = time.monotonic() + left_s, self._stop, None
        while not stop.is_set():
            why = self.probe(name)
            if why is None:
                return Outcome(True, "answers")
            if time.monotonic() >= deadline:
                break
            stop.wait(PROBE_EVERY_S)
        return _late(p, "no answer", why)

    def _store(self) -> None:
        todo = {n: p for n, p in self.nodes.items() if not p.stored}
        if not todo:
            return
        from orchestrator.queue.models import Node

        with self.db.write() as session:
            if self.lease_check is not None:
                self.lease_check(session)
            for name, p in todo.items():
                row = session.get(Node, name)
                if row is not None:
                    row.power_state, row.power_error = p.state, p.error
                    row.power_since = datetime.fromtimestamp(p.since_s, UTC)
                    session.add(row)
                p.stored = True


def _held_gpus(alloc) -> dict[str, int]:
    """GPUs held per node: by jobs (running attempts, jobs launched in this pass), resize
    reservations, backfill blocks, anything but ``down`` (a server unreachable is idle)."""
    out: dict[str, int] = {}
    for key, got in alloc.allocations().items():
        if not (isinstance(key, tuple) and key and key[0] == "down"):
            for node, gpus in got.parts:
                out[node] = out.get(node, 0) + len(gpus)
    return out


def answers(link) -> str | None:
    """Whether an SSH server answers a command (None) or why not."""
    from executors.errors import ExecutorError

    try:
        link.run(["true"], timeout_s=max(5.0, link.target.connect_timeout_s + 5))
    except ExecutorError as exc:
        return str(exc)
    return None


def _late(p: Power, what: str, why: str | None = None) -> Outcome:
    """A wake not seen through in time, said once (``power_on: no answer within 6s``)."""
    return Outcome(False, f"{what} within {p.cfg.wake_timeout}" + (f" ({why})" if why else ""))


def _job(key: object) -> str:
    return f"job {key[1]}" if isinstance(key, tuple) and len(key) == 2 else str(key)


def _iso(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, UTC).isoformat(timespec="seconds")
