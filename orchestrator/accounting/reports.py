"""What ran, added up: the budget per period and reports per user and per label.

The saving of a job is measured against running it at submission: its energy spread
evenly over a run as long as its attempts together, starting when it was submitted,
times the grid signal then (the signal's history from the configured source; None where
there is none).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from orchestrator.planning.budgets import J_PER_KWH, Budget
from orchestrator.queue.models import Attempt, Job, Usage


def budget_periods(session: Session, budget: Budget, now: datetime, periods: int) -> dict:
    """Spent, remaining and projected grams in the current period, and the last
    ``periods`` periods' spending."""
    now_s = now.timestamp()
    spent: dict[float, float] = defaultdict(float)
    energy = budget.kind == "energy"  # then in Wh, a budget's unit (planning.budgets)
    column = Usage.energy_j if energy else Usage.carbon_g
    for day, amount in session.exec(select(Usage.day, column)).all():
        spent[budget.period_of(day.timestamp())[0]] += amount / 3600.0 if energy else amount
    start, end = budget.period_of(now_s)
    current = spent.get(start, 0.0)
    elapsed = now_s - start if start > -1e18 else None
    length = end - start if end < 1e18 and start > -1e18 else None
    projected = current * length / elapsed if elapsed and length else None
    rows = []
    for p in sorted(spent)[-periods:]:
        rows.append(
            {
                "period_start": _iso(p),
                "spent_g": round(spent[p], 3),
                "over_g": round(max(0.0, spent[p] - budget.grams), 3),
            }
        )
    return {
        "budget": str(budget),
        "unit": budget.unit,  # kg, or kWh for an energy budget (the *_g keys: g, or Wh)
        "budget_g": budget.grams,
        "period_start": _iso(start),
        "period_end": _iso(end),
        "spent_g": round(current, 3),
        "remaining_g": round(max(0.0, budget.grams - current), 3),
        "projected_g": None if projected is None else round(projected, 3),
        "periods": rows,
    }


def report(
    session: Session, since: datetime | None, carbon=None, price=None, viewer_uid=None
) -> dict:
    """kWh, kg CO2e, cost and saving per user and per label of the jobs that ran since
    ``since``. ``carbon``/``price``: StepSeries of the signals (for the saving).
    ``viewer_uid``: the member who asks, who sees only their own jobs' labels (another
    user's labels are private): others' jobs count in the totals, per user and, in one row,
    in ``others_labels_hidden``; None: every job's labels (root, the queue's owner)."""
    query = select(Job).where(col(Job.energy_j).is_not(None))
    if since is not None:
        query = query.where(col(Job.submitted_at) >= since)
    jobs = session.exec(query.order_by(col(Job.id))).all()
    ran = _run_seconds(session, [j.id for j in jobs])
    by_user: dict[str, dict] = defaultdict(_zero)
    by_label: dict[str, dict] = defaultdict(_zero)
    total, hidden = _zero(), _zero()
    for job in jobs:
        row = _job_figures(job, ran.get(job.id, 0.0), carbon)
        if viewer_uid is None or job.uid == viewer_uid:
            labelled = [by_label[lb] for lb in job.labels or ["-"]]
        else:
            labelled = [hidden]
        for bucket in (by_user[job.user], total, *labelled):
            _add(bucket, row)
    finished = [j.finished_at for j in jobs if j.finished_at]
    idle = idle_energy(session, since)
    total["idle_energy_kwh"], total["idle_carbon_kg"] = idle["energy_kwh"], idle["carbon_kg"]
    return {
        "idle": idle,
        "since": _iso(since.timestamp()) if since else None,
        # the period the jobs cover: the first one's submission to the last one's end
        "first_submitted_at": _iso(min(j.submitted_at for j in jobs).timestamp()) if jobs else None,
        "last_finished_at": _iso(max(finished).timestamp()) if finished else None,
        "total": _finish(total),
        "by_user": {k: _finish(v) for k, v in sorted(by_user.items())},
        "by_label": {k: _finish(v) for k, v in sorted(by_label.items())},
        "others_labels_hidden": _finish(hidden) if hidden["jobs"] else None,
    }


def _run_seconds(session: Session, job_ids: list[int]) -> dict[int, float]:
    out: dict[int, float] = defaultdict(float)
    if job_ids:
        for att in session.exec(select(Attempt).where(col(Attempt.job_id).in_(job_ids))).all():
            # a run still going counts up to where its energy was accounted
            end = att.finished_at or att.accounted_until
            if att.started_at and end and end > att.started_at:
                out[att.job_id] += (end - att.started_at).total_seconds()
    return out


def _job_figures(job: Job, run_s: float, carbon) -> dict:
    at_submission = None
    if carbon is not None and not job.energy_j:
        at_submission = 0.0  # nothing ran: nothing to compare, and nothing unknown
    elif carbon is not None and run_s > 0:
        t0 = job.submitted_at.timestamp()
        mean = float(carbon.integral(t0, t0 + run_s)) / run_s
        at_submission = job.energy_j * mean / J_PER_KWH
    return {
        "jobs": 1,
        "energy_kwh": job.energy_j / J_PER_KWH,
        "carbon_g": job.carbon_g,
        "cost": job.cost,
        "carbon_at_submission_g": at_submission,
        "modelled": bool(job.energy_modelled),
    }


def _zero() -> dict:
    return {
        "jobs": 0,
        "energy_kwh": 0.0,
        "carbon_g": 0.0,
        "cost": 0.0,
        "carbon_at_submission_g": 0.0,
        "modelled_jobs": 0,
        "_unknown": set(),
    }


def _add(bucket: dict, row: dict) -> None:
    bucket["jobs"] += 1
    bucket["energy_kwh"] += row["energy_kwh"]
    bucket["modelled_jobs"] += int(row["modelled"])
    for key in ("carbon_g", "cost", "carbon_at_submission_g"):
        if row[key] is None:
            bucket["_unknown"].add(key)
        else:
            bucket[key] += row[key]


def idle_energy(session: Session, since: datetime | None) -> dict:
    """Idle energy (``idle_usage``: idle GPUs, servers on without a job, times the PUE)
    in all and per node, from the UTC hour of ``since`` on (a row written before revision
    0013 holds its whole UTC day under its 00:00: counted when ``since`` is at or before
    that midnight)."""
    from orchestrator.queue.models import IdleUsage

    nulls = func.sum(case((col(IdleUsage.carbon_g).is_(None), 1), else_=0))
    query = select(
        IdleUsage.node, func.sum(IdleUsage.energy_j), func.sum(IdleUsage.carbon_g), nulls
    ).group_by(IdleUsage.node)  # fmt: skip  (summed by the database)
    if since is not None:
        hour = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        query = query.where(col(IdleUsage.hour) >= hour)
    energy: dict[str, float] = {}
    carbon: dict[str, float | None] = {}  # None: some row had no signal
    for node, joules, grams, unknown in session.exec(query).all():
        energy[node] = float(joules or 0.0)
        carbon[node] = None if unknown else float(grams or 0.0)

    def kg(values) -> float | None:
        values = list(values)
        return None if None in values else round(sum(values) / 1e3, 6)

    return {
        "energy_kwh": round(sum(energy.values()) / J_PER_KWH, 6),
        "carbon_kg": kg(carbon.values()),
        "by_node": {
            n: {"energy_kwh": round(energy[n] / J_PER_KWH, 6), "carbon_kg": kg([carbon[n]])}
            for n in sorted(energy)
        },
    }


def _finish(bucket: dict) -> dict:
    unknown = bucket.pop("_unknown")
    out = {
        "jobs": bucket["jobs"],
        "energy_kwh": round(bucket["energy_kwh"], 6),
        "modelled_jobs": bucket["modelled_jobs"],
        "carbon_kg": None if "carbon_g" in unknown else round(bucket["carbon_g"] / 1e3, 6),
        "cost": None if "cost" in unknown else round(bucket["cost"], 4),
        "carbon_at_submission_kg": None,
        "saving_pct": None,
    }
    if "idle_energy_kwh" in bucket:  # the total: the cluster's idle energy beside the jobs'
        out["idle_energy_kwh"] = bucket["idle_energy_kwh"]
        out["idle_carbon_kg"] = bucket["idle_carbon_kg"]
    if "carbon_at_submission_g" not in unknown and "carbon_g" not in unknown:
        base = bucket["carbon_at_submission_g"]
        out["carbon_at_submission_kg"] = round(base / 1e3, 6)
        if base > 0:
            out["saving_pct"] = round(100 * (1 - bucket["carbon_g"] / base), 1)
    return out


def _iso(t_s: float) -> str | None:
    if t_s < -1e18 or t_s > 1e18:
        return None
    return datetime.fromtimestamp(t_s, UTC).isoformat()
