"""Containment: one job, attempt or node whose work fails never ends the pass.

The pass's per-entity work (reap, account, recover one attempt; launch one job) runs in
``Faults.contained(entity, ...)``. An exception there that is not the store's or the
lease's (those concern every entity: the pass stops and the loop logs them) is that
entity's fault: it is logged with its traceback the first time (a line at debug level on
the passes after, until it succeeds again), the entity's ``on_fault`` records why (the
attempt's or job's reason, which ``show`` prints), and the pass goes on with the others.
A defect in the loop itself is outside any of these and still stops the daemon.

A step after the launches that no job depends on (the energy levers, co-location moves)
runs in ``OncePerReason.step``: any failure there, the store's too, is logged once per
reason and the pass's other steps run: the jobs come first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from orchestrator.errors import DaemonError, GridshiftError, StoreError, translate

log = logging.getLogger(__name__)


def _everyones(exc: BaseException) -> bool:
    """A fault of the store or the lease: every entity's, not one's."""
    if not isinstance(exc, Exception):
        return True  # KeyboardInterrupt, SystemExit, a simulated crash
    return isinstance(translate(exc), StoreError | DaemonError)


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Faults:
    """Entities whose work failed, until it succeeds again."""

    def __init__(self) -> None:
        self.failing: dict[Hashable, str] = {}

    def report(self, entity: Hashable, why: str) -> None:
        """A fault found, not raised (a row that cannot be believed): logged once,
        until the entity is well again (``contained`` succeeding for it)."""
        if entity not in self.failing:
            log.error("%s (skipped; the pass goes on)", why)
            self.failing[entity] = why

    @contextmanager
    def contained(
        self, entity: Hashable, what: str, on_fault: Callable[[str], None] | None = None
    ) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if _everyones(exc):
                raise
            why = f"{what}: {describe(exc)}"
            if entity not in self.failing:
                log.error("%s (skipped; the pass goes on)", why, exc_info=exc)
                self.failing[entity] = why
                if on_fault is not None:
                    try:
                        on_fault(why)
                    except Exception as inner:  # recording it failed too: logged, go on
                        if _everyones(inner):
                            raise
                        log.error("%s: cannot record the fault: %s", entity, describe(inner))
            else:
                log.debug("%s (again)", why)
        else:
            if self.failing.pop(entity, None) is not None:
                log.info("%s: %s works again", entity, what)


class OncePerReason:
    """A step no job depends on: a failure (any) is logged once per reason, with its
    traceback unless it is gridshift's own, and swallowed (``step``)."""

    def __init__(self, logger: logging.Logger, what: str, then: str) -> None:
        self.logger, self.what, self.then = logger, what, then
        self.said: str | None = None  # the failure last logged

    @contextmanager
    def step(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            if why != self.said:
                self.logger.error("%s: %s (%s)", self.what, why, self.then,
                                  exc_info=not isinstance(exc, GridshiftError))  # fmt: skip
                self.said = why
        else:
            self.said = None
