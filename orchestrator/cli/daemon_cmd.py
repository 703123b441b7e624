"""``gridshift daemon``: the dispatch loop, carbon-aware when given a grid signal."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context

Opt = typer.Option


def daemon(
    ctx: typer.Context,
    grid: Annotated[
        list[str] | None,
        Opt("--grid", help="Carbon signal: uk, csv:PATH ... (repeat for a fallback chain)."),
    ] = None,
    policy: Annotated[
        str | None, Opt(help="budget, lowest-window, lowest-slots, fifo ... (default: budget).")
    ] = None,
    slot: Annotated[str | None, Opt(help="Planning slot, 1s to 1h (default 15m).")] = None,
    budget: Annotated[str | None, Opt(help="Carbon budget, e.g. 20kg/day.")] = None,
    price: Annotated[str | None, Opt(help="Price signal, for cost accounts and objectives.")] = (
        None
    ),
    objective: Annotated[str | None, Opt(help="carbon, cost or mix:W.")] = None,
    suspend: Annotated[
        str | None,
        Opt(help="How to suspend: signal (SIGTERM, checkpoint, requeue) or stop (SIGSTOP)."),
    ] = None,
    fallback: Annotated[
        str | None,
        Opt(help="When the signal is too old: run-now or deadline-only (default)."),
    ] = None,
    metrics_port: Annotated[
        int | None, Opt(min=1, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    interval: Annotated[
        float | None,
        Opt(min=0.05, help="Seconds between passes (default: daemon_interval_s, 1)."),
    ] = None,
    until_idle: Annotated[
        bool, Opt("--until-idle", help="Exit once nothing is queued or running.")
    ] = False,
) -> None:
    """Run queued jobs on free GPUs, at the times, widths and power caps the plan picks.

    With a grid signal (--grid or the config's grid.source) jobs wait for low-carbon
    time within their deadlines; without one they start in priority, then submission
    order. Each option may also be set in the config file's [daemon] table. Stopping the
    daemon leaves running jobs running; the next daemon picks them up."""
    import logging

    from rich.console import Console
    from rich.logging import RichHandler

    from orchestrator.daemon import Daemon
    from orchestrator.errors import ConfigError
    from orchestrator.settings import DaemonSettings

    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, markup=False)],
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    c = context.get(ctx)
    given = {
        "grid": grid or None,
        "policy": policy,
        "slot": slot,
        "budget": budget,
        "price": price,
        "objective": objective,
        "suspend": suspend,
        "fallback": fallback,
        "metrics_port": metrics_port,
    }
    merged = c.settings.daemon.model_dump() | {k: v for k, v in given.items() if v is not None}
    try:
        c.settings.daemon = DaemonSettings.model_validate(merged)
    except ValueError as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
        where = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")
        raise ConfigError(f"invalid {where}: {first['msg']}") from None
    Daemon(settings=c.settings, db=c.db, interval_s=interval).run(until_idle=until_idle)
