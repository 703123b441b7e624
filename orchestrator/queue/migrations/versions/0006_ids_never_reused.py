"""Job and attempt ids are never reused: AUTOINCREMENT on SQLite.

Without it SQLite gives the next row the highest id in the table plus one, so once
``gridshift clean`` removed the newest job its id and its attempt's came back, and the new
attempt's usage rows overwrote the cleaned one's in the ledger budgets add up (and met its
log or run directory, had one been left). The tables are rebuilt with AUTOINCREMENT and
``sqlite_sequence`` starts at the highest id any row still names, so ids cleaned before
this upgrade do not come back either. PostgreSQL's sequences never go back: nothing to do.

Revision 0006, after 0005.
"""

from __future__ import annotations

from alembic import op

from orchestrator.errors import SchemaError

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# every column naming a job or attempt id, the table's own first
_NAMED_BY = {
    "job": [
        ("job", "id"),
        ("usage", "job_id"),
        ("attempt", "job_id"),
        ("event", "job_id"),
        ("attemptevent", "job_id"),
        ("dependency", "job_id"),
        ("dependency", "after_id"),
    ],
    "attempt": [("attempt", "id"), ("usage", "attempt_id"), ("attemptevent", "attempt_id")],
}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    violations = set(bind.exec_driver_sql("PRAGMA foreign_key_check").fetchall())
    # Rebuilding a table others refer to drops it while they still name it: the checks
    # wait until the rebuilt table has its name back (foreign_keys cannot be turned off
    # inside the upgrade's transaction), then their count is reset and the keys checked.
    op.execute("PRAGMA defer_foreign_keys=ON")
    for table in _NAMED_BY:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ):
            pass
    op.execute("PRAGMA defer_foreign_keys=OFF")
    if set(bind.exec_driver_sql("PRAGMA foreign_key_check").fetchall()) - violations:
        raise SchemaError("rebuilding the job and attempt tables broke a foreign key")
    for table, columns in _NAMED_BY.items():
        highest = " UNION ALL ".join(f"SELECT max({c}) AS n FROM {t}" for t, c in columns)
        op.execute(f"DELETE FROM sqlite_sequence WHERE name = '{table}'")
        op.execute(
            f"INSERT INTO sqlite_sequence (name, seq) "
            f"SELECT '{table}', coalesce(max(n), 0) FROM ({highest})"
        )


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
