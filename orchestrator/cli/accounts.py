"""``gridshift status``, ``gridshift budget`` and ``gridshift report``: the daemon's
health, the carbon budget, and what ran per user and per label."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context

JSON_OPT = typer.Option("--json", help="Print JSON (stable keys).")
STALE_TICK_S = 30.0  # a daemon whose last pass is older than this is reported stuck


def status(ctx: typer.Context, as_json: Annotated[bool, JSON_OPT] = False) -> None:
    """The daemon's health: last pass, grid signal and its age, the fallback in force,
    running jobs, power and the budget."""
    from orchestrator.cli.render import console, iso, local_time, print_json
    from orchestrator.daemon import daemon_running
    from orchestrator.models import Health
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    now = utc_now()
    with c.db.read() as session:
        row = session.get(Health, 1)
    running = daemon_running(c.settings, c.db)
    data = {
        "daemon": "running" if running else "stopped",
        "pid": row.pid if row and running else None,
        "started_at": iso(row.started_at) if row else None,
        "last_tick": iso(row.last_tick) if row else None,
        "last_tick_age_s": round((now - row.last_tick).total_seconds(), 1) if row else None,
        **{
            k: (row.data.get(k) if row else None)
            for k in (
                "policy", "mode", "fallback_reason", "slot_s", "suspend", "power_caps",
                "power_caps_reason", "queued_jobs", "running_jobs", "stopped_jobs",
                "running_gpus", "power_w", "signal", "budget", "nodes_unreachable",
            )
        },
    }  # fmt: skip
    if as_json:
        print_json(data)
        return
    out = console()
    if row is None:
        out.print("no daemon has run on this queue yet (start one: gridshift daemon)")
        return
    age = data["last_tick_age_s"]
    state = data["daemon"]
    if running and age is not None and age > STALE_TICK_S:
        state = f"running, but its last pass was {age:.0f}s ago"
    out.print(f"[bold]daemon[/]     {state} (pid {row.pid}, last pass {local_time(row.last_tick)})")
    for node, since in (data["nodes_unreachable"] or {}).items():
        out.print(f"[bold]node[/]       [red]{node} unreachable[/] since {since}")
    mode = data["mode"] or "plan"
    line = f"{data['policy']}" + ("" if mode == "plan" else f" [red]→ {mode} fallback[/]")
    out.print(f"[bold]policy[/]     {line}")
    if data["fallback_reason"]:
        out.print(f"             {data['fallback_reason']}")
    sig = data["signal"]
    if sig:
        age_s = "-" if sig["age_s"] is None else f"{sig['age_s'] / 60:.1f} min old"
        out.print(f"[bold]signal[/]     {sig['source']}: {sig['g_per_kwh']} g/kWh ({age_s})")
        if sig["error"]:
            out.print(f"             [yellow]{sig['error']}[/]")
    out.print(
        f"[bold]jobs[/]       {data['running_jobs']} running on {data['running_gpus']} GPUs "
        f"({data['power_w']} W), {data['stopped_jobs']} stopped, {data['queued_jobs']} queued"
    )
    caps = "on" if data["power_caps"] else f"off ({data['power_caps_reason']})"
    out.print(f"[bold]power caps[/] {caps}")
    b = data["budget"]
    if b:
        out.print(
            f"[bold]budget[/]     {b['budget']}: {b['spent_g'] / 1e3:.3f} kg spent, "
            f"{b['remaining_g'] / 1e3:.3f} kg left this period"
        )


def budget(
    ctx: typer.Context,
    amount: Annotated[
        str | None, typer.Option("--budget", help="Budget (default: daemon.budget).")
    ] = None,
    periods: Annotated[int, typer.Option(min=1, help="Past periods to list.")] = 7,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """The carbon budget: spent and left this period, projected at the present rate, and
    past periods."""
    from orchestrator.budget import Budget
    from orchestrator.cli.render import console, print_json
    from orchestrator.errors import SpecError
    from orchestrator.reports import budget_periods
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    text = amount or c.settings.daemon.budget
    if not text:
        raise SpecError("no budget: give --budget (e.g. 20kg/day) or set daemon.budget")
    parsed = Budget.parse(text)
    with c.db.read() as session:
        data = budget_periods(session, parsed, utc_now(), periods)
    if as_json:
        print_json(data)
        return
    out = console()
    projected = data["projected_g"]
    out.print(
        f"[bold]{data['budget']}[/]: {data['spent_g'] / 1e3:.3f} kg spent, "
        f"{data['remaining_g'] / 1e3:.3f} kg left"
        + ("" if projected is None else f", {projected / 1e3:.3f} kg projected")
        + f" (period from {(data['period_start'] or 'the start')[:16]})"
    )
    for p in data["periods"]:
        over = f"  [red]over by {p['over_g'] / 1e3:.3f} kg[/]" if p["over_g"] else ""
        out.print(f"  {p['period_start'][:10]}  {p['spent_g'] / 1e3:10.3f} kg{over}")


def report(
    ctx: typer.Context,
    since: Annotated[
        str | None, typer.Option(help="Jobs submitted in the last ... (7d) or since a date.")
    ] = None,
    grid: Annotated[
        str | None,
        typer.Option("--grid", help="Signal for the saving (default: daemon.grid, grid.source)."),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a bar chart (PNG, SVG or PDF).", dir_okay=False)
    ] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Energy, carbon and cost per user and per label, and the carbon saved against
    running each job when it was submitted."""
    from orchestrator.cli.render import print_json
    from orchestrator.reports import report as make_report
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    now = utc_now()
    start = _since(since, now) if since else None
    with c.db.read() as session:
        carbon, label = _history(c, grid, session, start, now)
        data = make_report(session, start, carbon)
    data["signal"] = label
    if plot is not None:
        _plot(data, plot)
    if as_json:
        print_json(data)
        return
    _print_report(data, plot)


def _since(text: str, now):
    from datetime import timedelta

    from orchestrator.cli.plan import _when
    from orchestrator.errors import SpecError
    from orchestrator.timeparse import parse_duration_s

    try:
        return now - timedelta(seconds=parse_duration_s(text))
    except SpecError:
        pass
    try:
        return _when(text)
    except SpecError:
        raise SpecError(f"invalid --since {text!r}: give a duration (7d) or a date") from None


def _history(c, grid: str | None, session, start, now):
    """The carbon signal over the jobs' runs and its source, or (None, None) when no
    source answers."""
    from datetime import timedelta

    from sqlmodel import col, func, select

    from grid.errors import GridDataError
    from grid.steps import StepSeries
    from orchestrator.errors import GridshiftError
    from orchestrator.gridsource import open_chain
    from orchestrator.models import Job

    specs = [grid] if grid else (c.settings.daemon.grid or c.settings.grid.source)
    if not specs:
        return None, None
    first, last = session.exec(select(func.min(Job.submitted_at), func.max(Job.finished_at)).where(
        col(Job.energy_j).is_not(None))).one()  # fmt: skip
    if first is None:
        return None, None
    first = max(first, start) if start else first
    try:
        chain = open_chain(c.settings, specs)
        signal = chain.history(first - timedelta(hours=1), (last or now) + timedelta(days=1))
        series, _ = StepSeries.from_signal(signal)
    except (GridDataError, GridshiftError):
        return None, None
    return series, chain.spec


def _print_report(data: dict, plot) -> None:
    from rich.table import Table

    from orchestrator.cli.render import console

    out = console()
    for title, rows in (("user", data["by_user"]), ("label", data["by_label"])):
        table = Table(box=None, pad_edge=False, title=f"by {title}", title_justify="left")
        for name in (title.upper(), "JOBS", "kWh", "kg CO2e", "COST", "AT SUBMISSION kg", "SAVED"):
            table.add_column(name, justify="left" if name == title.upper() else "right")
        for key, r in [*rows.items(), ("total", data["total"])]:
            table.add_row(
                key,
                str(r["jobs"]),
                f"{r['energy_kwh']:.3f}" + ("*" if r["modelled_jobs"] else ""),
                _num(r["carbon_kg"], 3),
                _num(r["cost"], 2),
                _num(r["carbon_at_submission_kg"], 3),
                "-" if r["saving_pct"] is None else f"{r['saving_pct']:.0f}%",
            )
        out.print(table)
    out.print("[dim]* includes modelled energy (GPUs without energy counters)[/]")
    if plot is not None:
        out.print(f"plot written to {plot}")


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orchestrator.errors import SpecError

    groups = [("user", data["by_user"]), ("label", data["by_label"])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (title, rows) in zip(axes, groups, strict=True):
        names = list(rows)
        actual = [rows[n]["carbon_kg"] or 0.0 for n in names]
        base = [rows[n]["carbon_at_submission_kg"] or 0.0 for n in names]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], base, width=0.4, label="at submission", color="#bbbbbb")
        ax.bar([i + 0.2 for i in x], actual, width=0.4, label="as run", color="#2a9d8f")
        ax.set_xticks(list(x), names, rotation=30, ha="right")
        ax.set_title(f"kg CO2e by {title}")
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot write the plot {path}: {exc}") from None
    finally:
        plt.close(fig)
