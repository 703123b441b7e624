"""The daemon's timers: the passes on APScheduler (3.x), the grid refresh and the node
discovery each on a thread of its own, so a provider or a server that is slow to answer
never delays a pass.

The passes run on a ``BackgroundScheduler`` (one pass at a time) while the main thread
waits for the daemon to be stopped: a signal handler, a pass that finds the queue idle or
the lease lost, or a pass that fails only set events, and the main thread shuts the
scheduler down, after the pass under way, if any, has ended. (Shutting it down from a
signal handler, on the thread that runs the scheduler's own loop, removed its jobs under
that loop's feet: ``JobLookupError``.) The refresh threads are daemon threads: stopping
waits a moment for a round under way, never for a provider stuck on the network.
APScheduler's own warnings (a pass skipped because the one before still runs) are the
daemon's business, not its users': its logger is set to ERROR.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from orchestrator.errors import GridshiftError, boundary


class Served(Protocol):
    """What the passes need of the daemon (``orchestrator.daemon.service.Daemon``)."""

    interval_s: float
    lease: Any
    clock: Any
    dispatcher: Any

    def tick(self, now: datetime) -> float: ...

    def stop(self, *_args) -> None: ...

    def stand_by(self) -> None: ...


log = logging.getLogger(__name__)
STOP_WAIT_S = 0.5  # how long stopping waits for a refresh or discovery round under way
_DIGITS = re.compile(r"\d+")  # an error that differs only in its numbers is the same


class Every:
    """``fn(first)`` every ``interval_s`` seconds on a daemon thread of its own, until
    stopped (``first``: whether this is the first round). A round that raises is logged
    and the next one goes on, whatever it raised: the thread never ends before it is
    stopped. An error is logged once (with its traceback when it is no gridshift or grid
    error), again only after a round has gone well. The first round's error of a
    ``fatal`` type goes to whoever waits for it (``wait_first``) instead, if they still
    wait."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[bool], None],
        *,
        delay_first=False,
        fatal: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.fn = fn
        self.delay_first = delay_first
        self.fatal = fatal
        self._logged: str | None = None  # the error last logged, until a round goes well
        self._stop = threading.Event()
        self._first_done = threading.Event()
        self._lock = threading.Lock()
        self._awaited = True
        self.first_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"gridshift-{name}", daemon=True)

    def start(self) -> Every:
        self._thread.start()
        return self

    def _run(self) -> None:
        first = True
        if self.delay_first:
            self._stop.wait(self.interval_s)
        while not self._stop.is_set():
            try:
                self.fn(first)
                self._logged = None
            except BaseException as exc:  # a round never ends the thread
                with self._lock:
                    claimed = first and self._awaited and isinstance(exc, self.fatal)
                    if claimed:
                        self.first_error = exc
                key = f"{type(exc).__name__}: {_DIGITS.sub('0', str(exc))}"
                if not claimed and key != self._logged:
                    _log_failure(self.name, exc)
                    self._logged = key
            finally:
                if first:
                    self._first_done.set()
                    first = False
            self._stop.wait(self.interval_s)

    def wait_first(
        self, timeout_s: float, abort: threading.Event | None = None
    ) -> BaseException | None:
        """Wait up to ``timeout_s`` (or until ``abort`` is set) for the first round; what
        it raised, if it ended in time (later, its error is logged as any round's)."""
        deadline = time.monotonic() + timeout_s
        while not self._first_done.wait(0.05):
            if time.monotonic() >= deadline or (abort is not None and abort.is_set()):
                break
        with self._lock:
            self._awaited = False
            return self.first_error

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(wait_s)


def _log_failure(name: str, exc: BaseException) -> None:
    if isinstance(exc, GridshiftError) or type(exc).__module__.startswith("grid."):
        log.error("%s failed: %s", name, exc)
    else:
        log.error("%s failed", name, exc_info=exc)


def run_passes(daemon: Served, wake: threading.Event, until_idle: bool) -> None:
    """Run passes until ``wake`` is set (by ``daemon.stop()``, a lost lease, an idle queue
    or a failing pass), then shut the scheduler down, waiting for a pass under way.
    A pass that fails with a bug is raised here, after the shutdown."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    sched = BackgroundScheduler(
        timezone=UTC,
        executors={"default": ThreadPoolExecutor(1)},  # one pass at a time
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
    )
    failure: list[BaseException] = []
    early: list[datetime] = []  # the one-off pass booked before the interval's next
    # held by a pass from start to end. Stopping takes it, then shuts the scheduler down
    # without waiting: waiting inside ``shutdown(wait=True)`` holds the scheduler's job
    # store lock, which a pass booking its early successor (``add_job``) needs: deadlock
    in_pass = threading.Lock()

    def _early(wait_s: float) -> None:
        """Something is due before the interval's next pass: book a one-off pass then
        (the interval job goes on as it is)."""
        if wait_s >= daemon.interval_s or wake.is_set():
            return
        at = datetime.now(UTC) + timedelta(seconds=wait_s)
        if early and early[0] > datetime.now(UTC) and early[0] <= at:
            return
        early[:] = [at]
        sched.add_job(_pass, "date", run_date=at)

    def _pass() -> None:
        with in_pass:
            if not wake.is_set():  # stopping: no new pass
                _one_pass()

    def _one_pass() -> None:
        from orchestrator.daemon.lease import LeaseLost

        try:
            with boundary():
                if daemon.lease is not None:
                    daemon.lease.renew()
                wait_s = daemon.tick(daemon.clock.now())
                _early(wait_s)
                if until_idle and daemon.dispatcher.pending_count() == 0:
                    log.info("queue is idle; exiting")
                    daemon.stop()
        except LeaseLost as exc:
            log.error("%s; standing by", exc)
            daemon.stand_by()
        except GridshiftError as exc:
            log.error("%s", exc)  # a store or grid hiccup: the next pass tries again
        except BaseException as exc:  # a bug: stop, and let the caller see it
            failure.append(exc)
            daemon.stop()

    sched.add_job(
        _pass, "interval", seconds=daemon.interval_s, next_run_time=datetime.now(UTC), id="tick"
    )
    if wake.is_set():
        return
    sched.start()
    try:
        while not wake.wait(1.0):
            pass
    finally:
        with in_pass:  # the pass under way ends first; none starts after
            sched.shutdown(wait=False)
    if failure:
        raise failure[0]
