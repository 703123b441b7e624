"""attempt.backfilled_until: a job that started ahead of a blocked one (backfill) started on
the promise that it gives its GPUs back by then (its run time, and a grace); past it, its
end counts as unknown for reservations, and it is stopped (checkpointed, if it may be)
while a job it passed still waits (issue 23).

Revision 0009, after 0008 (attempt.resize_to).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backfilled_until", sa.DateTime(), nullable=True))


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
