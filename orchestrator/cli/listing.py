"""``gridshift ls`` and ``gridshift show``."""

from __future__ import annotations

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
    from orchestrator import store
    from orchestrator.cli.render import (
        STATE_STYLE,
        command_text,
        console,
        job_dict,
        local_time,
        print_json,
    )
    from orchestrator.timeparse import format_duration, utc_now

    c = context.get(ctx)
    with c.db.read() as session:
        jobs = store.list_jobs(session, include_finished=show_all)
        deps = store.dependencies(session, [j.id for j in jobs])
        hidden = 0 if show_all else store.count_finished(session)
        reports = store.latest_progress(session, [j.id for j in jobs if j.attempts])
    if as_json:
        print_json(
            [
                job_dict(j, deps[j.id], str(c.settings.log_path(j.id)), reports.get(j.id))
                for j in jobs
            ]
        )
        return
    now = utc_now()
    rows = []
    for j in jobs:
        runtime = None
        if j.started_at:
            runtime = ((j.finished_at or now) - j.started_at).total_seconds()
        if j.node:
            gpus = ",".join(map(str, j.gpu_ids)) or "-"
        elif j.gpus_min == j.gpus_max:
            gpus = str(j.gpus_max)
        else:
            gpus = f"{j.gpus_min}-{j.gpus_max}"
        rows.append(
            [
                str(j.id),
                j.name or "",
                j.state,
                j.user,
                gpus,
                local_time(j.submitted_at),
                format_duration(runtime),
                "" if j.exit_code is None else str(j.exit_code),
                command_text(j.command),
            ]
        )
    out = console()
    if jobs:
        out.print(_table(LS_COLUMNS, rows, styles={2: STATE_STYLE}), no_wrap=True, crop=True)
    else:
        out.print("no jobs" if show_all else "no active jobs")
    if hidden:
        out.print(f"[bright_black]{hidden} finished job(s) hidden; --all shows them[/]")


LS_COLUMNS = ("ID", "NAME", "STATE", "USER", "GPUS", "SUBMITTED", "RUNTIME", "EXIT", "COMMAND")


def _table(columns, rows, styles=None):
    """Aligned columns as one styled text; only the last column is cut (with an ellipsis)
    to fit the terminal. Much faster than a rich Table for thousands of rows."""
    from rich.text import Text

    from orchestrator.cli.render import console

    styles = styles or {}
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


def _slurm(handle: dict) -> dict:
    """What Slurm says of an attempt now (squeue, then sacct): state, exit code, times."""
    from executors.errors import ExecutorError
    from executors.slurm import SlurmExecutor

    job_id = handle["data"]["slurm_job_id"]
    try:
        job = SlurmExecutor().lookup(job_id)
    except ExecutorError as exc:
        return {"job_id": job_id, "error": str(exc)}
    if job is None:
        return {"job_id": job_id, "error": "Slurm does not know this job any more"}
    return {
        "job_id": job_id,
        "state": job.state,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "ended_at": job.ended_at.isoformat() if job.ended_at else None,
        "energy_j": job.energy_j,
    }


def show(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Show one job: its spec, state, times, exit code, energy and its history."""
    from orchestrator import store
    from orchestrator.cli.render import console, iso, job_dict, local_time, print_json

    c = context.get(ctx)
    with c.db.read() as session:
        job = store.get_job(session, job_id)
        data = job_dict(
            job,
            store.dependencies(session, [job_id])[job_id],
            str(c.settings.log_path(job_id)),
            store.latest_progress(session, [job_id]).get(job_id),
        )
        events = store.events(session, job_id)
        runs = store.attempts(session, job_id)
    data["runs"] = [
        {
            "attempt": a.number,
            "state": a.state,
            "node": a.node,
            "gpu_ids": list(a.gpu_ids),
            "cap": a.cap,
            "started_at": iso(a.started_at),
            "finished_at": iso(a.finished_at),
            "exit_code": a.exit_code,
            "energy_kwh": None if a.energy_j is None else a.energy_j / 3.6e6,
            "energy_modelled": a.energy_modelled,
            "carbon_g": a.carbon_g,
            "cost": a.cost,
            "slurm": _slurm(a.handle) if a.handle and "slurm_job_id" in a.handle["data"] else None,
        }
        for a in runs
    ]
    data["events"] = [
        {
            "at": iso(e.at),
            "from": e.from_state,
            "to": e.to_state,
            "reason": e.reason,
            "actor": e.actor,
        }
        for e in events
    ]
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in data.items():
        if key in ("events", "runs"):
            continue
        if key.endswith("_at") or key == "deadline":
            value = local_time(getattr(job, key))
        grid.add_row(key, "-" if value is None or value == [] else str(value))
    out = console()
    out.print(grid)
    if runs:
        out.print("[bold]runs[/]")
        for r in data["runs"]:
            kwh = "-" if r["energy_kwh"] is None else f"{r['energy_kwh']:.4f} kWh"
            kwh += " (modelled)" if r["energy_modelled"] else ""
            grams = "-" if r["carbon_g"] is None else f"{r['carbon_g']:.1f} g CO2e"
            cap = f", cap {100 * r['cap']:.0f}%" if r["cap"] else ""
            out.print(
                f"  #{r['attempt']} {r['state']} on {r['node']} GPUs {r['gpu_ids']}{cap}: "
                f"{kwh}, {grams}"
            )
            if (s := r["slurm"]) is not None:
                said = s.get("error") or (
                    f"{s['state']}, exit code {'-' if s['exit_code'] is None else s['exit_code']}"
                )
                out.print(f"     Slurm job {s['job_id']}: {said}")
    out.print("[bold]history[/]")
    for e in events:
        reason = f"  ({e.reason})" if e.reason else ""
        out.print(f"  {local_time(e.at)}  {e.from_state or '-'} → {e.to_state}{reason}")
