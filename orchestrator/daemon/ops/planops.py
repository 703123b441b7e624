"""plan: what a policy would do with the queue now, job by job (and, with ``submit``,
hand the plan to the Slurm node)."""

from __future__ import annotations

from datetime import timedelta

from orchestrator.daemon.ops.base import Args, Caller, OpContext, check_source, when
from orchestrator.errors import PermissionDenied, SpecError


def plan(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.nodes.inventory import resolve_nodes
    from orchestrator.planning.budgets import Budget, BudgetState
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.base import check_objective
    from orchestrator.planning.snapshot import PlanInputs, build_snapshot, plan_rows
    from orchestrator.queue import store
    from orchestrator.timeparse import parse_duration_s, utc_now

    settings = ctx.settings
    grid, price = args.get("grid", str), args.get("price", str)
    budget, at = args.get("budget", str), args.get("at", str)
    submit = bool(args.get("submit", bool, False))
    chosen = resolve_policy(args.get("policy", str, "budget"))
    if getattr(chosen, "clairvoyant", False):
        raise SpecError(f"{chosen.name} needs every future job: it runs only in simulate")
    objective = check_objective(args.get("objective", str, "carbon"), bool(price))
    slot_s = parse_duration_s(args.get("slot", str, "15m"))
    if not 1.0 <= slot_s <= 3600.0:  # as the daemon's (orchestrator.daemon.planner)
        raise SpecError(f"--slot {args.get('slot', str)}: a planning slot is 1s to 1h")
    parsed_budget = Budget.parse(budget) if budget else None
    power_limit_w = _power_limit_w(args.get("power_limit", str), settings)
    for spec in (grid, price):
        check_source(ctx, caller, spec)
    if submit and ctx.shared and not ctx.privileged(caller):
        raise PermissionDenied("plan --submit moves every user's jobs: root's to give")
    now = when(at) if at else utc_now()
    if submit:  # before planning: a plan that cannot be handed over is not worth making
        from orchestrator.daemon.handover import slurm_nodes
        from orchestrator.nodes.backends import slurm_executors

        slurm_nodes(resolve_nodes(settings))
        slurm_executors(settings, ctx.db.safe_url)
    from orchestrator.accounting.estimates import estimates
    from orchestrator.daemon.planner import expected_load
    from orchestrator.planning.policies.base import DEFAULT_MAX_DEFER_S

    with ctx.db.read() as session:
        jobs = store.list_jobs(session, include_finished=False)
        default_s = settings.daemon.seconds("default_duration")
        known = estimates(session, jobs, default_s, now)
        after = store.dependencies(session, [j.id for j in jobs if j.state == "queued"])
        since = now - timedelta(seconds=DEFAULT_MAX_DEFER_S)  # the recent load, as the daemon
        submitted, first = store.submitted_since(session, since)
        spent = _spent(session, parsed_budget, now)
    queued = [j for j in jobs if j.state == "queued"]
    if submit:  # handed over before, not started: planned again, and moved if need be
        from orchestrator.daemon.handover import handed_over

        pending = handed_over(ctx.db)
        queued += [j for j in jobs if j.state == "planned" and j.id in pending]
    running = [
        (j, len(j.gpu_ids or []), j.started_at)
        for j in jobs
        if j.state == "running" and j.started_at
    ]
    nodes = resolve_nodes(settings)
    total = sum(n.gpu_count for n in nodes)
    largest = max((n.gpu_count for n in nodes), default=0)
    curve = curve_for(next((n.gpu_model for n in nodes if n.gpu_model), None))
    horizon_s = _horizon_s(queued, now.timestamp())
    carbon = _forecast(settings, grid, now, horizon_s)
    price_fc = _forecast(settings, price, now, horizon_s) if price else None
    state = None
    if parsed_budget is not None:
        start, end = parsed_budget.period_of(now.timestamp())
        state = BudgetState(parsed_budget, start, end, spent)
    load = expected_load(submitted, first, known, default_s, now.timestamp(), total, largest)
    inputs = PlanInputs(
        now.timestamp(), queued, running, total, curve, carbon, price_fc, state,
        objective, slot_s, estimates=known, after=after, expected_load=load,
        checkpoint_s=settings.daemon.seconds("checkpoint_cost"),
    )  # fmt: skip
    from orchestrator.daemon.energy.gputypes import planner_types, with_types
    from orchestrator.nodes.inventory import topology

    held = {j.id: (j.node,) for j, _, _ in running}  # the planner's capacity by GPU type
    inputs.type_gpus, inputs.running_types = planner_types(with_types(topology(nodes), nodes), held)
    snapshot = build_snapshot(inputs, largest)
    snapshot.power_limit_w = power_limit_w
    if args.get("power_limit", str) is not None:  # the daemon's own: its start check's
        from orchestrator.planning.limitfloor import check_plan_limit

        check_plan_limit(snapshot, "--power-limit")  # one no job could start under
    rows = plan_rows(chosen, snapshot, inputs)
    data = {
        "policy": chosen.name,
        "now": now.isoformat(),
        "objective": inputs.objective,
        "budget": str(parsed_budget) if parsed_budget else None,
        "gpus": total,
        "power_limit_w": snapshot.power_limit_w,
        "running": len(running),
        "jobs": rows,
    }
    if submit:
        from orchestrator.daemon.handover import hand_over

        data["submitted"] = hand_over(settings, ctx.db, rows, now, caller.user)
    return data


def _power_limit_w(given: str | None, settings) -> float | None:
    """--power-limit (15kW, 800W, 1.5MW), else the daemon's: the jobs' modelled draw in
    each slot stays under it (as in ``simulate``)."""
    from orchestrator.timeparse import parse_power_w

    if given is None:
        return settings.daemon.power_limit_w
    try:
        return parse_power_w(given)
    except SpecError as exc:
        raise SpecError(f"--power-limit: {exc}") from None


def _spent(session, budget, now) -> float:
    """What the budget's period has spent so far (the daemon's accounting, as its own
    plan reads it); 0 without a budget."""
    if budget is None:
        return 0.0
    from orchestrator.accounting.meter import spent_g
    from orchestrator.daemon.planner import period_window

    return spent_g(session, *period_window(budget, now), budget.kind)


def _horizon_s(queued, now_s: float) -> float:
    latest = [j.deadline.timestamp() for j in queued if j.deadline]
    wanted = max([now_s + 48 * 3600.0, *latest]) - now_s
    return min(wanted + 86400.0, 14 * 86400.0)


def _forecast(settings, spec: str | None, now, horizon_s: float):
    """The forecast the plan is made on (foreign errors: the caller's boundary)."""
    from datetime import timedelta

    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.errors import GridDataError
    from orchestrator.signals.sources import open_chain

    chain = open_chain(settings, [spec] if spec else [], flag="--grid")
    signal = chain.forecast(now, timedelta(seconds=horizon_s))
    if not len(signal.frame):
        _not_covered(spec, chain.sources, now)
        raise GridDataError(f"{spec or 'grid source'}: no forecast from {now.isoformat()}")
    series, _ = StepSeries.from_signal(signal)
    return StepForecaster(series)


def _not_covered(spec: str | None, sources: list, now) -> None:
    """A file the user named (``--grid csv:PATH``) whose data end before the plan's time is
    the user's to mend (exit 2), said with the range it covers; a provider that answered
    nothing is not (the caller's ``GridDataError``)."""
    from grid.sources.base import FileSource
    from orchestrator.errors import SpecError

    if not spec or not sources or not all(isinstance(s, FileSource) for s in sources):
        return
    index = sources[0].load().frame.index
    if not len(index):
        raise SpecError(f"{spec}: no data in it")
    raise SpecError(
        f"{spec}: its data run from {index[0]:%Y-%m-%d %H:%M} to {index[-1]:%Y-%m-%d %H:%M} "
        f"UTC, not from {now:%Y-%m-%d %H:%M} UTC: plan --at a time inside it, or give a grid "
        "source that covers it"
    )
