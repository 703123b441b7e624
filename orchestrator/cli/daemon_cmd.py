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
    backfill: Annotated[
        str | None,
        Opt(help="Backfill behind a blocked job: conservative (default), easy or strict."),
    ] = None,
    power_limit: Annotated[
        str | None,
        Opt(help="Site limit on the sum of the GPUs' power limits, e.g. 15kW, 800W, 1.5MW."),
    ] = None,
    metrics_port: Annotated[
        int | None, Opt(min=1, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    metrics_addr: Annotated[
        str | None,
        Opt(help="Address the metrics listen on (default 127.0.0.1; 0.0.0.0: every interface)."),
    ] = None,
    interval: Annotated[
        float | None,
        Opt(min=0.05, max=3600, help="Seconds between passes (default: daemon_interval_s, 1)."),
    ] = None,
    until_idle: Annotated[
        bool,
        Opt(
            "--until-idle",
            help="Exit once nothing is queued or running (held jobs and those waiting on "
            "them aside).",
        ),
    ] = False,
    log_format: Annotated[
        str,
        Opt(
            "--log-format",
            help="auto (rich on a terminal, else text), text (one line per record: ISO "
            "time, level, logger, message) or json (one object per line).",
        ),
    ] = "auto",
) -> None:
    """Run queued jobs on free GPUs, at the times, widths and power caps the plan picks.

    With a grid signal (--grid or the config's grid.source) jobs wait for low-carbon
    time within their deadlines; without one they start in priority, then submission
    order. Each option may also be set in the config file's [daemon] table. Stopping the
    daemon leaves running jobs running; the next daemon picks them up."""
    from orchestrator.daemon.service import Daemon
    from orchestrator.errors import ConfigError, first_invalid
    from orchestrator.settings import DaemonSettings
    from orchestrator.signals.sources import provider_configs

    _log_to_stderr(log_format)
    c = context.get(ctx)
    provider_configs(c.settings)  # remembers the providers' secrets, to hide them
    from orchestrator.cli.plan import absolute_source

    given = {  # a trace's path made absolute: budget and report read it from elsewhere
        "grid": [absolute_source(g) for g in grid] if grid else None,
        "policy": policy,
        "slot": slot,
        "budget": budget,
        "price": absolute_source(price),
        "objective": objective,
        "suspend": suspend,
        "fallback": fallback,
        "backfill": backfill,
        "power_limit": power_limit,
        "metrics_port": metrics_port,
        "metrics_addr": metrics_addr,
    }
    merged = c.settings.daemon.model_dump() | {k: v for k, v in given.items() if v is not None}
    try:
        c.settings.daemon = DaemonSettings.model_validate(merged)
    except ValueError as exc:
        loc, msg = first_invalid(exc)
        where = "--" + "-".join(str(p) for p in loc).replace("_", "-")
        raise ConfigError(f"invalid {where}: {msg}") from None
    from orchestrator.timeparse import local_zone

    local_zone()  # a TZ that names no zone is one line now, not an error at every pass
    Daemon(settings=c.settings, db=c.db, interval_s=interval).run(until_idle=until_idle)


def _log_to_stderr(log_format: str = "auto") -> None:
    """Rich on a terminal; elsewhere (a file, a pipe, the journal) or with ``text`` plain
    lines to read later: ISO date-time, level, logger, message; ``json``: one object per
    line. httpx logs full URLs (ENTSO-E's token is a query parameter) at INFO: WARNING for
    it, and every record redacted and escaped on its way out either way; Python's
    warnings go the same way."""
    import logging
    import sys

    from orchestrator.errors import SpecError
    from orchestrator.signals.redact import JsonFormatter, LineFormatter, TerminalFormatter, guard

    log_format = log_format.strip().lower()
    if log_format not in ("auto", "text", "json"):
        raise SpecError(f"invalid --log-format {log_format!r}: use auto, text or json")
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    elif log_format == "auto" and sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(stderr=True),
            show_path=False,
            markup=False,
            log_time_format=_rich_time,
        )
        handler.setFormatter(TerminalFormatter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(LineFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[guard(handler)])
    logging.captureWarnings(True)


def _rich_time(moment):
    """The time of a record on a terminal: the convention's (date, zone; ``--utc``)."""
    from rich.text import Text

    from orchestrator.timeparse import format_time

    return Text(format_time(moment.astimezone(), seconds=True))


db_app = typer.Typer(
    no_args_is_help=True,
    help="The database's schema: its revision, and upgrading it after installing a newer "
    "gridshift (run as the daemon's user, with the daemon stopped).",
)


@db_app.command("status")
def db_status(
    ctx: typer.Context,
    json_out: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """The database's schema revision and this gridshift's (head); exit 0 either way."""
    from orchestrator.cli.render import print_json

    db = context.get(ctx).unchecked_db
    status = db.schema_status()
    if json_out:
        print_json({**status.to_dict(), "database": db.safe_url})
        return
    current = status.current or ("none (empty)" if status.state == "empty" else "none")
    typer.echo(f"database: {db.safe_url}\nrevision: {current}\nhead:     {status.head}")
    typer.echo(f"state:    {status.state}")


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context) -> None:
    """Bring the database to this gridshift's schema: a SQLite file is first copied to
    <file>.backup-<UTC time> (mode 0600). Refused while a daemon serves the queue."""
    from orchestrator.queue import schema

    c = context.get(ctx)
    db = c.unchecked_db
    before = db.schema_status()
    if before.up_to_date:
        typer.echo(f"the database is at revision {before.head} already")
        return
    if before.state == "newer":
        schema.require_up_to_date(before, db.safe_url)
    _refuse_while_served(c, db)
    backup = None
    if db.sqlite_path is not None and before.state != "empty":
        backup = schema.backup_sqlite(db.sqlite_path)
        typer.echo(f"backed up the database to {backup}")
    db.upgrade_schema()
    after = db.schema_status()
    typer.echo(f"upgraded the database from {before.current or before.state} to {after.current}")


def _refuse_while_served(c, db) -> None:
    """An older daemon must not find its tables changed under it."""
    from sqlalchemy.exc import DBAPIError

    from orchestrator.daemon.lease import daemon_running
    from orchestrator.errors import GridshiftError, UserError

    try:
        serving = daemon_running(c.settings, db)
    except (GridshiftError, DBAPIError):  # an old database without a lease table
        serving = False
    if serving:
        raise UserError("a daemon serves this queue: stop it, then run gridshift db upgrade")
