"""Requests: each command's logic as the daemon answers it on its socket, and as the CLI
runs it in-process in single-user mode when no daemon serves the queue (one code path
for both). A handler takes the context, the caller (identity from the kernel, never from
the request) and the request's arguments, and returns what the command's ``--json``
prints (plus, where the text output needs more, a few keys the CLI strips)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.daemon.ops.base import Args, Caller, OpContext

Handler = Callable[["OpContext", "Caller", "Args"], Any]


def _handlers() -> dict[str, Handler]:
    from orchestrator.daemon.ops import (
        accounts,
        cluster,
        crons,
        jobpower,
        jobs,
        planops,
        retention,
        verbs,
    )

    return {
        "ping": lambda ctx, caller, args: {"pid": os.getpid()},
        "submit": jobs.submit,
        "cancel": jobs.cancel,
        "ls": jobs.ls,
        "show": jobs.show,
        "logs": jobs.logs,
        "cron_ls": crons.cron_ls,
        "cron_rm": crons.cron_rm,
        "status": accounts.status,
        "budget": accounts.budget,
        "report": accounts.report,
        "plan": planops.plan,
        "nodes": cluster.nodes,
        "clean": retention.clean,
        "job_power": jobpower.job_power,
        "hold": verbs.hold,
        "release": verbs.release,
        "restart": verbs.restart,
        "edit": verbs.edit,
        "states": verbs.states,
    }


def handle(ctx: OpContext, caller: Caller, op: str, args: dict) -> Any:
    """Answer one request; a GridshiftError for anything refused or wrong."""
    from orchestrator.api.protocol import ProtocolError
    from orchestrator.daemon.ops.base import Args

    handler = _handlers().get(op)
    if handler is None:
        raise ProtocolError(f"unknown request {op!r}")
    return handler(ctx, caller, Args(args))
