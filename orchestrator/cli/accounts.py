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
    from datetime import datetime

    from orchestrator.cli.render import console, local_time, print_json, safe
    from orchestrator.signals.redact import redact

    c = context.get(ctx)
    made = c.call("status", {})
    data = made["data"]
    if as_json:
        print_json(data)
        return
    out = console()
    if not made["seen"]:
        out.print("no daemon has run on this queue yet (start one: gridshift daemon)")
        return
    age = data["last_tick_age_s"]
    state = data["daemon"]
    running = state == "running"
    if running and age is not None and age > STALE_TICK_S:
        state = f"running, but its last pass was {age:.0f}s ago"
    last = local_time(datetime.fromisoformat(data["last_tick"]) if data["last_tick"] else None)
    out.print(f"[bold]daemon[/]     {state} (pid {made['pid']}, last pass {last})")
    for node, since in (data["nodes_unreachable"] or {}).items():
        out.print(f"[bold]node[/]       [red]{safe(node)} unreachable[/] since {since}")
    mode = data["mode"] or "plan"
    line = safe(data["policy"]) + ("" if mode == "plan" else f" [red]→ {mode} fallback[/]")
    out.print(f"[bold]policy[/]     {line}")
    if data["fallback_reason"]:
        out.print(f"             {safe(redact(data['fallback_reason']))}")
    sig = data["signal"]
    if sig:
        age_s = "-" if sig["age_s"] is None else f"{sig['age_s'] / 60:.1f} min old"
        source = safe(sig["source"])
        out.print(f"[bold]signal[/]     {source}: {sig['g_per_kwh']} g/kWh ({age_s})")
        if sig["error"]:
            out.print(f"             [yellow]{safe(redact(sig['error']))}[/]")
    out.print(
        f"[bold]jobs[/]       {data['running_jobs']} running on {data['running_gpus']} GPUs "
        f"({data['power_w']} W), {data['stopped_jobs']} stopped, {data['queued_jobs']} queued"
    )
    caps = "on" if data["power_caps"] else f"off ({safe(data['power_caps_reason'])})"
    out.print(f"[bold]power caps[/] {caps}")
    b = data["budget"]
    if b:
        unit = b.get("unit", "kg")
        out.print(
            f"[bold]budget[/]     {b['budget']}: {b['spent_g'] / 1e3:.3f} {unit} spent, "
            f"{b['remaining_g'] / 1e3:.3f} {unit} left this period"
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
    from orchestrator.cli.render import console, print_json, safe

    c = context.get(ctx)
    data = c.call("budget", {"budget": amount, "periods": periods})
    if as_json:
        print_json(data)
        return
    out = console()
    projected = data["projected_g"]
    unit = data.get("unit", "kg")
    out.print(
        f"[bold]{data['budget']}[/]: {data['spent_g'] / 1e3:.3f} {unit} spent, "
        f"{data['remaining_g'] / 1e3:.3f} {unit} left"
        + ("" if projected is None else f", {projected / 1e3:.3f} {unit} projected")
        + f" (period from {(data['period_start'] or 'the start')[:16]})"
    )
    _periods(data["periods"], unit)
    for f in data.get("forced") or []:
        out.print(
            f"  [yellow]forced[/] job {f['job']} ({safe(f['user'])}) at {f['at'][:16]}: "
            f"{f['g'] / 1e3:.3f} {unit} expected, started by its deadline beyond the budget"
        )


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
    from orchestrator.cli.plan import absolute_source
    from orchestrator.cli.render import print_json

    c = context.get(ctx)
    data = c.call("report", {"since": since, "grid": absolute_source(grid)})
    if plot is not None:
        _plot(data, plot)
    if as_json:
        print_json(data)
        return
    _print_report(data, plot)


def _periods(periods: list[dict], unit: str) -> None:
    """Past periods, one row each (``cli.output.tables``)."""
    from orchestrator.cli.output.tables import Col, num, table

    if not periods:
        return
    kg = [Col("PERIOD"), Col(f"SPENT {unit}", right=True), Col(f"OVER {unit}", right=True),
          Col(f"FORCED {unit}", right=True, drop=1)]  # fmt: skip
    table(kg, [[(p["period_start"] or "run")[:10], num(p["spent_g"] / 1e3, 3),
                num(p["over_g"] / 1e3, 3) if p["over_g"] else "-",
                num(p["forced_g"] / 1e3, 3) if p.get("forced_g") else "-"] for p in periods],
          styles={2: lambda text: None if text == "-" else "red"})  # fmt: skip


def _print_report(data: dict, plot) -> None:
    from orchestrator.cli.output.tables import Col, num, say, table

    for title, rows in (("user", data["by_user"]), ("label", data["by_label"])):
        say(f"by {title}", "bold")
        columns = (
            Col(title.upper()), Col("JOBS", right=True), Col("kWh", right=True),
            Col("kg CO2e", right=True), Col("COST", right=True, drop=2),
            Col("AT SUBMISSION kg", right=True, drop=1), Col("SAVED", right=True),
        )  # fmt: skip
        table(columns, [
            [key, str(r["jobs"]), num(r["energy_kwh"], 3) + ("*" if r["modelled_jobs"] else ""),
             num(r["carbon_kg"], 3), num(r["cost"], 2), num(r["carbon_at_submission_kg"], 3),
             num(r["saving_pct"], 0, "%")]
            for key, r in [*rows.items(), ("total", data["total"])]
        ])  # fmt: skip
    say("* includes modelled energy (GPUs without energy counters)", "dim")
    if plot is not None:
        say(f"plot written to {plot}")


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plot(data: dict, path: Path) -> None:
    """Bars per user and per label, titled with the period and the saving."""
    from orchestrator.accounting.plots import report_figure, save

    save(report_figure(data), path)
