"""status, budget and report: the daemon's health, the carbon budget, and what ran per
user and per label (lab-wide figures: every member sees them)."""

from __future__ import annotations

from datetime import timedelta

from orchestrator.daemon.ops.base import Args, Caller, OpContext, check_source
from orchestrator.daemon.ops.views import iso
from orchestrator.errors import SpecError

HEALTH_KEYS = (
    "policy", "mode", "fallback_reason", "slot_s", "suspend", "power_caps",
    "power_caps_reason", "queued_jobs", "running_jobs", "stopped_jobs", "running_gpus",
    "power_w", "signal", "budget", "nodes_unreachable",
)  # fmt: skip


def status(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """``data`` is what ``status --json`` prints; ``pid`` and ``seen`` are for its text."""
    from orchestrator.queue.models import Health
    from orchestrator.timeparse import utc_now

    now = utc_now()
    with ctx.db.read() as session:
        row = session.get(Health, 1)
    running = ctx.daemon_running()
    data = {
        "daemon": "running" if running else "stopped",
        "pid": row.pid if row and running else None,
        "started_at": iso(row.started_at) if row else None,
        "last_tick": iso(row.last_tick) if row else None,
        "last_tick_age_s": round((now - row.last_tick).total_seconds(), 1) if row else None,
        **{k: (row.data.get(k) if row else None) for k in HEALTH_KEYS},
    }
    return {"data": data, "pid": row.pid if row else None, "seen": row is not None}


def budget(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.accounting.reports import budget_periods
    from orchestrator.planning.budgets import Budget
    from orchestrator.timeparse import utc_now

    text = args.get("budget", str) or ctx.settings.daemon.budget
    if not text:
        raise SpecError("no budget: give --budget (e.g. 20kg/day) or set daemon.budget")
    parsed = Budget.parse(text)
    periods = args.get("periods", int, 7)
    if periods < 1:
        raise SpecError("--periods must be at least 1")
    with ctx.db.read() as session:
        return budget_periods(session, parsed, utc_now(), periods)


def report(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Energy, carbon and cost per user and per label, and the carbon saved."""
    from orchestrator.accounting.reports import report as make_report
    from orchestrator.timeparse import utc_now

    now = utc_now()
    since, grid = args.get("since", str), args.get("grid", str)
    check_source(ctx, caller, grid)
    start = _since(since, now) if since else None
    with ctx.db.read() as session:
        carbon, label = _history(ctx, grid, session, start, now)
        data = make_report(session, start, carbon)
    data["signal"] = label
    return data


def _since(text: str, now):
    from orchestrator.daemon.ops.base import when
    from orchestrator.timeparse import parse_duration_s

    try:
        return now - timedelta(seconds=parse_duration_s(text))
    except SpecError:
        pass
    try:
        return when(text)
    except SpecError:
        raise SpecError(f"invalid --since {text!r}: give a duration (7d) or a date") from None


def _history(ctx: OpContext, grid: str | None, session, start, now):
    """The carbon signal over the jobs' runs and its source, or (None, None) when no
    source answers."""
    from sqlmodel import col, func, select

    from grid.errors import GridDataError
    from grid.steps import StepSeries
    from orchestrator.errors import GridshiftError
    from orchestrator.queue.models import Job
    from orchestrator.signals.sources import open_chain

    settings = ctx.settings
    specs = [grid] if grid else (settings.daemon.grid or settings.grid.source)
    if not specs:
        return None, None
    first, last = session.exec(select(func.min(Job.submitted_at), func.max(Job.finished_at)).where(
        col(Job.energy_j).is_not(None))).one()  # fmt: skip
    if first is None:
        return None, None
    first = max(first, start) if start else first
    try:
        chain = open_chain(settings, specs)
        signal = chain.history(first - timedelta(hours=1), (last or now) + timedelta(days=1))
        series, _ = StepSeries.from_signal(signal)
    except (GridDataError, GridshiftError):
        return None, None
    return series, chain.spec
