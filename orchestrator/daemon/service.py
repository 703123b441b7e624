"""The daemon: one per queue, a recovery pass, then ``tick(now)`` driven by APScheduler
(3.x) in the background, with the grid refresh and the node discovery on threads of their
own (``orchestrator.daemon.loop``): passes read the last good signal and never wait on a
provider.

One daemon serves a queue: on SQLite, the one holding ``$GRIDSHIFT_HOME/daemon.lock`` (a
second one refuses to start); on PostgreSQL, the one holding the database's lease
(``orchestrator.daemon.lease``): others stand by and take over when it expires, and one that
loses its lease stops acting at once and stands by again.

``tick`` does one pass, the one the simulator runs too (``orchestrator.planning.onepass``
over the SQL store, ``orchestrator.daemon.sqlqueue``): fence orphans, settle interrupted
launches, stop cancelled jobs, suspend jobs whose planned piece ended, reap ended attempts
and account running ones, queue due cron occurrences, plan and launch what is due (with its
power cap), run the deadline guard, note plans and record the daemon's health. It returns
the seconds until the next thing due (or the interval); a pass is booked then. Stopping the
daemon (SIGTERM, SIGINT) leaves running jobs running: their monitors record how they end,
and the next daemon picks them up; every GPU goes back to its default power limit until then
(under a site power limit the limits stay: ``daemon.energy.sitelimit``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from datetime import datetime

from executors.base import Executor
from orchestrator.accounting.meter import Accountant, modelled_power
from orchestrator.clock import Clock, SystemClock
from orchestrator.daemon.dispatch import Dispatcher
from orchestrator.daemon.energy.sharing import Sharing
from orchestrator.daemon.guard import Suspender, note_plans
from orchestrator.daemon.health import HealthWriter
from orchestrator.daemon.reaper import Reaper
from orchestrator.daemon.server import serve
from orchestrator.daemon.sqlqueue import SqlQueue
from orchestrator.errors import DaemonError, GridshiftError
from orchestrator.nodes import backends
from orchestrator.nodes import ssh as sshnodes
from orchestrator.nodes.inventory import resolve_nodes, sync_inventory
from orchestrator.planning.onepass import Pass
from orchestrator.queue.db import Database
from orchestrator.queue.ownership import current_user, prepare_home
from orchestrator.settings import Settings

log = logging.getLogger(__name__)
START_WAIT_S = 5.0  # at start, the first passes wait this long at most for the grid signal


class DaemonLock:
    """An exclusive ``flock`` on ``$GRIDSHIFT_HOME/daemon.lock``, held while the daemon
    lives; the kernel drops it when the process dies, SIGKILL included."""

    def __init__(self, path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode().strip() or "unknown"
            os.close(fd)
            raise DaemonError(
                f"another gridshift daemon (pid {holder}) already serves this queue"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class Daemon:
    settings: Settings
    db: Database
    executor: Executor = field(default_factory=backends.local_executor)
    clock: Clock = field(default_factory=SystemClock)
    interval_s: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.interval_s = self.interval_s or self.settings.daemon_interval_s
        layout = prepare_home(self.settings)
        from executors.gpu import detect_link_levels
        from orchestrator.daemon.planner import build_live
        from orchestrator.nodes.inventory import topology

        self.links = sshnodes.build_links(self.settings.nodes, home=self.settings.home)
        self.discovery = sshnodes.discover(self.links)
        nodes = resolve_nodes(self.settings, discovered=self._discovered())
        self.executor = backends.build_executor(
            self.settings, self.links, self.db.safe_url, default=self.executor
        )
        cfg = self.settings.daemon
        self.planner, self.policy_name = build_live(self.settings, nodes)
        self.caps = backends.cluster_caps(self.settings, nodes, self.links, cfg.power_caps)
        if self.planner is not None and not self.caps.enabled:
            self.planner.without_caps()
        self.site = None  # the site power limit (daemon.energy.sitelimit)
        if cfg.power_limit_w is not None:
            from orchestrator.daemon.energy.sitelimit import SiteLimit

            self.site = SiteLimit(cfg.power_limit_w, self.caps, nodes, self.db)
            self.site.unreachable = self.executor.unreachable_nodes  # not read, not set
            self.site.check()
        feed = self.planner.feed if self.planner else None
        price = self.planner.price if self.planner else None
        sharing = Sharing.for_nodes(self.db, nodes)  # co-location: None where no node shares
        self.dispatcher = Dispatcher(
            sharing=sharing,
            topology=topology(nodes, link_levels=detect_link_levels),
            settings=self.settings,
            db=self.db,
            executor=self.executor,
            nodes=nodes,
            user=current_user(),
            log_gid=layout.log_gid,
            caps=self.caps,
            power_sample_s=cfg.seconds("power_sample"),
            site=self.site,
        )
        curve = self.planner and self.planner.curve  # the planner's, for modelled draws
        self.reaper = Reaper(
            db=self.db,
            executor=self.executor,
            settings=self.settings,
            nodes=nodes,
            accountant=Accountant(
                carbon=feed.integral if feed is not None else _no_signal,
                price=price.integral if price is not None else _no_signal,
                modelled_power_w=modelled_power(nodes, curve, self.site),  # at most the limits
                split=sharing.split_for if sharing is not None else None,
            ),
            caps=self.caps,
            power_sample_s=cfg.seconds("power_sample"),
            moved=sharing.notes if sharing is not None else {},  # why a moved job left
        )
        self.suspender = Suspender(
            self.db,
            self.executor,
            self.settings.cancel_grace_s,
            cfg.suspend,
            checkpoint_s=cfg.seconds("checkpoint_cost"),
        )
        self.splitter = None  # a pair whose measured speed misses a deadline splits
        if sharing is not None:  # (daemon.energy.splits): always where a node shares
            from orchestrator.daemon.energy.splits import Splitter

            self.splitter = Splitter(
                sharing,
                self.suspender.checkpoint,
                cfg.seconds("checkpoint_cost"),
                self.executor.unreachable_nodes,
                alloc=lambda: self.queue.alloc,  # after the launches: this pass's reading
                waiting=self._a_job_waits,
                grace=self.suspender.grant,
                grace_s=self.settings.cancel_grace_s,
            )
        self.mover = None  # co-location moves (daemon.energy.moves): where a node shares
        if sharing is not None and cfg.moves:
            from orchestrator.daemon.energy.moves import Mover
            from orchestrator.settings import move_kinds

            self.mover = Mover(
                sharing,
                self.suspender.checkpoint,
                cfg.seconds("checkpoint_cost"),
                cfg.seconds("move_after"),
                self.executor.unreachable_nodes,
                waiting=self._a_job_waits,
                alloc=lambda: self.queue.alloc,  # after the launches: this pass's reading
                grace=self.suspender.grant,
                grace_s=self.settings.cancel_grace_s,
                **move_kinds(cfg.moves),
                emptiable=lambda: self.levers.emptiable(),  # right-sizing's (built below)
                idle_w=lambda name, gpus, busy: self.levers.it_idle_w(name, gpus, busy),
            )
        self.queue = SqlQueue(self.db, self.dispatcher, self.reaper, self.suspender, self.planner,
                              backfill=cfg.backfill)  # fmt: skip
        from orchestrator.daemon.energy.levers import Levers

        self.levers = Levers.build(self.settings, nodes, self.links, self.db, caps=self.caps,
                                   carbon=feed.integral if feed is not None else None)  # fmt: skip
        self.queue.power = self.levers.power  # packing prefers servers on; wakes one off
        if self.site is not None and self.levers.power is not None:  # off: 0 W; a wake admitted
            self.site.power, self.levers.power.may_wake = self.levers.power.counted, self.site.wakes
            answered = set(self.site.answered)  # stored off, but their GPUs answered: on
            self.levers.power.answering = lambda: answered
        if self.levers.power is not None:  # one that does not answer is not powered off
            self.levers.power.unreachable = self.executor.unreachable_nodes
        if self.planner is not None:  # with right-sizing: a waiting job keeps GPUs idle
            self.planner.idle_cost = self.levers.idle_cost(nodes)
        self.onepass = Pass(
            self.queue,
            guard=self.planner is not None,
            resize=self.planner is not None,  # elastic jobs resized (planning.resize)
            before=[
                ("fence", lambda _now: self.reaper.fence_orphans(self.clock.now())),
                ("recover", lambda _now: self.reaper.recover(self.clock.now())),
                ("cancel", lambda _now: self.reaper.stop_cancelled(self.clock.now())),
            ],
            after=[
                *([("splits", self.splitter.step)] if self.splitter is not None else []),
                *([("moves", self.mover.step)] if self.mover is not None else []),
                *self._site_step(),
                ("note", self._note),
                ("health", self._health),
                (
                    "energy",
                    lambda now_s: self.levers.after_pass(self.queue, self.onepass.scheduler, now_s),
                ),
            ],
            clock=lambda: self.clock.now().timestamp(),
        )
        self.lock = DaemonLock(self.settings.home / "daemon.lock")
        self.lease = None
        if not self.db.is_sqlite:
            from orchestrator.daemon.lease import DaemonLease

            self.lease = DaemonLease(self.db, cfg.seconds("lease"))
            self.dispatcher.lease_check = self.lease.check
            if self.levers.power is not None:  # a power command only while the lease holds
                self.levers.power.lease_check = self.lease.check
        self._lost = False
        self._wake = threading.Event()  # ends the passes: stopped, or the lease lost
        self.health = HealthWriter(self)
        self.metrics = None

    def _a_job_waits(self):
        """The job due that this pass found no GPUs for (``Scheduler.blocked``), if any."""
        scheduler = getattr(getattr(self, "onepass", None), "scheduler", None)
        return scheduler.blocked() if scheduler is not None else None

    def _site_step(self) -> list:
        """After the launches: the site power limit split again (decreases first)."""
        return [("site limit", lambda _now: self.site.rebalance())] if self.site else []

    def _discovered(self) -> dict:
        """GPUs per SSH node: as discovered now, else as the last discovery stored them
        (a server down at start keeps its place in the topology and is used when back)."""
        out = {}
        with self.db.read() as session:
            for name, got in self.discovery.items():
                stored = sshnodes.stored_gpus(session, name) if isinstance(got, str) else got
                if stored:
                    out[name] = [g.info() for g in stored]
        return out

    # -- the pass -----------------------------------------------------------------------
    def tick(self, now: datetime) -> float:
        """One pass (``self.onepass``: fence, recover, cancel, then the pass the simulator
        runs too: suspend, reap, admit, plan, launch, guard; then notes and health).
        Returns the seconds until the next thing due: a planned start, a piece's end, a
        guard check or a cron occurrence, or the interval, whichever comes first."""
        due = self.onepass.tick(now.timestamp())
        left = float(self.interval_s)
        if due is not None:
            left = min(left, max(0.0, due - self.clock.now().timestamp()))
        return left

    def _note(self, now_s: float) -> None:
        power = self.site.refused if self.site is not None else None
        wakes = self.levers.wake_notes(now_s, power)  # jobs waiting for a server to wake
        if self.planner is not None and self.onepass.scheduler is not None:
            note_plans(self.db, self.planner, self.onepass.scheduler, self.queue.eligible,
                       self.clock.now(), self.queue.waiting, power, wakes)  # fmt: skip
        self.levers.write_wake_notes(wakes)
        if power:
            power.clear()  # this pass's refusals: the next pass admits afresh

    def _health(self, _now_s: float) -> None:
        self.health.write(self.clock.now())
        if self.metrics is not None:
            self.metrics.update(self.health.data)

    def refresh_signal(self, *, at_start: bool = False) -> None:
        """The grid timer: fetch the signal (cache first) for the next plans. At start a
        source that cannot be used as given (a missing trace file) stops the daemon with
        one line; later, it is logged (once) and planning goes on with what the tape
        holds. A failing source is logged by its feed, once per reason; an error nobody
        foresaw is a failed refresh too (logged once, with its traceback), at start or
        later, and the next round tries again."""
        from grid.errors import SourceSpecError

        now = self.clock.now()
        for feed in (self.planner.feed, self.planner.price):
            if feed is None:
                continue
            try:
                feed.refresh(now)
            except SourceSpecError as exc:
                if at_start:
                    raise
                feed.failed(str(exc))
            except Exception as exc:  # not the daemon's end: plan on what the tape holds
                feed.unexpected(exc)

    def refresh_nodes(self) -> None:
        """The discovery timer: the servers' GPUs, use and power limits, for ``nodes``
        (servers right-sizing powered off are not asked)."""
        found = sshnodes.discover(self.levers.awake(self.links))
        with self.db.write() as session:
            sshnodes.record(session, found, self.clock.now())

    def stop(self, *_args) -> None:
        """Stop serving (a signal handler, or a pass): only sets events; the main thread
        shuts the passes down (``orchestrator.daemon.loop``)."""
        self._stop.set()
        self._wake.set()

    def stand_by(self) -> None:
        """The lease is lost: stop serving and stand by again."""
        self._lost = True
        self._wake.set()

    def run(self, *, until_idle: bool = False) -> None:
        if self.lease is None:
            self.lock.acquire()
        old = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
        server = None
        try:
            server = serve(self.settings, self.db)  # standbys answer their host's users too
            while self._acquire():
                self._serve(until_idle)
                if self._stop.is_set() or not self._lost:
                    break
                self._lost = False
                if self.levers.power is not None:  # another daemon powers servers now
                    self.levers.power.reset()
        finally:
            if server is not None:
                server.stop()
            self.levers.stop(self.clock.now().timestamp())
            if self.lease is None or self.lease.epoch is not None:
                if self.site is None:  # under a site limit, the limits stay: it holds
                    self.reaper.restore_caps()
                self.health.write(self.clock.now(), stopped=True)
            self.executor.close()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            if self.lease is not None:
                self.lease.release()
            self.lock.release()

    def _acquire(self) -> bool:
        """SQLite: the flock is held already. PostgreSQL: wait for the lease (standing by
        while another daemon holds it); False when stopped while waiting."""
        if self.lease is None:
            return True
        from orchestrator.daemon.lease import describe

        shown = None
        while not self._stop.is_set():
            try:
                row = self.lease.try_acquire()
            except GridshiftError as exc:
                log.warning("cannot take the lease: %s", exc)
                row = None
            else:
                if row is None:
                    log.info("holding the lease (epoch %d)", self.lease.epoch)
                    return True
            if row is not None and row.holder != shown:
                log.info(
                    "standing by: %s serves this queue (lease until %s)",
                    describe(row.holder),
                    row.expires_at.isoformat(timespec="seconds"),
                )
                shown = row.holder
            self._stop.wait(max(0.2, min(5.0, self.lease.ttl_s / 5)))
        return False

    def _serve(self, until_idle: bool) -> None:
        from grid.errors import SourceSpecError
        from orchestrator.daemon.loop import Every, run_passes

        now = self.clock.now()
        kept = self.levers.remember()  # power states the inventory's replacement drops
        with self.db.write() as session:
            sync_inventory(session, self.dispatcher.nodes, now)
            sshnodes.record(session, self.discovery, now)
        self.reaper.recover(now)
        self.levers.start(now.timestamp(), kept)  # servers off before the site limit counts
        if self.site is not None:
            self.site.rebalance()  # idle GPUs parked, running jobs' shares, decreases first
        else:
            self.reaper.reconcile_caps()
        self._announce()
        self._wake.clear()
        timers = []
        try:
            if self.planner is not None and self.planner.feed is not None:
                refresh_s = self.settings.daemon.seconds("refresh") or min(
                    self.planner.slot_s, 900.0
                )
                grid = Every("grid refresh", refresh_s,
                             lambda first: self.refresh_signal(at_start=first),
                             fatal=(SourceSpecError,))  # fmt: skip
                timers.append(grid.start())
                error = grid.wait_first(START_WAIT_S, abort=self._wake)  # a signal, if in time
                if isinstance(error, SourceSpecError):  # the user's spec: a missing trace
                    raise error  # anything else was logged as a failed refresh
            if self.links:
                every_s = self.settings.daemon.seconds("discovery")
                nodes = Every("node discovery", every_s, lambda _: self.refresh_nodes(),
                              delay_first=True)  # fmt: skip
                timers.append(nodes.start())
            if self.settings.daemon.metrics_port and self.metrics is None:
                from orchestrator.daemon.health import Metrics

                self.metrics = Metrics(
                    self.settings.daemon.metrics_port, self.settings.daemon.metrics_addr
                )
            if not self._stop.is_set():
                run_passes(self, self._wake, until_idle)
        finally:
            for timer in timers:
                timer.stop()

    def _announce(self) -> None:
        d = self.dispatcher
        gpus = sum(n.gpu_count for n in d.nodes)
        log.info("serving %s (%d node(s), %d GPU(s))", self.db.safe_url, len(d.nodes), gpus)
        if self.planner is not None:
            p = self.planner
            log.info(
                "policy %s, slot %gs, suspend by %s%s%s",
                p.policy.name,
                p.slot_s,
                self.suspender.mode,
                f", budget {p.budget}" if p.budget else "",
                f", signal {p.feed.chain.spec}" if p.feed else "",
            )
        if gpus and not self.caps.enabled:
            log.warning("planning without power caps: %s", self.caps.reason)


def _no_signal(_t0: float, _t1: float) -> None:
    return None
