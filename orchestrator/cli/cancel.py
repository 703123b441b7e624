"""``gridshift cancel``."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context


def cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[int], typer.Argument(help="Job ids.", show_default=False)],
) -> None:
    """Cancel jobs (yours; root may cancel any).

    A running job gets SIGTERM on its process group, then SIGKILL after the grace period
    (cancel_grace_s)."""
    from orchestrator import store
    from orchestrator.daemon import daemon_running
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    outcome = store.cancel(c.db, job_ids, user=c.user, now=utc_now())
    stopping = any(result == "stopping" for _, result in outcome)
    no_daemon = stopping and not daemon_running(c.settings, c.db)
    for job_id, result in outcome:
        if result == "stopping":
            result = f"stopping (SIGTERM, then SIGKILL after {c.settings.cancel_grace_s:g}s" + (
                "; no daemon is running, so when one starts)" if no_daemon else ")"
            )
        typer.echo(f"job {job_id}: {result}")
