"""The daemon lease: which daemon serves a queue kept in PostgreSQL.

Daemons on several hosts may point at one database. One row (``lease``, name "daemon")
says who serves it and until when; the holder renews it at every pass, the others stand
by and take over once it expires. Times are the database server's, so the hosts' clocks
need not agree. Every launch checks the lease in its own transaction, with the row locked
(``SELECT ... FOR UPDATE``), so a daemon that stalled past its lease and woke up cannot
start a job: the takeover and the launch cannot interleave, and ``epoch`` (bumped at every
takeover) tells a daemon that it was replaced even if it got the row back later.

A holder on this very host whose process is gone (SIGKILL, a crash) is known dead at
once: its lease is taken over without waiting for it to expire.

SQLite queues live on one host and use the daemon's ``flock`` instead.
"""

from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from executors.procs import ProcessId, is_alive, self_id
from orchestrator.errors import DaemonError
from orchestrator.queue.db import Database
from orchestrator.queue.models import Lease
from orchestrator.settings import Settings

NAME = "daemon"


class LeaseLost(DaemonError):
    """This daemon no longer holds the lease: another one serves the queue."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def me() -> dict[str, Any]:
    ident = self_id()
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": ident.pid,
        "start_ticks": ident.start_ticks,
    }


def describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"


def dead_here(holder: dict[str, Any]) -> bool:
    """True when the holder ran on this host (this boot) and its process is gone."""
    if holder.get("host") != socket.gethostname() or holder.get("boot") != _boot_id():
        return False
    try:
        proc = ProcessId(int(holder["pid"]), int(holder["start_ticks"]))
    except (KeyError, TypeError, ValueError):
        return False
    return not is_alive(proc)


def db_now(session: Session) -> datetime:
    """The database server's clock (this host's for SQLite)."""
    if session.get_bind().dialect.name == "sqlite":
        return datetime.now(UTC)
    value = session.execute(text("SELECT clock_timestamp()")).scalar_one()  # not the txn start
    return value.astimezone(UTC)


@dataclass
class DaemonLease:
    db: Database
    ttl_s: float
    holder: dict[str, Any] = field(default_factory=me)
    epoch: int | None = None  # set while held

    def try_acquire(self) -> Lease | None:
        """Take the lease if it is free, expired, ours or its holder died on this host.
        Returns None when held now, else the row of the daemon that holds it."""
        try:
            with self.db.write() as session:
                row = session.get(Lease, NAME, with_for_update=True)
                now = db_now(session)  # after the lock: it may have waited for it
                if row is None:
                    row = Lease(name=NAME, acquired_at=now, expires_at=now)
                elif not (
                    row.holder == self.holder or row.expires_at <= now or dead_here(row.holder)
                ):
                    session.expunge(row)
                    return row
                row.holder, row.epoch = self.holder, row.epoch + 1
                row.acquired_at, row.expires_at = now, now + timedelta(seconds=self.ttl_s)
                session.add(row)
                epoch = row.epoch
        except IntegrityError:  # another daemon inserted the first row at the same moment
            with self.db.read() as session:
                return session.get(Lease, NAME)
        self.epoch = epoch
        return None

    def _mine(self, row: Lease | None) -> bool:
        return row is not None and row.holder == self.holder and row.epoch == self.epoch

    def renew(self) -> None:
        """Extend the lease; raises LeaseLost when another daemon took it over."""
        with self.db.write() as session:
            row = session.get(Lease, NAME, with_for_update=True)
            if not self._mine(row):
                self.epoch = None
                who = describe(row.holder) if row is not None else "nobody"
                raise LeaseLost(f"the lease was taken over by {who}")
            row.expires_at = db_now(session) + timedelta(seconds=self.ttl_s)
            session.add(row)

    def check(self, session: Session) -> None:
        """Inside a write transaction: raise LeaseLost unless the lease is still ours and
        unexpired; the row stays locked until that transaction ends."""
        row = session.get(Lease, NAME, with_for_update=True, populate_existing=True)
        if not self._mine(row) or row.expires_at <= db_now(session):
            raise LeaseLost("this daemon's lease expired or was taken over")

    def release(self) -> None:
        """Hand the lease back at once (a clean stop): a standing-by daemon need not wait."""
        if self.epoch is None:
            return
        with self.db.write() as session:
            row = session.get(Lease, NAME, with_for_update=True)
            if self._mine(row):
                row.expires_at = db_now(session)
                session.add(row)
        self.epoch = None


def current_holder(db: Database) -> dict[str, Any] | None:
    """The daemon serving this database now, or None (no lease, expired, or dead)."""
    with db.read() as session:
        row = session.get(Lease, NAME)
        if row is None or row.expires_at <= db_now(session) or dead_here(row.holder):
            return None
        return dict(row.holder)


def daemon_running(settings: Settings, db: Database) -> bool:
    """True when some daemon serves this queue (holds its lock, or its lease)."""
    if not db.is_sqlite:
        return current_holder(db) is not None
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
