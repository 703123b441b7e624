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
    """List the cron templates, with their next occurrence and last job."""
    from sqlmodel import col, func, select

    from orchestrator import cron
    from orchestrator.cli.render import console, print_json
    from orchestrator.models import Job
    from orchestrator.timeparse import format_duration, utc_now

    c = context.get(ctx)
    now = utc_now()
    with c.db.read() as session:
        rows = cron.active(session)
        counts = dict(
            session.exec(
                select(Job.cron_id, func.count()).where(col(Job.cron_id).is_not(None))
                .group_by(Job.cron_id)
            ).all()
        )  # fmt: skip
    data = [
        {
            "id": r.id,
            "cron": r.cron,
            "window_s": r.window_s,
            "command": r.spec.get("command"),
            "name": r.spec.get("name"),
            "user": r.user,
            "last_occurrence": r.last_fire.isoformat() if r.last_fire else None,
            "next_occurrence": _iso(cron.next_fire(r, now)),
            "jobs": counts.get(r.id, 0),
        }
        for r in rows
    ]
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
            d["cron"],
            format_duration(d["window_s"]),
            (d["next_occurrence"] or "-")[:19],
            str(d["jobs"]),
            d["user"],
            " ".join(command) if isinstance(command, list) else str(command),
        )
    console().print(table)


@cron_app.command("rm")
def cron_rm(
    ctx: typer.Context,
    template_ids: Annotated[list[int], typer.Argument(help="Template ids.", show_default=False)],
) -> None:
    """Remove cron templates (jobs they already queued stay queued)."""
    from orchestrator import cron
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    now = utc_now()

    def _remove(session):
        return [cron.remove(session, i, c.user, now).id for i in dict.fromkeys(template_ids)]

    for template_id in c.db.write_retrying(_remove):
        typer.echo(f"cron template {template_id}: removed")


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None
