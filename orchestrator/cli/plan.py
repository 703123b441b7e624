"""``gridshift plan``: what a policy would do with the queue now, job by job."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context

Opt = typer.Option


def plan(
    ctx: typer.Context,
    policy: Annotated[str, Opt("--policy", help="budget, optimal, lowest-window, fifo ...")] = (
        "budget"
    ),
    grid: Annotated[
        str | None, Opt("--grid", help="Carbon signal (default: the configured grid.source).")
    ] = None,
    price: Annotated[str | None, Opt("--price", help="Price signal, for --objective cost.")] = None,
    budget: Annotated[
        str | None, Opt("--budget", help="Carbon budget, e.g. 20kg/day (none spent yet).")
    ] = None,
    objective: Annotated[str, Opt("--objective", help="carbon, cost or mix:W.")] = "carbon",
    power_limit: Annotated[
        str | None,
        Opt(
            "--power-limit", help="Site limit on the jobs' draw, e.g. 15kW (default: the daemon's)."
        ),
    ] = None,
    slot: Annotated[str, Opt("--slot", help="Planning slot, e.g. 15m.")] = "15m",
    at: Annotated[
        str | None,
        Opt("--at", help="Plan as of this time (ISO, local if naive), not now."),
    ] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (stable keys).")] = False,
    submit: Annotated[
        bool,
        Opt(
            "--submit",
            help="Hand the plan to the Slurm node: sbatch --begin at each planned start "
            "(jobs handed over before and not started yet move to their new start).",
        ),
    ] = False,
) -> None:
    """Plan the queued jobs: start, GPUs, power cap, and expected energy, carbon and cost
    against running each now at full power."""
    from orchestrator.cli.render import print_json
    from orchestrator.timeparse import aware_text

    grid, price, at = absolute_source(grid), absolute_source(price), aware_text(at)
    args = {"policy": policy, "grid": grid, "price": price, "budget": budget,
            "objective": objective, "slot": slot, "at": at, "submit": submit,
            "power_limit": power_limit}  # fmt: skip
    data = context.get(ctx).call("plan", args)
    if as_json:
        print_json(data)
        return
    _table(data)


def absolute_source(spec: str | None) -> str | None:
    """A CSV trace named relative to this shell's directory, made absolute: the daemon that
    reads it runs elsewhere."""
    import os

    if not spec or not spec.startswith("csv:"):
        return spec
    path, sep, options = spec[4:].partition("?")
    if path and not os.path.isabs(os.path.expanduser(path)):
        path = os.path.abspath(os.path.expanduser(path))
    return f"csv:{path}{sep}{options}"


def _columns():
    """``plan``'s columns; a narrow terminal leaves out SAVING, NOW kg, NAME, CAP, kWh
    first."""
    from orchestrator.cli.output.tables import Col

    return (
        Col("ID", right=True),
        Col("NAME", drop=3),
        Col("START"),
        Col("WAIT h", right=True),
        Col("GPUS", right=True),
        Col("CAP", right=True, drop=4),
        Col("kWh", right=True, drop=5),
        Col("kg CO2e", right=True),
        Col("NOW kg", right=True, drop=2),
        Col("SAVING", right=True, drop=1),
    )


def _table(data: dict) -> None:
    from orchestrator.cli.output.jobtext import when
    from orchestrator.cli.output.tables import num, say, table
    from orchestrator.timeparse import format_duration

    head = f"{data['policy']} plan at {when(data['now'])} for {data['gpus']} GPUs"
    if data["budget"]:
        head += f", budget {data['budget']} (none spent yet: accounting comes with the daemon)"
    if data.get("power_limit_w"):
        head += f", power limit {data['power_limit_w'] / 1000:g} kW"
    say(head, "bold")
    if not data["jobs"]:
        say("no queued jobs")
        return
    rows = []
    for r in data["jobs"]:
        now = r["now_full_power"] or {}
        rows.append(
            [
                str(r["id"]),
                r["name"] or "",
                when(r["start"]) + (" *" if r["forced"] else "") + (" ⋯" if r["intervals"] else ""),
                num(r["wait_h"], 1),
                str(r["gpus"]),
                num(100 * r["cap"], 0, "%"),
                num(r["energy_kwh"], 2),
                num(r["carbon_kg"], 3),
                num(now.get("carbon_kg"), 3),
                num(r["carbon_saving_pct"], 0, "%"),
            ]
        )
    table(_columns(), rows)
    say(
        "CAP: power cap, share of the GPU's maximum limit; NOW: the job started now at"
        " full power; * started by its deadline; ⋯ runs in pieces (--json lists them)",
        "dim",
    )
    for r in data["jobs"]:
        if r.get("after"):
            waits = ", ".join(str(a) for a in r["after"])
            say(f"job {r['id']}: after job {waits} (starts when it has ended)", "dim")
        if r.get("estimate_source") not in (None, "duration"):
            run = format_duration(r["estimate_s"])
            say(f"job {r['id']}: run time {run} {r['estimate_note']}", "dim")
    if any(not r["estimated"] for r in data["jobs"]):
        say("jobs that use no GPU have no model: they start now", "dim")
    for s in data.get("submitted", []):
        slurm = f" (Slurm job {s['slurm_job_id']})" if s.get("slurm_job_id") else ""
        say(f"job {s['id']}: {s['action']}{slurm}, start {when(s['start'])}")
