"""attempt.resize_to: the width an elastic job starts again on, once the resize step's
SIGTERM has made it checkpoint and leave (issue 23): kept in the database, so that a
daemon restarted meanwhile starts it on that width and does not resize it again.

Revision 0008, after 0007 (attempt.parts).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resize_to", sa.Integer(), nullable=True))


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
