"""Baseline: the schema as gridshift created it before migrations (issue 20).

A database made by ``ensure_schema`` of that or an older gridshift has no version table;
this revision brings it to the baseline: it creates the tables it lacks and adds the
columns and indexes it lacks (older gridshifts added new columns as nullable, so they are
added nullable here too, as they would have been), then Alembic records the revision.
On an empty database it creates everything. The tables are written out here, frozen:
never import the models in a migration.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_meta = sa.MetaData()
S, N, F, B, J, T = sa.String, sa.Integer, sa.Float, sa.Boolean, sa.JSON, sa.DateTime


def _col(name: str, kind, nullable: bool = True, **kw) -> sa.Column:
    return sa.Column(name, kind(), nullable=nullable, **kw)


def _pk(name: str, kind=N) -> sa.Column:
    return sa.Column(name, kind(), primary_key=True, nullable=False)


sa.Table(
    "calibration", _meta, _pk("name", S), _pk("gpus"),
    _col("throughput_per_s", F, False), _col("power_w_per_gpu", F),
    _col("samples", N, False), _col("updated_at", T, False),
)  # fmt: skip
sa.Table(
    "crontemplate", _meta, _pk("id"), _col("cron", S, False), _col("window_s", F, False),
    _col("spec", J, False), _col("env", J, False), _col("user", S, False),
    _col("uid", N, False), _col("created_at", T, False), _col("last_fire", T),
    _col("removed_at", T),
)  # fmt: skip
sa.Table(
    "health", _meta, _pk("id"), _col("pid", N, False), _col("started_at", T, False),
    _col("last_tick", T, False), _col("data", J, False),
)  # fmt: skip
sa.Table(
    "job", _meta, _pk("id"), _col("name", S), _col("state", S, False, index=True),
    _col("reason", S), _col("user", S, False), _col("uid", N, False),
    _col("command", J, False), _col("workdir", S, False), _col("env", J, False),
    _col("gpus_min", N, False), _col("gpus_max", N, False), _col("duration_s", F),
    _col("deadline", T), _col("interruptible", B, False), _col("priority", N, False),
    _col("labels", J, False), _col("submitted_at", T, False), _col("started_at", T),
    _col("finished_at", T), _col("exit_code", N), _col("node", S),
    _col("gpu_ids", J, False), _col("energy_j", F), _col("carbon_g", F), _col("cost", F),
    _col("energy_modelled", B), _col("cancel_requested_at", T),
    _col("attempts", N, False), _col("planned_start", T), _col("plan_note", S),
    _col("cron_id", N, index=True),
)  # fmt: skip
sa.Table(
    "lease", _meta, _pk("name", S), _col("holder", J, False), _col("epoch", N, False),
    _col("acquired_at", T, False), _col("expires_at", T, False),
)  # fmt: skip
sa.Table(
    "node", _meta, _pk("name", S), _col("executor", S, False), _col("gpus", N, False),
    _col("gpu_model", S), _col("rack", S), _col("host", S), _col("gpu_source", S, False),
    _col("updated_at", T, False), _col("reachable", B), _col("last_seen", T),
    _col("error", S),
)  # fmt: skip
sa.Table(
    "attempt", _meta, _pk("id"),
    sa.Column("job_id", N(), sa.ForeignKey("job.id"), nullable=False, index=True),
    _col("number", N, False), _col("state", S, False, index=True), _col("node", S, False),
    _col("gpu_ids", J, False), _col("run_dir", S, False), _col("handle", J),
    _col("run_as_uid", N), _col("started_at", T), _col("finished_at", T),
    _col("exit_code", N), _col("signal", N), _col("energy_j", F), _col("progress_done", F),
    _col("progress_total", F), _col("progress_at", T), _col("term_sent_at", T),
    _col("kill_sent_at", T), _col("detail", S), _col("cap", F), _col("planned_until", T),
    _col("suspend_sent_at", T), _col("stopped_at", T), _col("carbon_g", F), _col("cost", F),
    _col("energy_modelled", B), _col("accounted_until", T),
)  # fmt: skip
sa.Table(
    "dependency", _meta,
    sa.Column("job_id", N(), sa.ForeignKey("job.id"), primary_key=True),
    sa.Column("after_id", N(), sa.ForeignKey("job.id"), primary_key=True, index=True),
)  # fmt: skip
sa.Table(
    "event", _meta, _pk("id"),
    sa.Column("job_id", N(), sa.ForeignKey("job.id"), nullable=False, index=True),
    _col("at", T, False), _col("from_state", S), _col("to_state", S, False),
    _col("reason", S), _col("actor", S),
)  # fmt: skip
sa.Table(
    "gpu", _meta, sa.Column("node", S(), sa.ForeignKey("node.name"), primary_key=True),
    _pk("index"), _col("uuid", S, False), _col("model", S, False), _col("memory_mb", N),
    _col("memory_used_mb", N), _col("utilization_pct", F), _col("power_draw_w", F),
    _col("power_limit_w", F), _col("power_default_w", F), _col("power_min_w", F),
    _col("power_max_w", F),
)  # fmt: skip
sa.Table(
    "attemptevent", _meta, _pk("id"),
    sa.Column("attempt_id", N(), sa.ForeignKey("attempt.id"), nullable=False, index=True),
    _col("job_id", N, False, index=True), _col("at", T, False), _col("from_state", S),
    _col("to_state", S, False), _col("reason", S),
)  # fmt: skip
sa.Table(
    "usage", _meta,
    sa.Column("attempt_id", N(), sa.ForeignKey("attempt.id"), primary_key=True),
    sa.Column("day", T(), primary_key=True), _col("job_id", N, False, index=True),
    _col("energy_j", F, False), _col("carbon_g", F, False), _col("cost", F),
)  # fmt: skip


def _index_name(index: sa.Index) -> str:
    return f"ix_{index.table.name}_{index.columns[0].name}"


for _table in _meta.tables.values():
    for _index in _table.indexes:
        _index.name = _index_name(_index)  # as SQLModel names them: ix_<table>_<column>


def upgrade() -> None:
    bind = op.get_bind()
    found = sa.inspect(bind)
    existing = set(found.get_table_names())
    for table in _meta.sorted_tables:
        if table.name not in existing:
            table.create(bind)  # with its indexes
            continue
        columns = {c["name"] for c in found.get_columns(table.name)}
        for column in table.columns:
            if column.name not in columns:
                op.add_column(table.name, sa.Column(column.name, column.type, nullable=True))
        indexes = {i["name"] for i in found.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                op.create_index(index.name, table.name, [c.name for c in index.columns])


def downgrade() -> None:
    raise NotImplementedError("gridshift does not go back: restore the backup db upgrade made")
