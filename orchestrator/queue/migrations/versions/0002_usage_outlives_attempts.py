"""Usage rows outlive their attempts: no foreign key from usage.attempt_id to attempt.

``gridshift clean`` removes finished jobs and their attempts; the per-day usage rows stay,
the queue's ledger that carbon budgets add up (a budget must not forget what was spent
when old jobs are cleaned).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# SQLite's foreign keys have no names: batch mode names them by this convention to drop one
_NAMES = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def upgrade() -> None:
    bind = op.get_bind()
    keys = [
        fk for fk in sa.inspect(bind).get_foreign_keys("usage") if fk["referred_table"] == "attempt"
    ]
    if not keys:
        return
    if bind.dialect.name == "sqlite":  # copy, drop, rename: the index comes along
        with op.batch_alter_table("usage", naming_convention=_NAMES) as batch:
            batch.drop_constraint("fk_usage_attempt_id_attempt", type_="foreignkey")
    else:
        for fk in keys:
            op.drop_constraint(fk["name"], "usage", type_="foreignkey")


def downgrade() -> None:
    raise NotImplementedError("gridshift does not go back: restore the backup db upgrade made")
