"""Right-sizing on the live daemon (issue 24): each node's power state (on, off, waking,
powering off, wake failed), since when, the last power command's failure and how far its
idle energy is accounted (``node.idle_until``); the ``idle_usage`` ledger of idle energy
per node and UTC day.

Revision 0012, after 0011 (job.share).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("power_state", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("power_since", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("power_error", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("idle_until", sa.DateTime(), nullable=True))
    op.create_table(
        "idle_usage",
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("day", sa.DateTime(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("carbon_g", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("node", "day"),
    )


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
