"""The ``idle_usage`` ledger per node and UTC hour, not per UTC day, so that ``report
--since`` counts idle energy from the hour of ``--since`` on: its key column ``day``
becomes ``hour``. The rows written before keep their energy and carbon under their day's
00:00, where each holds its whole day (hours written since may add to it).

Revision 0013, after 0012 (node power state, idle_usage per day).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite: the table is copied under the new name of its column (the key follows it);
    # PostgreSQL: ALTER TABLE ... RENAME COLUMN, which the primary key follows
    with op.batch_alter_table("idle_usage", schema=None) as batch_op:
        batch_op.alter_column(
            "day", new_column_name="hour", existing_type=sa.DateTime(), existing_nullable=False
        )


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
