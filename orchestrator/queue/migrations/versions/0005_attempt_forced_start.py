"""attempt.forced_g and attempt.forced_wh: a start a deadline forced against the budget, and
what it was expected to spend (g CO2e and Wh), for ``show`` and ``budget``; an index on
job.submitted_at, for the recent load the planner reads every pass; job.checkpoint_s: the
run time a suspension costs the job (``submit --checkpoint-cost``; null: the lab's
``daemon.checkpoint_cost``) (issue 21).

Revision 0005, after 0004.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("forced_g", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("forced_wh", sa.Float(), nullable=True))
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_s", sa.Float(), nullable=True))
    op.create_index(op.f("ix_job_submitted_at"), "job", ["submitted_at"], unique=False)


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
