"""status, budget and report: the daemon's health, the carbon budget, and what ran per
user and per label (lab-wide figures: every member sees them; labels only their own)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from orchestrator.daemon.ops.base import Args, Caller, OpContext, check_source
from orchestrator.daemon.ops.views import iso
from orchestrator.errors import SpecError

HEALTH_KEYS = (
    "policy", "mode", "fallback_reason", "slot_s", "suspend", "power_caps",
    "power_caps_reason", "queued_jobs", "running_jobs", "stopped_jobs", "running_gpus",
    "power_w", "signal", "budget", "nodes_unreachable", "settings", "power_limit",
    "nodes_power",
)  # fmt: skip


def status(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """``data`` is what ``status --json`` prints; ``pid`` and ``seen`` are for its text."""
    from orchestrator.queue.models import Health
    from orchestrator.timeparse import utc_now

    now = utc_now()
    with ctx.db.read() as session:
        row = session.get(Health, 1)
    running = ctx.daemon_running()
    figures = {k: (row.data.get(k) if row else None) for k in HEALTH_KEYS}
    signal = figures.get("signal")
    if row and not running and isinstance(signal, dict) and signal.get("age_s") is not None:
        # a stopped daemon's snapshot: the signal has aged since its last pass
        gone_s = max(0.0, (now - row.last_tick).total_seconds())
        figures["signal"] = signal | {"age_s": round(signal["age_s"] + gone_s, 1)}
    data = {
        "daemon": "running" if running else "stopped",
        "pid": row.pid if row and running else None,
        "started_at": iso(row.started_at) if row else None,
        "last_tick": iso(row.last_tick) if row else None,
        "last_tick_age_s": round((now - row.last_tick).total_seconds(), 1) if row else None,
        **figures,
    }
    return {"data": data, "pid": row.pid if row else None, "seen": row is not None}


def budget(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.accounting.reports import budget_periods
    from orchestrator.planning.budgets import Budget
    from orchestrator.timeparse import utc_now

    text, source = chosen(ctx, "budget", args.get("budget", str), ctx.settings.daemon.budget)
    if not text:
        raise SpecError(
            "no budget: give --budget (e.g. 20kg/day), set daemon.budget, or start the "
            "daemon with --budget"
        )
    parsed = Budget.parse(text)
    periods = args.get("periods", int, 7)
    if periods < 1:
        raise SpecError("--periods must be at least 1")
    with ctx.db.read() as session:
        data = budget_periods(session, parsed, utc_now(), periods)
        return (
            data
            | forced_starts(session, parsed, data)
            | {
                "budget_from": source["from"],
                "daemon_stopped_at": source["stopped_at"],
            }
        )


def daemon_setting(ctx: OpContext, key: str):
    """What the running daemon runs with, as its health records it (``settings``: grid,
    price, budget, policy, objective); None when no daemon runs (a stopped daemon's
    settings are history: the config file speaks then) or none recorded it."""
    value, stopped_at = _recorded(ctx, key)
    return value if stopped_at is None else None


def chosen(ctx: OpContext, key: str, given, configured) -> tuple[object, dict]:
    """A setting and where it comes from (``from``: ``option``, ``daemon``, ``config`` or
    ``stopped-daemon`` with ``stopped_at``, the stopped daemon's last pass), in that
    order: the last is what a stopped daemon ran with, so ``status && budget && report``
    after a ``daemon --budget 20kg/day`` still answers, and says it is history."""
    if given:
        return given, {"from": "option", "stopped_at": None}
    value, stopped_at = _recorded(ctx, key)
    if value and stopped_at is None:
        return value, {"from": "daemon", "stopped_at": None}
    if configured:
        return configured, {"from": "config", "stopped_at": None}
    if value:
        return value, {"from": "stopped-daemon", "stopped_at": stopped_at}
    return None, {"from": None, "stopped_at": None}


def _recorded(ctx: OpContext, key: str) -> tuple[object, str | None]:
    """The daemon's recorded setting, and None while it runs or the ISO time of its last
    pass when it has stopped."""
    from orchestrator.queue.models import Health

    running = ctx.daemon_running()
    with ctx.db.read() as session:
        row = session.get(Health, 1)
    recorded = (row.data or {}).get("settings") if row else None
    value = recorded.get(key) if isinstance(recorded, dict) else None
    if value is None or running:
        return value, None
    return value, iso(row.last_tick)


def forced_starts(session, budget, data: dict) -> dict:
    """The starts a deadline forced beyond the budget in the current period (``forced``:
    job, user, attempt, when, and what each was expected to spend, ``g`` in the budget's
    unit: g CO2e, or Wh for an energy budget; ``forced_g``: their sum), and each listed
    period's ``forced_g``. From the attempts the daemon marked when it started them."""
    from sqlmodel import col, select

    from orchestrator.queue.models import Attempt, Job

    rows = session.exec(
        select(Attempt, Job.user)
        .join(Job, col(Job.id) == col(Attempt.job_id))
        .where(col(Attempt.forced_g).is_not(None))
        .order_by(col(Attempt.started_at), col(Attempt.id))
    ).all()
    energy = budget.kind == "energy"
    current, by_period = [], {p["period_start"]: 0.0 for p in data["periods"]}
    for att, user in rows:
        at_s = att.started_at.timestamp() if att.started_at else None
        if at_s is None:
            continue
        grams = (att.forced_wh or 0.0) if energy else att.forced_g
        start = _period_iso(budget.period_of(at_s)[0])
        if start in by_period:
            by_period[start] += grams
        if start == data["period_start"]:
            current.append(
                {"job": att.job_id, "user": user, "attempt": att.number,
                 "at": iso(att.started_at), "g": round(grams, 3)}
            )  # fmt: skip
    periods = [p | {"forced_g": round(by_period[p["period_start"]], 3)} for p in data["periods"]]
    total = round(sum(f["g"] for f in current), 3)
    return {"forced": current, "forced_g": total, "periods": periods}


def _period_iso(t_s: float) -> str | None:
    """As ``budget_periods`` names a period: None for a whole-run budget's."""
    return datetime.fromtimestamp(t_s, UTC).isoformat() if math.isfinite(t_s) else None


def report(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Energy, carbon and cost per user and per label, and the carbon saved."""
    from orchestrator.accounting.reports import report as make_report
    from orchestrator.timeparse import utc_now

    now = utc_now()
    since, grid = args.get("since", str), args.get("grid", str)
    check_source(ctx, caller, grid)
    start = _since(since, now) if since is not None else None
    with ctx.db.read() as session:
        carbon, label, source = _history(ctx, grid, session, start, now)
        viewer = None if ctx.privileged(caller) else caller.uid  # others' labels are private
        data = make_report(session, start, carbon, viewer_uid=viewer)
    data["signal"] = label
    data["signal_from"] = source["from"] if label else None
    data["daemon_stopped_at"] = source["stopped_at"] if label else None
    return data


def _since(text: str, now):
    """``--since``: a duration back from now (at most a year) or a date not after now."""
    from orchestrator.daemon.ops.base import when
    from orchestrator.timeparse import MAX_DURATION_TEXT, check_seconds, total_duration_s

    shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
    try:
        seconds = total_duration_s(text)
    except SpecError:
        pass
    else:  # a duration: longer than zero, at most a year
        try:
            return now - timedelta(seconds=check_seconds(seconds))
        except SpecError:
            raise SpecError(f"invalid --since {shown}: a duration longer than zero and at "
                            f"most {MAX_DURATION_TEXT}") from None  # fmt: skip
    try:
        start = when(text)
    except SpecError:
        raise SpecError(f"invalid --since {shown}: give a duration (7d) or a date") from None
    if start > now:
        raise SpecError(f"invalid --since {shown}: that is in the future")
    return start


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
    configured = settings.daemon.grid or settings.grid.source
    specs, source = chosen(ctx, "grid", [grid] if grid else None, configured)
    if not specs:
        return None, None, source
    first, last = session.exec(select(func.min(Job.submitted_at), func.max(Job.finished_at)).where(
        col(Job.energy_j).is_not(None))).one()  # fmt: skip
    if first is None:
        return None, None, source
    first = max(first, start) if start else first
    try:
        chain = open_chain(settings, specs)
        signal = chain.history(first - timedelta(hours=1), (last or now) + timedelta(days=1))
        series, _ = StepSeries.from_signal(signal)
    except (GridDataError, GridshiftError):
        return None, None, source
    return series, chain.spec, source
