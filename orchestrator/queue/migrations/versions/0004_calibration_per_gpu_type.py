"""Calibration per GPU type and owner: each attempt records the GPU model it ran on
(``attempt.gpu_model``), and what runs of a name measured is kept per width, GPU model
and user (``calibration.gpu_model`` and ``calibration.uid`` join its primary key; rows
learnt before are of an unknown model, ``""``, and of no known owner, uid -1, which no
job has: they are kept but used by no one, since one user's runs must not set another's
estimates). Issue 21: durations learned per GPU type and width.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NO_OWNER = -1  # the uid of rows learnt before owners were recorded: no job's
_COLUMNS = "name, gpus, throughput_per_s, power_w_per_gpu, samples, updated_at"


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_model", sa.String(), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":  # no primary key to alter: copy, drop, rename
        op.create_table(
            "calibration_new",
            sa.Column("name", sa.String(), primary_key=True, nullable=False),
            sa.Column("gpus", sa.Integer(), primary_key=True, nullable=False),
            sa.Column("gpu_model", sa.String(), primary_key=True, nullable=False),
            sa.Column("uid", sa.Integer(), primary_key=True, nullable=False),
            sa.Column("throughput_per_s", sa.Float(), nullable=False),
            sa.Column("power_w_per_gpu", sa.Float(), nullable=True),
            sa.Column("samples", sa.Integer(), nullable=False),
            sa.Column("updated_at", sa.DateTime(), nullable=False),
        )
        op.execute(
            f"INSERT INTO calibration_new (gpu_model, uid, {_COLUMNS}) "
            f"SELECT '', {NO_OWNER}, {_COLUMNS} FROM calibration"
        )
        op.drop_table("calibration")
        op.rename_table("calibration_new", "calibration")
        return
    pk = sa.inspect(bind).get_pk_constraint("calibration")["name"] or "calibration_pkey"
    op.add_column(
        "calibration",
        sa.Column("gpu_model", sa.String(), nullable=False, server_default=""),
    )
    op.add_column(
        "calibration",
        sa.Column("uid", sa.Integer(), nullable=False, server_default=str(NO_OWNER)),
    )
    op.alter_column("calibration", "uid", server_default=None)  # new rows say whose
    op.drop_constraint(pk, "calibration", type_="primary")
    op.create_primary_key(pk, "calibration", ["name", "gpus", "gpu_model", "uid"])


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
