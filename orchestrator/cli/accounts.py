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
    from datetime import UTC, datetime

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
    last = local_time(data["last_tick"], seconds=True)
    out.print(f"[bold]daemon[/]     {state} (pid {made['pid']}, last pass {last})")
    if not running:
        out.print(f"             the figures below are as of its last pass ({last})")
    from orchestrator.cli.output.nodepower import node_lines

    for line in node_lines(data["nodes_unreachable"], data.get("nodes_power"), datetime.now(UTC)):
        out.print(line)
    mode = data["mode"] or "plan"
    line = safe(data["policy"]) + ("" if mode == "plan" else f" [red]→ {mode} fallback[/]")
    out.print(f"[bold]policy[/]     {line}")
    if data["fallback_reason"]:
        out.print(f"             {safe(redact(dated(data['fallback_reason'])))}")
    sig = data["signal"]
    if sig:
        for n, line in enumerate(signal_lines(sig, datetime.now(UTC))):
            out.print(("[bold]signal[/]     " if n == 0 else "             ") + line)
    out.print(
        f"[bold]jobs[/]       {data['running_jobs']} running on {data['running_gpus']} GPUs "
        f"({data['power_w']} W), {data['stopped_jobs']} stopped, {data['queued_jobs']} queued"
    )
    caps = "on" if data["power_caps"] else f"off ({safe(data['power_caps_reason'])})"
    out.print(f"[bold]power caps[/] {caps}")
    if site := data.get("power_limit"):
        out.print(f"[bold]site limit[/] {site['limit_w']:.0f} W over {site['gpus']} GPUs: "
                  f"{site['in_force_w']:.0f} W of GPU limits in force")  # fmt: skip
    b = data["budget"]
    if b:
        unit = b.get("unit", "kg")
        out.print(
            f"[bold]budget[/]     {b['budget']}: {b['spent_g'] / 1e3:.3f} {unit} spent, "
            f"{b['remaining_g'] / 1e3:.3f} {unit} left "
            + ("this period" if running else "in its period at its last pass")
        )


_ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:\d\d)"


def dated(text: str) -> str:
    """The daemon's words with each ISO time in them shown as every time is (local with
    its zone, or UTC with ``--utc``): ``the trace ends at 2025-06-16 02:00 CEST``."""
    import re

    from orchestrator.cli.render import local_time

    return re.sub(_ISO_TIME, lambda m: local_time(m.group().replace("Z", "+00:00")), text)


def signal_lines(sig: dict, now) -> list[str]:
    """The status of the grid signal in words (rich markup): its value and age, or why
    there is none: a trace that ended (and replay), a source failing since when, or no
    fetch yet. Never ``None g/kWh``."""
    from orchestrator.cli.render import local_time, safe
    from orchestrator.signals.redact import redact

    source = safe(sig["source"])
    error = sig.get("error") and safe(redact(sig["error"]))
    since = sig.get("failing_since")
    if sig.get("g_per_kwh") is not None:
        age = "" if sig["age_s"] is None else f" ({sig['age_s'] / 60:.1f} min old)"
        lines = [f"{source}: {sig['g_per_kwh']:.0f} g/kWh{age}"]
        if error:
            failing = f"failing since {local_time(since)}: " if since else ""
            lines.append(f"[yellow]{failing}{error}[/]")
        return lines
    end = sig.get("trace_end")
    if end:
        from datetime import datetime

        days = (now - datetime.fromisoformat(end)).total_seconds() / 86400
        if days > 0:
            return [
                f"{source}: [red]no signal[/]: the trace ends at {local_time(end)} "
                f"({days:.0f} days ago); replay it live with ?replay=now "
                "(shifted by whole weeks to now, looped)"
            ]
    if error:
        failing = f"failing since {local_time(since)}" if since else "failing"
        return [
            f"{source}: [red]no signal[/]: the source has been {failing}",
            f"[yellow]{error}[/]",
        ]
    return [f"{source}: no signal yet (no fetch has answered yet)"]


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
    from orchestrator.cli.render import console, local_time, print_json, safe

    c = context.get(ctx)
    data = c.call("budget", {"budget": amount, "periods": periods})
    if as_json:
        print_json(data)
        return
    out = console()
    projected = data["projected_g"]
    start = local_time(data["period_start"]) if data["period_start"] else "the start"
    unit = data.get("unit", "kg")
    out.print(
        f"[bold]{data['budget']}[/]: {data['spent_g'] / 1e3:.3f} {unit} spent, "
        f"{data['remaining_g'] / 1e3:.3f} {unit} left"
        + ("" if projected is None else f", {projected / 1e3:.3f} {unit} projected")
        + f" (period from {start})"
    )
    if (came := _history_note(data)) is not None:
        out.print(f"[dim]the budget {safe(came)} ran with (none running, none configured)[/]")
    _periods(data["periods"], unit)
    for f in data.get("forced") or []:
        out.print(
            f"  [yellow]forced[/] job {f['job']} ({safe(f['user'])}) at {local_time(f['at'])}: "
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
    from orchestrator.errors import GridshiftError
    from orchestrator.timeparse import aware_text, parse_duration_s

    try:  # a duration (7d) goes as it is; a date is read in this shell's zone
        parse_duration_s(since or "")
    except GridshiftError:
        since = aware_text(since)
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
    from orchestrator.cli.render import local_time

    if not periods:
        return
    kg = [Col("PERIOD"), Col(f"SPENT {unit}", right=True), Col(f"OVER {unit}", right=True),
          Col(f"FORCED {unit}", right=True, drop=1)]  # fmt: skip
    start = {id(p): local_time(p["period_start"]) if p["period_start"] else "run" for p in periods}
    table(kg, [[start[id(p)], num(p["spent_g"] / 1e3, 3),
                num(p["over_g"] / 1e3, 3) if p["over_g"] else "-",
                num(p["forced_g"] / 1e3, 3) if p.get("forced_g") else "-"] for p in periods],
          styles={2: lambda text: None if text == "-" else "red"})  # fmt: skip


def _print_report(data: dict, plot) -> None:
    from orchestrator.accounting.labels import label_rows
    from orchestrator.cli.output.tables import Col, num, say, table

    labels = label_rows(data)  # other users' jobs in one row: their labels are private
    for title, rows in (("user", list(data["by_user"].items())), ("label", labels)):
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
            for key, r in [*rows, ("total", data["total"])]
        ])  # fmt: skip
    if data["total"].get("modelled_jobs"):  # the footnote of a star shown above
        say("* includes modelled energy (GPUs without energy counters)", "dim")
    idle = data.get("idle") or {}
    if idle.get("energy_kwh"):  # right-sizing's part: what the cluster drew besides its jobs
        kg = "-" if idle["carbon_kg"] is None else num(idle["carbon_kg"], 3)
        say(f"idle: {num(idle['energy_kwh'], 3)} kWh, {kg} kg CO2e (idle GPUs and servers on "
            "without a job, times the PUE; not in the rows above; by whole UTC hour: "
            "--since counts from the start of its hour)", "dim")  # fmt: skip
    if data.get("signal"):
        came = _history_note(data, "signal_from")
        say(f"saved: against running each job at submission, on {data['signal']}"
            + (f" (the signal {came} ran with)" if came else ""), "dim")  # fmt: skip
    else:
        say("saved: - (no grid signal: give --grid, or run the daemon with one)", "dim")
    if plot is not None:
        say(f"plot written to {plot}")


def _history_note(data: dict, key: str = "budget_from") -> str | None:
    """Where a setting came from, said only when it is history: ``the daemon that
    stopped at T`` ran with it (no option, no running daemon, no config gave one)."""
    if data.get(key) != "stopped-daemon":
        return None
    return "the daemon that stopped at " + dated(data.get("daemon_stopped_at") or "?")


def _plot(data: dict, path: Path) -> None:
    """Bars per user and per label, titled with the period and the saving."""
    from orchestrator.accounting.plots import report_figure, save

    save(report_figure(data), path)
