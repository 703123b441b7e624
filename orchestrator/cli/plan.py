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
    slot: Annotated[str, Opt("--slot", help="Planning slot, e.g. 15m.")] = "15m",
    at: Annotated[
        str | None, Opt("--at", help="Plan as of this time (ISO, UTC if naive), not now.")
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

    grid, price = absolute_source(grid), absolute_source(price)
    args = {"policy": policy, "grid": grid, "price": price, "budget": budget,
            "objective": objective, "slot": slot, "at": at, "submit": submit}  # fmt: skip
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


def _table(data: dict) -> None:
    from rich.table import Table

    from orchestrator.cli.render import console, safe
    from orchestrator.timeparse import format_duration

    out = console()
    head = f"[bold]{safe(data['policy'])}[/] plan at {data['now'][:16]} for {data['gpus']} GPUs"
    if data["budget"]:
        head += f", budget {data['budget']} (none spent yet: accounting comes with the daemon)"
    out.print(head)
    if not data["jobs"]:
        out.print("no queued jobs")
        return
    table = Table(box=None, pad_edge=False)
    for col in (
        "ID",
        "NAME",
        "START",
        "WAIT h",
        "GPUS",
        "CAP",
        "kWh",
        "kg CO2e",
        "NOW kg",
        "SAVING",
    ):
        table.add_column(col, justify="left" if col in ("NAME", "START") else "right")
    for r in data["jobs"]:
        now = r["now_full_power"] or {}
        saving = "-" if r["carbon_saving_pct"] is None else f"{r['carbon_saving_pct']:.0f}%"
        table.add_row(
            str(r["id"]),
            safe(r["name"] or ""),
            r["start"][:16] + (" *" if r["forced"] else "") + (" ⋯" if r["intervals"] else ""),
            f"{r['wait_h']:.1f}",
            str(r["gpus"]),
            f"{100 * r['cap']:.0f}%",
            "-" if r["energy_kwh"] is None else f"{r['energy_kwh']:.2f}",
            "-" if r["carbon_kg"] is None else f"{r['carbon_kg']:.3f}",
            "-" if not now else f"{now['carbon_kg']:.3f}",
            saving,
        )
    out.print(table)
    out.print(
        "[dim]CAP: power cap, share of the GPU's maximum limit; NOW: the job started now at"
        " full power; * started by its deadline; ⋯ runs in pieces (--json lists them)[/]"
    )
    for r in data["jobs"]:
        if r.get("after"):
            waits = ", ".join(str(a) for a in r["after"])
            out.print(f"[dim]job {r['id']}: after job {waits} (starts when it has ended)[/]")
        if r.get("estimate_source") not in (None, "duration"):
            run = format_duration(r["estimate_s"])
            out.print(f"[dim]job {r['id']}: run time {run} {safe(r['estimate_note'])}[/]")
    if any(not r["estimated"] for r in data["jobs"]):
        out.print("[dim]jobs that use no GPU have no model: they start now[/]")
    for s in data.get("submitted", []):
        slurm = f" (Slurm job {s['slurm_job_id']})" if s.get("slurm_job_id") else ""
        out.print(f"job {s['id']}: {safe(s['action'])}{slurm}, start {s['start'][:19]}")
