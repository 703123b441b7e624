"""What every command needs, loaded lazily: settings, database, the current user."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import typer


@dataclass
class CliContext:
    config_path: Path | None = None
    _db: object | None = field(default=None, repr=False)

    @cached_property
    def settings(self):
        from orchestrator.settings import load_settings

        return load_settings(self.config_path)

    @cached_property
    def layout(self):
        from orchestrator.ownership import prepare_home

        return prepare_home(self.settings)

    @cached_property
    def db(self):
        from orchestrator.db import Database

        layout = self.layout
        db = Database(self.settings.db_url, file_mode=layout.file_mode, group_gid=layout.gid)
        db.ensure_schema()
        return db

    @cached_property
    def user(self):
        from orchestrator.ownership import current_user

        return current_user()


def get(ctx: typer.Context) -> CliContext:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = CliContext()
    return root.obj
