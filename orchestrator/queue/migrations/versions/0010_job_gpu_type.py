"""job.gpu_type: the GPU type a job asked for (``submit --gpu-type v100``; NULL: any type,
the daemon chooses among the free ones) (issue 24).

Revision 0010, after 0009 (attempt.backfilled_until).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_type", sa.String(), nullable=True))


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
