"""``gridshift ls`` and ``gridshift show``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context

JSON_OPT = typer.Option("--json", help="Print JSON (stable keys).")


def ls(
    ctx: typer.Context,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only jobs in this state (repeat, or a comma list)."),
    ] = None,
    user: Annotated[list[str] | None, typer.Option("--user", help="Only this user's jobs.")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Only jobs with this label.")
    ] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """List jobs: those queued, planned, running, suspended or lost (--all: every job),
    with PLAN: the planned start or why each waits (a dependency, GPUs busy, low carbon,
    the budget)."""
    from orchestrator.cli.output import tables
    from orchestrator.cli.output.jobtext import LS_COLUMNS, STATE_STYLE, ls_row
    from orchestrator.cli.render import print_json

    args = {"all": show_all, "states": state or [], "users": user or [], "labels": label or []}
    made = context.get(ctx).call("ls", args)
    jobs, hidden = made["jobs"], made["hidden"]
    if as_json:
        print_json(jobs)
        return
    if jobs:
        tables.table(LS_COLUMNS, [ls_row(j) for j in jobs], styles={2: STATE_STYLE.get})
    elif state or user or label:
        tables.say("no such jobs")
    else:
        tables.say("no jobs" if show_all else "no active jobs")
    if hidden:
        tables.say(f"{hidden} finished job(s) hidden; --all shows them", "bright_black")


def _local(text: str | None) -> str:
    from orchestrator.cli.output.jobtext import when

    return when(text)


def show(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    as_json: Annotated[bool, JSON_OPT] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw the job's power and the grid's carbon over its run (PNG, SVG, PDF).",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Show one job: its spec, state, times, exit code, energy and its history."""
    from orchestrator.cli.render import print_json

    c = context.get(ctx)
    if plot is not None:
        from orchestrator.accounting.plots import job_figure, save

        save(job_figure(c.call("job_power", {"job_id": job_id})), plot)
    data = c.call("show", {"job_id": job_id})
    if as_json:
        print_json(data)
        return
    from orchestrator.cli.output.showtext import show as as_text

    as_text(data)
