"""``gridshift cron ls`` and ``gridshift cron rm``: recurring job templates."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context

cron_app = typer.Typer(
    no_args_is_help=True,
    help="Recurring jobs (made with: gridshift submit --cron EXPR --window 8h -- CMD).",
)


@cron_app.command("ls")
def cron_ls(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable keys).")] = False,
) -> None:
    """List the cron templates, with their next occurrence and last job, and why any is
    disabled or paused."""
    from orchestrator.cli.render import console, print_json, safe
    from orchestrator.timeparse import format_duration

    data = context.get(ctx).call("cron_ls", {})
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    if not data:
        console().print("no cron templates")
        return
    table = Table(box=None, pad_edge=False)
    for name in ("ID", "CRON", "WINDOW", "NEXT", "JOBS", "USER", "COMMAND"):
        table.add_column(name)
    for d in data:
        command = d["command"]
        table.add_row(
            str(d["id"]),
            safe(d["cron"]),
            format_duration(d["window_s"]),
            (d["next_occurrence"] or "-")[:19],
            str(d["jobs"]),
            safe(d["user"]),
            safe(" ".join(command) if isinstance(command, list) else command),
        )
    console().print(table)
    for d in data:
        if d.get("fault"):  # disabled or paused, and why
            console().print(f"cron template {d['id']} {safe(d['fault'])}")


@cron_app.command("rm")
def cron_rm(
    ctx: typer.Context,
    template_ids: Annotated[list[int], typer.Argument(help="Template ids.", show_default=False)],
) -> None:
    """Remove cron templates (jobs they already queued stay queued)."""
    removed = context.get(ctx).call("cron_rm", {"template_ids": template_ids})
    for template_id in removed:
        typer.echo(f"cron template {template_id}: removed")
