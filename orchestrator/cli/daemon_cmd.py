"""``gridshift daemon``: the dispatch loop."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context


def daemon(
    ctx: typer.Context,
    interval: Annotated[
        float | None,
        typer.Option(min=0.05, help="Seconds between passes (default: daemon_interval_s, 1)."),
    ] = None,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit once nothing is queued or running.")
    ] = False,
) -> None:
    """Run queued jobs on free GPUs.

    Jobs start in priority, then submission order, honouring --after. Stopping the daemon
    leaves running jobs running; the next daemon picks them up."""
    import logging

    from rich.console import Console
    from rich.logging import RichHandler

    from orchestrator.daemon import Daemon

    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, markup=False)],
    )
    c = context.get(ctx)
    Daemon(settings=c.settings, db=c.db, interval_s=interval).run(until_idle=until_idle)
