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
    from orchestrator.cli.render import command_text, print_json
    from orchestrator.timeparse import format_duration

    data = context.get(ctx).call("cron_ls", {})
    if as_json:
        print_json(data)
        return
    from orchestrator.cli.output.jobtext import when
    from orchestrator.cli.output.tables import Col, say, table

    if not data:
        say("no cron templates")
        return
    columns = (
        Col("ID", right=True), Col("CRON"), Col("WINDOW", drop=2), Col("NEXT"),
        Col("JOBS", right=True, drop=1), Col("USER", drop=3), Col("COMMAND", free=True),
    )  # fmt: skip
    rows = []
    for d in data:
        command = d["command"]
        command = command_text(command) if isinstance(command, list) else command
        rows.append([
            str(d["id"]), d["cron"], format_duration(d["window_s"]), when(d["next_occurrence"]),
            str(d["jobs"]), d["user"], command,
        ])  # fmt: skip
    table(columns, rows)
    zones = sorted({d["zone"] for d in data if d.get("zone")})
    if zones:  # where the daemon reads the expressions' clock times
        say(f"cron expressions read in {', '.join(zones)} (the daemon's zone)")
    for d in data:
        if d.get("fault"):  # disabled or paused, and why
            say(f"cron template {d['id']} {d['fault']}")


@cron_app.command("rm")
def cron_rm(
    ctx: typer.Context,
    template_ids: Annotated[list[int], typer.Argument(help="Template ids.", show_default=False)],
) -> None:
    """Remove cron templates (jobs they already queued stay queued)."""
    removed = context.get(ctx).call("cron_rm", {"template_ids": template_ids})
    for template_id in removed:
        typer.echo(f"cron template {template_id}: removed")
