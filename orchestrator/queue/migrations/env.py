"""Alembic's entry: runs the migrations on the connection ``orchestrator.queue.schema``
hands over (inside its transaction, under its lock)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from orchestrator.queue import models  # the tables, for autogenerate


def _render_item(kind: str, obj, autogen_context):
    """Migrations name plain SQLAlchemy types, never the models' (which will change)."""
    if kind == "type" and isinstance(obj, models.UTCDateTime):
        return "sa.DateTime()"
    if kind == "type" and type(obj).__name__ == "AutoString":
        return "sa.String()"
    return False


connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters by copying
    compare_type=True,
    render_item=_render_item,
)
with context.begin_transaction():
    context.run_migrations()
