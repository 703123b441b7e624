"""What every command needs, loaded lazily: settings, database, the current user, and
``call``: one request to the daemon's socket, or (single-user, no daemon serving) the
same request answered in this process."""

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
        from orchestrator.queue.ownership import prepare_home

        return prepare_home(self.settings)

    @cached_property
    def db(self):
        """The database at this gridshift's schema (a new one is created so; an older or
        newer one is one line: ``gridshift db upgrade``)."""
        db = self.unchecked_db
        db.ensure_schema()
        return db

    @cached_property
    def unchecked_db(self):
        """The database as it is, for ``gridshift db``."""
        from orchestrator.queue.db import Database
        from orchestrator.signals.redact import remember_url

        remember_url(self.settings.db_url)  # hidden from every error line and log record
        layout = self.layout
        return Database(self.settings.db_url, file_mode=layout.file_mode, group_gid=layout.gid)

    @cached_property
    def user(self):
        from orchestrator.queue.ownership import current_user

        return current_user()

    def call(self, op: str, args: dict):
        """The answer to one request: from the daemon serving this queue's socket, else
        (single-user only) from this process, through the same handler and JSON."""
        from orchestrator.api.client import NoDaemon, locate, request

        where = locate(self.config_path)
        if where is not None:
            try:
                return request(where.socket, op, args)
            except NoDaemon:
                if where.shared:
                    raise
        _load_in_process_layers(self)
        if self.settings.shared_group is not None:
            raise NoDaemon(f"no gridshift daemon serves {self.settings.socket_path}")
        return self.answer_here(op, args)

    def answer_here(self, op: str, args: dict):
        import json

        from orchestrator.daemon.ops import handle
        from orchestrator.daemon.ops.base import Caller, OpContext

        def running() -> bool:
            from orchestrator.daemon.lease import daemon_running

            return daemon_running(self.settings, self.db)

        ops = OpContext(self.settings, open_db=lambda: self.db, daemon_running=running)
        # through JSON as the socket would: one shape of answer on both paths
        return json.loads(json.dumps(handle(ops, Caller.this_process(), op, args)))


def _load_in_process_layers(c: CliContext) -> None:
    """The settings, the store and the request handlers, loaded with the cyclic garbage
    collector paused: pydantic and SQLAlchemy build some hundred thousand objects and no
    garbage, and the collector's passes over them were a tenth of a command answered
    without a daemon (~40 ms of ~0.44 s CPU)."""
    import gc
    import sys

    if "orchestrator.queue.store" in sys.modules:
        return  # loaded (and frozen) once per process: later objects are collected as usual
    was_on = gc.isenabled()
    gc.disable()
    try:
        if c.settings.shared_group is None:  # a shared queue is the daemon's alone
            import orchestrator.daemon.ops
            import orchestrator.queue.store  # noqa: F401
    finally:
        # what they built lives as long as the process: never scan it again (once: a
        # second freeze would keep an earlier command's database engine, and its
        # connections, alive for good where one process runs several commands)
        gc.freeze()
        if was_on:
            gc.enable()


def get(ctx: typer.Context) -> CliContext:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = CliContext()
    return root.obj
