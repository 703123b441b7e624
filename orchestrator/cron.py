"""Cron-style deferred training: recurring templates whose occurrences become jobs.

``gridshift submit --cron "0 2 * * *" --window 8h -- CMD`` stores a template. Each
occurrence (APScheduler's cron trigger, in this machine's time zone, as crontab reads it;
a sixth field in front gives seconds) queues the job with the occurrence as its
submission time and the occurrence plus the window as its deadline, so the planner picks
the greenest time inside the window.

The rule for occurrences missed while no daemon ran: of those whose window is still open,
the latest is queued and the older ones are skipped (as APScheduler's ``coalesce``); those
whose window has closed are skipped. Each skip is logged. A template's last occurrence is
stored in the same transaction as the job it queued, so a crash neither loses nor
repeats one.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from orchestrator.errors import NotFoundError, PermissionDenied, SpecError
from orchestrator.models import CronTemplate
from orchestrator.ownership import User
from orchestrator.spec import build_spec

log = logging.getLogger("gridshift.daemon")
MAX_CATCH_UP = 10_000  # occurrences looked at per template and pass, at most


def trigger(expr: str):
    """The cron trigger of ``expr``; one clear SpecError when it is not valid."""
    import tzlocal
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    zone = tzlocal.get_localzone()
    try:
        if len(fields) == 6:
            second, minute, hour, day, month, dow = fields
            return CronTrigger(
                second=second, minute=minute, hour=hour, day=day, month=month,
                day_of_week=dow, timezone=zone,
            )  # fmt: skip
        if len(fields) == 5:
            return CronTrigger.from_crontab(expr, timezone=zone)
    except ValueError as exc:
        raise SpecError(f"invalid cron expression {expr!r}: {exc}") from None
    raise SpecError(
        f"invalid cron expression {expr!r}: give 5 fields (minute hour day month weekday), "
        "or 6 with seconds first"
    )


def add(
    session: Session,
    raw: dict,
    cron: str,
    window_s: float,
    user: User,
    now: datetime,
    base_env: dict[str, str],
) -> CronTemplate:
    """Store a template after checking that its job is valid and fits its window."""
    trigger(cron)
    if raw.get("deadline") or raw.get("within"):
        raise SpecError("with --cron, the deadline is each occurrence plus --window")
    spec = build_spec(raw, now=now, cwd=raw["workdir"], base_env={})
    if spec.duration_s is not None and spec.duration_s > window_s:
        raise SpecError(
            f"the job runs {spec.duration_s / 3600:g} h, longer than its window "
            f"({window_s / 3600:g} h): it could never meet its deadline"
        )
    if spec.after:
        raise SpecError("a cron template cannot wait for other jobs (--after)")
    row = CronTemplate(
        cron=cron,
        window_s=window_s,
        spec=raw,
        env=base_env,
        user=user.name,
        uid=user.uid,
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row


def remove(session: Session, template_id: int, user: User, now: datetime) -> CronTemplate:
    row = session.get(CronTemplate, template_id)
    if row is None or row.removed_at is not None:
        raise NotFoundError(f"no cron template {template_id}")
    if not user.is_root and row.uid != user.uid:
        raise PermissionDenied(
            f"cron template {row.id} belongs to {row.user}; only they or root may remove it"
        )
    row.removed_at = now
    session.add(row)
    return row


def active(session: Session) -> list[CronTemplate]:
    return list(
        session.exec(
            select(CronTemplate)
            .where(col(CronTemplate.removed_at).is_(None))
            .order_by(col(CronTemplate.id))
        ).all()
    )


def next_fire(row: CronTemplate, now: datetime) -> datetime | None:
    """The template's next occurrence after ``now`` (and after its last one)."""
    return _after(trigger(row.cron), max(row.last_fire or row.created_at, now))


def _after(trig, since: datetime) -> datetime | None:
    """The first occurrence strictly after ``since``."""
    return trig.get_next_fire_time(since, since + timedelta(microseconds=1))


def due(row: CronTemplate, now: datetime) -> tuple[datetime | None, list[datetime]]:
    """(the occurrence to queue now or None, the occurrences skipped by the rule)."""
    trig = trigger(row.cron)
    since = row.last_fire or row.created_at
    fired: list[datetime] = []
    t = _after(trig, since)
    while t is not None and t <= now and len(fired) < MAX_CATCH_UP:
        fired.append(t)
        t = _after(trig, t)
    if not fired:
        return None, []
    window = timedelta(seconds=row.window_s)
    open_ = [f for f in fired if f + window > now]
    chosen = open_[-1] if open_ else None
    return chosen, [f for f in fired if f != chosen]


def materialise(db, now: datetime, largest_node_gpus: int) -> list[int]:
    """Queue the due occurrence of every template. Returns the new job ids."""
    from orchestrator.store import insert_jobs

    with db.read() as session:
        rows = active(session)
    queued = []
    for row in rows:
        chosen, skipped = due(row, now)
        if chosen is None and not skipped:
            continue
        for when in skipped:
            log.warning(
                "cron template %s: the occurrence at %s was missed while no daemon ran; skipped",
                row.id,
                when.isoformat(timespec="seconds"),
            )
        with db.write() as session:
            fresh = session.get(CronTemplate, row.id)
            if fresh.removed_at is not None or fresh.last_fire != row.last_fire:
                continue  # removed, or another pass queued it
            last = max([*skipped, *([chosen] if chosen else [])])
            fresh.last_fire = last
            session.add(fresh)
            if chosen is None:
                continue
            raw = dict(fresh.spec)
            spec = build_spec(raw, now=chosen, cwd=raw["workdir"], base_env=fresh.env)
            spec = spec.model_copy(update={"deadline": chosen + timedelta(seconds=fresh.window_s)})
            if spec.gpus_min > largest_node_gpus:
                log.warning("cron template %s: needs more GPUs than a node has", row.id)
                continue
            user = User(name=fresh.user, uid=fresh.uid)
            (job,) = insert_jobs(session, [spec], user=user, now=chosen, cron_id=fresh.id)
            queued.append(job.id)
        log.info("cron template %s: queued job %s (occurrence %s)", row.id, job.id, chosen)
    return queued
