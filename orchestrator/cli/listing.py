"""``gridshift ls`` and ``gridshift show``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context

JSON_OPT = typer.Option("--json", help="Print JSON (stable keys).")


def ls(
    ctx: typer.Context,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """List jobs: those queued, planned, running, suspended or lost (--all: every job)."""
    from orchestrator.cli.render import STATE_STYLE, command_text, console, print_json
    from orchestrator.timeparse import format_duration

    c = context.get(ctx)
    made = c.call("ls", {"all": show_all})
    jobs, hidden = made["jobs"], made["hidden"]
    if as_json:
        print_json(jobs)
        return
    now = datetime.now(UTC)
    rows = []
    for j in jobs:
        runtime = None
        if j["started_at"]:
            ended = _dt(j["finished_at"]) or now
            runtime = (ended - _dt(j["started_at"])).total_seconds()
        if j["node"]:
            gpus = ",".join(map(str, j["gpu_ids"])) or "-"
        elif j["gpus_min"] == j["gpus_max"]:
            gpus = str(j["gpus_max"])
        else:
            gpus = f"{j['gpus_min']}-{j['gpus_max']}"
        rows.append(
            [
                str(j["id"]),
                j["name"] or "",
                j["state"],
                j["user"],
                gpus,
                _local(j["submitted_at"]),
                format_duration(runtime),
                "" if j["exit_code"] is None else str(j["exit_code"]),
                command_text(j["command"]),
            ]
        )
    out = console()
    if jobs:
        out.print(_table(LS_COLUMNS, rows, styles={2: STATE_STYLE}), no_wrap=True, crop=True)
    else:
        out.print("no jobs" if show_all else "no active jobs")
    if hidden:
        out.print(f"[bright_black]{hidden} finished job(s) hidden; --all shows them[/]")


def _dt(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _local(text: str | None) -> str:
    from orchestrator.cli.render import local_time

    return local_time(_dt(text))


LS_COLUMNS = ("ID", "NAME", "STATE", "USER", "GPUS", "SUBMITTED", "RUNTIME", "EXIT", "COMMAND")


def _table(columns, rows, styles=None):
    """Aligned columns as one styled text; only the last column is cut (with an ellipsis)
    to fit the terminal. Much faster than a rich Table for thousands of rows."""
    from rich.text import Text

    from orchestrator.cli.render import console, plain

    styles = styles or {}
    rows = [[plain(cell) for cell in row] for row in rows]  # users' names, commands ...
    widths = [max([len(name)] + [len(r[i]) for r in rows]) for i, name in enumerate(columns)]
    room = max(12, console().width - sum(widths[:-1]) - 2 * (len(columns) - 1))
    text = Text(no_wrap=True, overflow="ignore")
    for n, row in enumerate([list(columns), *rows]):
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            if last and len(cell) > room:
                cell = cell[: room - 1] + "…"
            style = "bold" if n == 0 else styles.get(i, {}).get(cell, "")
            text.append(cell if last else cell.ljust(widths[i]) + "  ", style=style)
        text.append("\n")
    text.rstrip()
    return text


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
    from orchestrator.cli.render import console, print_json, safe

    c = context.get(ctx)
    if plot is not None:
        from orchestrator.accounting.plots import job_figure, save

        save(job_figure(c.call("job_power", {"job_id": job_id})), plot)
    data = c.call("show", {"job_id": job_id})
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in data.items():
        if key in ("events", "runs", "forced_g", "forced_kwh"):
            continue
        if key.endswith("_at") or key == "deadline":
            value = _local(value)
        grid.add_row(key, "-" if value is None or value == [] else safe(value))
    out = console()
    out.print(grid)
    if data["runs"]:
        out.print("[bold]runs[/]")
        for r in data["runs"]:
            kwh = "-" if r["energy_kwh"] is None else f"{r['energy_kwh']:.4f} kWh"
            kwh += " (modelled)" if r["energy_modelled"] else ""
            grams = "-" if r["carbon_g"] is None else f"{r['carbon_g']:.1f} g CO2e"
            cap = f", cap {100 * r['cap']:.0f}%" if r["cap"] else ""
            out.print(
                f"  #{r['attempt']} {r['state']} on {safe(r['node'])} GPUs {r['gpu_ids']}{cap}: "
                f"{kwh}, {grams}"
            )
            if r.get("forced_g") is not None:
                out.print(
                    f"     [yellow]forced by its deadline beyond the budget[/]: expected "
                    f"{r['forced_g']:.1f} g CO2e, {r['forced_kwh']:.4f} kWh"
                )
            if (s := r["slurm"]) is not None:
                said = s.get("error") or (
                    f"{s['state']}, exit code {'-' if s['exit_code'] is None else s['exit_code']}"
                )
                out.print(f"     Slurm job {s['job_id']}: {safe(said)}")
    out.print("[bold]history[/]")
    for e in data["events"]:
        reason = f"  ({safe(e['reason'])})" if e["reason"] else ""
        out.print(f"  {_local(e['at'])}  {e['from'] or '-'} → {e['to']}{reason}")
