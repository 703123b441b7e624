"""The daemon: one lock per queue, a recovery pass, then ``tick(now)`` in a loop.

``tick`` does one pass (reap, stop cancelled jobs, launch what is due) and returns the
seconds until the next wake-up. Stopping the daemon (SIGTERM, SIGINT) leaves running jobs
running: their monitors record how they end, and the next daemon picks them up.
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
from executors.local import LocalExecutor
from orchestrator.clock import Clock, SystemClock
from orchestrator.db import Database
from orchestrator.dispatch import Dispatcher
from orchestrator.errors import ConfigError, DaemonError
from orchestrator.inventory import resolve_nodes, sync_inventory
from orchestrator.ownership import current_user, prepare_home
from orchestrator.settings import Settings

log = logging.getLogger("gridshift.daemon")


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


def daemon_running(settings: Settings) -> bool:
    """True when some daemon holds this queue's lock."""
    path = settings.home / "daemon.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@dataclass
class Daemon:
    settings: Settings
    db: Database
    executor: Executor = field(default_factory=LocalExecutor)
    clock: Clock = field(default_factory=SystemClock)
    interval_s: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.interval_s = self.interval_s or self.settings.daemon_interval_s
        layout = prepare_home(self.settings)
        nodes = resolve_nodes(self.settings)
        for node in nodes:
            if node.executor != "local":
                raise ConfigError(
                    f"node {node.name}: executor {node.executor!r} is not "
                    "available in this version; only 'local' is"
                )
        from executors.gpu import detect_link_levels
        from orchestrator.inventory import topology

        self.dispatcher = Dispatcher(
            topology=topology(nodes, link_levels=detect_link_levels),
            settings=self.settings,
            db=self.db,
            executor=self.executor,
            nodes=nodes,
            user=current_user(),
            log_gid=layout.log_gid,
        )
        self.lock = DaemonLock(self.settings.home / "daemon.lock")

    def tick(self, now: datetime) -> float:
        """One pass. Returns the seconds until the next one is due."""
        d = self.dispatcher
        d.reap(now)
        d.stop_cancelled(self.clock.now())
        # A fresh reading: a dependency reaped above may have ended after ``now``, and a
        # job that waited for it must not be recorded as starting before it finished.
        d.launch_due(self.clock.now())
        return float(self.interval_s)

    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self, *, until_idle: bool = False) -> None:
        self.lock.acquire()
        old = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            now = self.clock.now()
            with self.db.write() as session:
                sync_inventory(session, self.dispatcher.nodes, now)
            self.dispatcher.recover(now)
            gpus = sum(n.gpu_count for n in self.dispatcher.nodes)
            log.info(
                "serving %s (%d node(s), %d GPU(s))",
                self.db.safe_url,
                len(self.dispatcher.nodes),
                gpus,
            )
            while not self._stop.is_set():
                wait = self.tick(self.clock.now())
                if until_idle and self.dispatcher.pending_count() == 0:
                    log.info("queue is idle; exiting")
                    break
                self.clock.sleep(wait, self._stop)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.lock.release()
