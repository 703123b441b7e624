"""``ls``'s request: the jobs, filtered by state, user and label, each with what it
waits for (an unfinished dependency, GPUs, low carbon, the budget) and its run time
without its suspensions. Filters run here, so the daemon and single-user mode agree."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.errors import SpecError

STATES = ("queued", "planned", "running", "suspended", "completed", "failed", "cancelled", "lost")
FINISHED = ("completed", "failed", "cancelled")


def states_of(values: list[str]) -> list[str]:
    """``--state`` values (each may be a comma list), checked; one line for a bad one."""
    names = [s.strip().lower() for v in values for s in v.split(",") if s.strip()]
    if values and not names:  # ``--state ''`` or ``--state ,,``: not "every state"
        raise SpecError(f"--state names no state; known: {', '.join(STATES)}")
    bad = [s for s in names if s not in STATES]
    if bad:
        raise SpecError(f"unknown state {bad[0]!r}; known: {', '.join(STATES)}")
    return list(dict.fromkeys(names))


def ls(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Every user's jobs (others' as ``squeue`` shows them); ``all``: finished ones too;
    ``states``/``users``/``labels``: only those (any of each list, all lists)."""
    from orchestrator.daemon.ops.views import job_dict, public_view
    from orchestrator.queue import store
    from orchestrator.timeparse import utc_now

    states = states_of([str(s) for s in args.get("states", list, [])])
    users = [str(u) for u in args.get("users", list, [])]
    labels = [str(la) for la in args.get("labels", list, [])]
    show_all = bool(args.get("all", bool, False)) or any(s in FINISHED for s in states)
    now = utc_now()
    with ctx.db.read() as session:
        jobs = store.list_jobs(session, include_finished=show_all)
        jobs = [j for j in jobs if (not states or j.state in states)]
        jobs = [j for j in jobs if (not users or j.user in users)]
        deps = store.dependencies(session, [j.id for j in jobs])
        hidden = 0 if show_all or states else _hidden(session, users)
        reports = store.latest_progress(session, [j.id for j in jobs if j.attempts])
        ran = runtimes(session, jobs, now)
        open_deps = unfinished(session, deps)
        budgeted = has_budget(session, ctx.settings)
    out = []
    for j in jobs:
        data = job_dict(
            j, deps[j.id], str(ctx.settings.log_path(j.id)), reports.get(j.id), now,
            waits_for=open_deps.get(j.id, []), runtime_s=ran.get(j.id), budgeted=budgeted,
        )  # fmt: skip
        mine = ctx.privileged(caller) or j.uid == caller.uid
        data = data if mine else public_view(data)
        if labels and not set(labels) & set(data["labels"]):  # others' labels are private
            continue
        out.append(data)
    return {"jobs": out, "hidden": 0 if labels else hidden}


def has_budget(session, settings) -> bool:
    """Whether the daemon plans against a budget: its config, or the ``--budget`` it
    runs with (its last word in the health row)."""
    from orchestrator.queue.models import Health

    if settings.daemon.budget:
        return True
    health = session.get(Health, 1)
    return bool(health and (health.data or {}).get("budget"))


def _hidden(session, users: list[str]) -> int:
    from sqlalchemy import func
    from sqlmodel import col, select

    from orchestrator.queue.models import Job

    query = select(func.count()).select_from(Job).where(col(Job.state).in_(FINISHED))
    if users:
        query = query.where(col(Job.user).in_(users))
    return int(session.exec(query).one())


def unfinished(session, deps: dict[int, list[int]]) -> dict[int, list[int]]:
    """Per job, the dependencies that have not completed yet (what it waits for)."""
    from sqlmodel import col, select

    from orchestrator.queue.models import Job

    wanted = sorted({d for ids in deps.values() for d in ids})
    if not wanted:
        return {}
    rows = session.exec(select(Job.id, Job.state).where(col(Job.id).in_(wanted))).all()
    done = {i for i, state in rows if state == "completed"}
    return {j: sorted(d for d in ids if d not in done) for j, ids in deps.items() if ids}


def runtimes(session, jobs: list, now: datetime) -> dict[int, float]:
    """Per job that ran, the seconds its attempts ran: from each start to its end (or
    now), less the time each spent stopped (``--suspend stop``); a job suspended by
    signal and requeued adds only its attempts, not the wait between them."""
    from sqlmodel import col, or_, select

    from orchestrator.queue.models import Attempt, AttemptEvent

    ids = [j.id for j in jobs if j.attempts]
    if not ids:
        return {}
    attempts = session.exec(
        select(Attempt.id, Attempt.job_id, Attempt.started_at, Attempt.finished_at).where(
            col(Attempt.job_id).in_(ids)
        )
    ).all()
    stops: dict[int, list[Any]] = {}
    for e in session.exec(
        select(AttemptEvent)
        .where(col(AttemptEvent.job_id).in_(ids))
        .where(or_(AttemptEvent.to_state == "stopped", AttemptEvent.from_state == "stopped"))
        .order_by(col(AttemptEvent.id))
    ):
        stops.setdefault(e.attempt_id, []).append(e)
    out: dict[int, float] = {}
    for attempt_id, job_id, started, finished in attempts:
        if started is None:
            continue
        end = finished or now
        run_s = (end - started).total_seconds()
        since = None
        for e in stops.get(attempt_id, []):
            if e.to_state == "stopped":
                since = e.at
            elif since is not None:
                run_s -= (e.at - since).total_seconds()
                since = None
        if since is not None:
            run_s -= (end - since).total_seconds()
        out[job_id] = out.get(job_id, 0.0) + max(0.0, run_s)
    return out
