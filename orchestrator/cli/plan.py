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
    from orchestrator import store
    from orchestrator.budget import Budget, BudgetState
    from orchestrator.cli.render import print_json
    from orchestrator.errors import SpecError
    from orchestrator.inventory import resolve_nodes
    from orchestrator.perfmodel import curve_for
    from orchestrator.plan_view import PlanInputs, build_snapshot, plan_rows
    from orchestrator.policies.base import check_objective, resolve_policy
    from orchestrator.timeparse import parse_duration_s, utc_now

    chosen = resolve_policy(policy)
    if getattr(chosen, "clairvoyant", False):
        raise SpecError(f"{chosen.name} needs every future job: it runs only in simulate")
    objective = check_objective(objective, bool(price))
    slot_s = parse_duration_s(slot)
    parsed_budget = Budget.parse(budget) if budget else None
    now = _when(at) if at else utc_now()
    c = context.get(ctx)
    if submit:  # before planning: a plan that cannot be handed over is not worth making
        from orchestrator.daemon import slurm_executors
        from orchestrator.handover import slurm_nodes

        slurm_nodes(resolve_nodes(c.settings))
        slurm_executors(c.settings, c.db)
    with c.db.read() as session:
        jobs = store.list_jobs(session, include_finished=False)
    queued = [j for j in jobs if j.state == "queued"]
    if submit:  # handed over before, not started: planned again, and moved if need be
        from orchestrator.handover import handed_over

        pending = handed_over(c.db)
        queued += [j for j in jobs if j.state == "planned" and j.id in pending]
    running = [
        (j, len(j.gpu_ids or []), j.started_at)
        for j in jobs
        if j.state == "running" and j.started_at
    ]
    nodes = resolve_nodes(c.settings)
    total = sum(n.gpu_count for n in nodes)
    largest = max((n.gpu_count for n in nodes), default=0)
    curve = curve_for(next((n.gpu_model for n in nodes if n.gpu_model), None))
    horizon_s = _horizon_s(queued, now.timestamp())
    carbon = _forecast(c.settings, grid, now, horizon_s)
    price_fc = _forecast(c.settings, price, now, horizon_s) if price else None
    state = None
    if parsed_budget is not None:
        start, end = parsed_budget.period_of(now.timestamp())
        state = BudgetState(parsed_budget, start, end, 0.0)
    inputs = PlanInputs(
        now.timestamp(), queued, running, total, curve, carbon, price_fc, state,
        objective, slot_s,
    )  # fmt: skip
    rows = plan_rows(chosen, build_snapshot(inputs, largest), inputs)
    data = {
        "policy": chosen.name,
        "now": now.isoformat(),
        "objective": inputs.objective,
        "budget": str(parsed_budget) if parsed_budget else None,
        "gpus": total,
        "running": len(running),
        "jobs": rows,
    }
    if submit:
        from orchestrator.handover import hand_over
        from orchestrator.ownership import current_user

        data["submitted"] = hand_over(c.settings, c.db, rows, now, current_user())
    if as_json:
        print_json(data)
        return
    _table(data)


def _when(text: str):
    from datetime import UTC

    from grid.sources.base import parse_time
    from orchestrator.errors import SpecError

    try:
        value = parse_time(text)
    except ValueError:
        raise SpecError(f"invalid time {text!r}: use ISO 8601, e.g. 2023-03-06T10:00") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _horizon_s(queued, now_s: float) -> float:
    latest = [j.deadline.timestamp() for j in queued if j.deadline]
    wanted = max([now_s + 48 * 3600.0, *latest]) - now_s
    return min(wanted + 86400.0, 14 * 86400.0)


def _forecast(settings, spec: str | None, now, horizon_s: float):
    from datetime import timedelta

    from grid.errors import GridDataError as LeafGridError
    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.errors import GridDataError, translate
    from orchestrator.gridsource import open_chain

    try:
        chain = open_chain(settings, [spec] if spec else [])
        signal = chain.forecast(now, timedelta(seconds=horizon_s))
        if not len(signal.frame):
            raise GridDataError(f"{spec or 'grid source'}: no forecast from {now.isoformat()}")
        series, _ = StepSeries.from_signal(signal)
    except LeafGridError as exc:
        raise translate(exc) from None
    return StepForecaster(series)


def _table(data: dict) -> None:
    from rich.table import Table

    from orchestrator.cli.render import console

    out = console()
    head = f"[bold]{data['policy']}[/] plan at {data['now'][:16]} for {data['gpus']} GPUs"
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
            r["name"] or "",
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
    if any(not r["estimated"] for r in data["jobs"]):
        out.print("[dim]jobs without --duration have no estimate: they start now[/]")
    for s in data.get("submitted", []):
        slurm = f" (Slurm job {s['slurm_job_id']})" if s.get("slurm_job_id") else ""
        out.print(f"job {s['id']}: {s['action']}{slurm}, start {s['start'][:19]}")
