"""job.share: the job may run on one GPU with another job that may (co-location, issue 24:
``submit --share``).

Revision 0011, after 0010 (job.gpu_type).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        # NULL on the rows before it: they did not ask (as false)
        batch_op.add_column(sa.Column("share", sa.Boolean(), nullable=True))


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
