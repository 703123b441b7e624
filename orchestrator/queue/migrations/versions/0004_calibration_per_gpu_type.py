"""Calibration per GPU type: each attempt records the GPU model it ran on
(``attempt.gpu_model``), and what runs of a name measured is kept per width and GPU
model (``calibration.gpu_model`` joins its primary key; rows learnt before are of an
unknown model, ``""``). Issue 21: durations learned per GPU type and width.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

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
            sa.Column("throughput_per_s", sa.Float(), nullable=False),
            sa.Column("power_w_per_gpu", sa.Float(), nullable=True),
            sa.Column("samples", sa.Integer(), nullable=False),
            sa.Column("updated_at", sa.DateTime(), nullable=False),
        )
        op.execute(
            f"INSERT INTO calibration_new (gpu_model, {_COLUMNS}) "
            f"SELECT '', {_COLUMNS} FROM calibration"
        )
        op.drop_table("calibration")
        op.rename_table("calibration_new", "calibration")
        return
    pk = sa.inspect(bind).get_pk_constraint("calibration")["name"] or "calibration_pkey"
    op.add_column(
        "calibration",
        sa.Column("gpu_model", sa.String(), nullable=False, server_default=""),
    )
    op.drop_constraint(pk, "calibration", type_="primary")
    op.create_primary_key(pk, "calibration", ["name", "gpus", "gpu_model"])


def downgrade() -> None:
    # gridshift does not go back: restore the backup `gridshift db upgrade` made
    raise NotImplementedError("restore the backup taken by gridshift db upgrade")
