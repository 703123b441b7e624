"""The database: engines, schema creation and transactions that many processes share.

SQLite (the default) runs in WAL mode, so readers never wait for a writer. Every write
transaction starts with ``BEGIN IMMEDIATE``: writers queue on SQLite's busy timeout
instead of failing with "database is locked" when two try to upgrade a read lock at once.
A PostgreSQL URL (``postgresql+psycopg://...``) works with the same code.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    InterfaceError,
    InternalError,
    NoSuchModuleError,
    OperationalError,
)
from sqlmodel import Session

from orchestrator.errors import ConfigError, StoreError
from orchestrator.queue import models, schema  # noqa: F401 - models: registers the tables

BUSY_TIMEOUT_MS = 60_000
# PostgreSQL ends a session left idle inside a transaction this long: a frozen client (a
# hung host, a stopped process) cannot hold row locks, the daemon lease's among them, for
# ever. gridshift's transactions are short and never wait on anything outside the database.
PG_IDLE_IN_TRANSACTION_MS = 10_000
_LOCKED_RETRIES = 5


class Database:
    def __init__(self, url: str, *, file_mode: int = 0o600, group_gid: int | None = None):
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise ConfigError(f"invalid database URL {shown_url(url)!r}") from None
        self.url = url
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        try:
            if self.is_sqlite:
                path = parsed.database
                if path and path != ":memory:":
                    _create_private_file(Path(path), file_mode, group_gid)
                self._reader = self._sqlite_engine(url, immediate=False)
                self._writer = self._sqlite_engine(url, immediate=True)
            else:
                options = f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_MS}"
                connect_args = (
                    {"options": options} if parsed.get_backend_name() == "postgresql" else {}
                )
                self._reader = self._writer = create_engine(
                    url, pool_pre_ping=True, connect_args=connect_args
                )
        except (NoSuchModuleError, ImportError) as exc:
            raise ConfigError(
                f"database URL {self.safe_url!r} needs a driver that is not "
                f"installed ({exc}); for PostgreSQL: pip install "
                "'gridshift[postgres]'"
            ) from None

    @staticmethod
    def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # SQLAlchemy's begin event issues BEGIN
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    # -- schema -------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Use the database only at this gridshift's schema revision: an empty one is
        created at it (safe when many processes do it at once); a legacy, older or newer
        one is a ``SchemaError`` saying what to do (``gridshift db upgrade``)."""
        status = self.schema_status()
        if status.state == "empty":
            schema.load_tools()
            with self._translate(), self._writer.begin() as conn:
                schema.lock(conn)
                status = schema.read_status(conn)
                if status.state == "empty":
                    schema.create_at_head(conn)
                    return
        schema.require_up_to_date(status, self.safe_url)

    def schema_status(self) -> schema.SchemaStatus:
        with self._translate(), self._reader.connect() as conn:
            return schema.read_status(conn)

    def upgrade_schema(self) -> None:
        """Run the migrations it lacks, in one transaction (all or none where the backend
        allows: PostgreSQL and SQLite both change their schema in transactions)."""
        status = self.schema_status()
        if status.state == "newer":
            schema.require_up_to_date(status, self.safe_url)
        schema.load_tools()
        with self._translate(), self._writer.begin() as conn:
            schema.lock(conn)
            schema.upgrade(conn)

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file, or None (PostgreSQL, or an in-memory database)."""
        path = make_url(self.url).database if self.is_sqlite else None
        return Path(path) if path and path != ":memory:" else None

    # -- transactions -------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._translate(), Session(self._reader, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed when the block ends, rolled back on error."""
        with (
            self._translate(),
            Session(self._writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    def write_retrying(self, fn):
        """Run ``fn(session)`` in a write transaction, retried when SQLite reports a lock
        that outlasted the busy timeout (rare, e.g. during a WAL checkpoint)."""
        for attempt in range(_LOCKED_RETRIES):
            try:
                with self.write() as session:
                    return fn(session)
            except StoreError as exc:
                if "locked" not in str(exc) or attempt == _LOCKED_RETRIES - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InternalError, InterfaceError) as exc:
            # the server or the connection (e.g. a session PostgreSQL ended), not our data
            detail = " ".join(str(exc.orig).split())  # drivers add newlines and hints
            raise StoreError(f"database error ({self.safe_url}): {detail}") from exc
        except sqlite3.Error as exc:  # pragma: no cover - raw driver errors
            raise StoreError(f"database error ({self.safe_url}): {exc}") from exc

    @property
    def safe_url(self) -> str:
        """The URL with any password hidden, for messages."""
        return shown_url(self.url)

    def dispose(self) -> None:
        self._reader.dispose()
        self._writer.dispose()


def shown_url(url: str) -> str:
    """A database URL as it may be shown: its password hidden (all before the host when
    the URL cannot even be parsed)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        parsed = None
    if parsed is not None and "@" not in (parsed.host or ""):  # an unquoted @ in a password
        return parsed.render_as_string(hide_password=True)
    head, at, host = url.rpartition("@")
    if not at:
        return url
    scheme = head.split("://", 1)[0] + "://" if "://" in head else ""
    return f"{scheme}***@{host}"


def _create_private_file(path: Path, mode: int, gid: int | None) -> None:
    """Create the SQLite file with its final permissions before SQLite opens it; SQLite
    gives the -wal and -shm files the same mode and owner."""
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreError(f"cannot create the database {path}: {exc.strerror}") from None
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)  # the umask may have narrowed it
    finally:
        os.close(fd)
