"""The database's schema version: which migration (``queue/migrations``, Alembic) a
database is at, a new database created at the newest, an older one upgraded.

A database is *empty* (no gridshift table: it is created at the newest revision directly),
*legacy* (made by ``ensure_schema`` of a gridshift before migrations: no version table),
*older* or *newer* than this gridshift, or *up to date*. Only an up-to-date database is
used; ``gridshift db upgrade`` brings a legacy or older one there, after a backup when it
is a SQLite file. The check on every open reads one row and imports no Alembic: the
revisions are the numbered files of ``migrations/versions``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, inspect, text

from orchestrator.errors import SchemaError, StoreError

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "alembic_version"
PG_LOCK_KEY = 774411  # one schema change at a time on a PostgreSQL server
# tables every gridshift made, since its first version: one of them means not empty
_OURS = frozenset({"job", "attempt", "event", "node", "health", "crontemplate"})
# Alembic's INFO lines ("setup plugin ...", from its import on) are not the user's
# business: gridshift says what it did in its own words
logging.getLogger("alembic").setLevel(logging.WARNING)
UPGRADE_HINT = "run `gridshift db upgrade` (it backs up a SQLite database first)"


def revisions() -> list[str]:
    """Every revision, oldest first: ``versions/NNNN_slug.py`` is revision NNNN."""
    names = (p.name for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
    return sorted(name.partition("_")[0] for name in names)


def head() -> str:
    return revisions()[-1]


@dataclass(frozen=True)
class SchemaStatus:
    current: str | None  # the revision recorded in the database (None: none recorded)
    head: str  # the newest this gridshift knows
    state: str  # "up to date", "empty", "legacy", "older" or "newer"

    @property
    def up_to_date(self) -> bool:
        return self.state == "up to date"

    def to_dict(self) -> dict:
        return {**asdict(self), "up_to_date": self.up_to_date}


def read_status(conn: Connection) -> SchemaStatus:
    known = revisions()
    # the tables in one query: asked apart ("is there a version table?", then "which
    # tables?"), another process creating the schema could commit in between, and a
    # fresh database read as a legacy one (seen on PostgreSQL with 8 first commands)
    names = set(inspect(conn).get_table_names())
    if VERSION_TABLE not in names:
        state = "legacy" if _OURS & names else "empty"
        return SchemaStatus(None, known[-1], state)
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    current = rows[0] if len(rows) == 1 else None
    if current == known[-1]:
        state = "up to date"
    elif current is None or current in known:
        state = "older"
    else:
        state = "newer"
    return SchemaStatus(current, known[-1], state)


def require_up_to_date(status: SchemaStatus, where: str) -> None:
    """Nothing else: one line saying what to do."""
    if status.state == "legacy":
        raise SchemaError(
            f"the database {where} was made by a gridshift before schema versions "
            f"(this one needs revision {status.head}): {UPGRADE_HINT}"
        )
    if status.state == "older":
        raise SchemaError(
            f"the database {where} is at schema revision {status.current}, this gridshift "
            f"needs {status.head}: {UPGRADE_HINT}"
        )
    if status.state == "newer":
        raise SchemaError(
            f"the database {where} is at schema revision {status.current!r}, newer than this "
            f"gridshift knows (up to {status.head}): install the gridshift that upgraded it"
        )


def lock(conn: Connection) -> None:
    """Serialise schema changes: SQLite's write transaction (BEGIN IMMEDIATE) already
    does; PostgreSQL takes an advisory lock until the transaction ends."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT pg_advisory_xact_lock({PG_LOCK_KEY})"))


def load_tools() -> None:
    """Import Alembic and the models before a schema transaction starts, not inside it:
    on a loaded machine these imports take seconds, during which PostgreSQL counts the
    session as idle in a transaction holding the schema lock (and ends it after
    ``PG_IDLE_IN_TRANSACTION_MS``), while every other process waits on that lock."""
    import alembic.command
    import alembic.config  # noqa: F401

    from orchestrator.queue import models  # noqa: F401


def create_at_head(conn: Connection) -> None:
    """An empty database: every table as the models say, recorded at the newest revision
    (what running every migration would make; tests/test_migrations.py checks)."""
    from alembic import command
    from sqlmodel import SQLModel

    from orchestrator.queue import models  # noqa: F401 - registers the tables

    SQLModel.metadata.create_all(conn)
    command.stamp(_config(conn), "head")


def upgrade(conn: Connection) -> None:
    """Run the migrations this database lacks, in the caller's transaction."""
    from alembic import command

    command.upgrade(_config(conn), "head")


def _config(conn: Connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["connection"] = conn
    return cfg


def backup_sqlite(path: Path, now: datetime | None = None) -> Path:
    """A consistent copy of the SQLite database (its WAL included) beside it, named
    ``<name>.backup-<UTC time>``, mode 0600, never over an existing file."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    for n in range(100):
        target = path.with_name(f"{path.name}.backup-{stamp}" + (f"-{n}" if n else ""))
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot back up the database to {target}: {exc.strerror}") from None
        os.fchmod(fd, 0o600)
        os.close(fd)
        break
    else:
        raise StoreError(f"cannot back up the database: too many backups named {target}")
    try:
        source, copy = sqlite3.connect(path, timeout=60), sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            source.close()
            copy.close()
    except sqlite3.Error as exc:
        target.unlink(missing_ok=True)
        raise StoreError(f"cannot back up the database to {target}: {exc}") from None
    return target


def new_revision(message: str) -> None:
    """For developers: the next migration, autogenerated from the models' difference with
    a scratch SQLite database built by the migrations so far."""
    import tempfile

    from alembic import command
    from sqlalchemy import create_engine

    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/scratch.db")
        with engine.begin() as conn:
            upgrade(conn)
            number = f"{int(head()) + 1:04d}"
            command.revision(_config(conn), message, autogenerate=True, rev_id=number)
        engine.dispose()


if __name__ == "__main__":  # python -m orchestrator.queue.schema revision "what changes"
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "revision":
        sys.exit('usage: python -m orchestrator.queue.schema revision "what changes"')
    new_revision(sys.argv[2])
