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

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    InterfaceError,
    InternalError,
    NoSuchModuleError,
    OperationalError,
)
from sqlmodel import Session, SQLModel

from orchestrator import models  # noqa: F401 - registers the tables
from orchestrator.errors import ConfigError, StoreError

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
            raise ConfigError(f"invalid database URL {url!r}") from None
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
                f"database URL {url!r} needs a driver that is not "
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
        """Create missing tables, and add the nullable columns a newer gridshift added to
        existing ones (the only schema change it makes); safe when many processes do it at
        once."""
        with self._translate():
            if not self._missing():
                return
            with self._writer.begin() as conn:
                if not self.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(774411)"))
                SQLModel.metadata.create_all(conn)
                for table in SQLModel.metadata.sorted_tables:
                    existing = {c["name"] for c in inspect(conn).get_columns(table.name)}
                    for column in table.columns:
                        if column.name in existing:
                            continue
                        kind = column.type.compile(dialect=conn.dialect)
                        conn.execute(
                            text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}')
                        )

    def _missing(self) -> bool:
        with self._reader.connect() as conn:
            found = inspect(conn)
            names = set(found.get_table_names())
            for table in SQLModel.metadata.sorted_tables:
                if table.name not in names:
                    return True
                columns = {c["name"] for c in found.get_columns(table.name)}
                if any(c.name not in columns for c in table.columns):
                    return True
        return False

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
        return make_url(self.url).render_as_string(hide_password=True)

    def dispose(self) -> None:
        self._reader.dispose()
        self._writer.dispose()


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
