"""Cron-style deferred training: recurring templates whose occurrences become jobs.

``gridshift submit --cron "0 2 * * *" --window 8h -- CMD`` stores a template. Each
occurrence (``crontime``: crontab's fields in this machine's time zone, a sixth field in
front for seconds, one run per wall-clock occurrence across daylight-saving transitions)
queues the job with the occurrence as its submission time and the occurrence plus the
window as its deadline, so the planner picks the greenest time inside the window. A window
is at most ``MAX_WINDOW_S`` (one year); an expression that never fires is refused.

The rule for occurrences missed while no daemon ran: of those whose window is still open,
the latest is queued and the older ones are skipped (as APScheduler's ``coalesce``); those
whose window has closed are skipped. The skips are logged once, as one line with their
count; the work is bounded whatever the downtime. A template's cursor (``last_fire``, the
latest occurrence dealt with, strictly increasing) is stored in the same transaction as the
job it queued, so a crash neither loses nor repeats one.

Containment: a template never stops the daemon or the other jobs. A row that cannot be
read (its expression, window or job no longer valid, however it got so) is *disabled*; an
occurrence that cannot become a job (its working directory is gone, it needs more GPUs than
a node has) is skipped and the template *paused* until an occurrence can. Either way the
reason is stored in ``fault``, shown by ``cron ls`` and logged once, when it changes; a
paused template resumes by itself at the first occurrence that can be queued.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from sqlmodel import Session, col, select

from orchestrator.errors import NotFoundError, PermissionDenied, SpecError
from orchestrator.queue import crontime
from orchestrator.queue.checks import too_wide
from orchestrator.queue.models import CronTemplate
from orchestrator.queue.ownership import User
from orchestrator.queue.spec import build_spec
from orchestrator.timeparse import MAX_DURATION_S, MAX_DURATION_TEXT

log = logging.getLogger(__name__)
MAX_WINDOW_S = MAX_DURATION_S  # one year, as every other span
MAX_COUNTED = 1000  # missed occurrences counted one by one per template, at most
DISABLED, PAUSED = "disabled: ", "paused: "


def check_window(window_s: float) -> float:
    if not isinstance(window_s, int | float) or isinstance(window_s, bool):
        raise SpecError(f"invalid cron window {window_s!r}: not a number of seconds")
    if not math.isfinite(window_s) or not 0 < window_s <= MAX_WINDOW_S:
        raise SpecError(
            f"invalid cron window of {window_s:g} s: "
            f"give more than 0 and at most {MAX_DURATION_TEXT}"
        )
    return float(window_s)


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
    crontime.parse(cron)
    check_window(window_s)
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


def schedule(row: CronTemplate, zone: tzinfo | None = None) -> crontime.Schedule:
    """The template's schedule, its row checked again as it is read (it may have been
    written by an older gridshift, or by hand): one SpecError if it cannot be used."""
    sched = crontime.parse(row.cron, zone)
    check_window(row.window_s)
    if row.created_at is None:
        raise SpecError("its creation time is missing")
    if not isinstance(row.spec, dict) or not isinstance(row.spec.get("workdir"), str):
        raise SpecError("its stored job is malformed (no working directory)")
    if not isinstance(row.env, dict):
        raise SpecError("its stored environment is malformed")
    _build(row, row.created_at, check_workdir=False)
    return sched


def _build(row: CronTemplate, when: datetime, check_workdir: bool = True):
    """The job of the occurrence at ``when``; the stored fields are untrusted (one
    SpecError for anything wrong with them)."""
    raw = dict(row.spec)
    try:
        spec = build_spec(
            raw, now=when, cwd=raw["workdir"], base_env=row.env, check_workdir=check_workdir
        )
        if raw.get("deadline") or raw.get("within") or spec.after:
            raise SpecError("its stored job has a deadline or dependencies")
        return spec.model_copy(update={"deadline": when + timedelta(seconds=row.window_s)})
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        raise SpecError(f"its stored job is malformed: {exc}") from None


def next_fire(row: CronTemplate, now: datetime, zone: tzinfo | None = None) -> datetime | None:
    """The template's next occurrence after ``now`` (and after its last one); None for
    one that is disabled."""
    try:
        return schedule(row, zone).next_after(max(row.last_fire or row.created_at, now))
    except (SpecError, OverflowError, ValueError):
        return None


@dataclass(frozen=True)
class Due:
    """What a pass does with a template: move its cursor to ``cursor`` (the latest
    occurrence up to now), queue ``chosen`` (or nothing), and skip ``skipped`` others
    (``skipped_more``: at least that many)."""

    cursor: datetime
    chosen: datetime | None
    skipped: int
    skipped_more: bool
    first: datetime


def due(row: CronTemplate, now: datetime, zone: tzinfo | None = None) -> Due | None:
    """The template's occurrences since its cursor, up to ``now``, by the rule above;
    None when none is due. Bounded work whatever the time since the cursor."""
    sched = schedule(row, zone)
    since = row.last_fire or row.created_at
    latest = sched.latest_in(since, now)
    if latest is None:
        return None
    chosen = latest if latest + timedelta(seconds=row.window_s) > now else None
    counted = sched.count_in(since, now, MAX_COUNTED)
    skipped = counted - (chosen is not None)
    return Due(latest, chosen, skipped, counted >= MAX_COUNTED, sched.next_after(since))


def materialise(db, now: datetime, largest_node_gpus: int, zone: tzinfo | None = None) -> list[int]:
    """Queue the due occurrence of every template. Returns the new job ids. A template's
    fault disables or pauses that template only; a store error ends the pass as before."""
    zone = zone or crontime.local_zone()
    with db.read() as session:
        rows = active(session)
    queued = []
    for row in rows:
        try:
            todo = due(row, now, zone)
        except SpecError as exc:
            _set_fault(db, row, f"{DISABLED}{exc}")
            continue
        except (OverflowError, ValueError) as exc:  # times near year 9999 (a row made by hand)
            _set_fault(db, row, f"{DISABLED}its times are out of range ({exc})")
            continue
        if row.fault is not None and row.fault.startswith(DISABLED):
            _set_fault(db, row, None)  # its row was mended
        if todo is None:
            continue
        if todo.skipped:
            log.warning(
                "cron template %s: skipped %s%d occurrence(s) from %s, missed while no daemon "
                "ran (only the latest whose window is open is queued)",
                row.id,
                "at least " if todo.skipped_more else "",
                todo.skipped,
                _iso(todo.first),
            )
        job_id = _queue(db, row, todo, largest_node_gpus)
        if job_id is not None:
            queued.append(job_id)
            log.info("cron template %s: queued job %s (occurrence %s)", row.id, job_id,
                     _iso(todo.chosen))  # fmt: skip
    return queued


def _queue(db, row: CronTemplate, todo: Due, largest_node_gpus: int) -> int | None:
    """Move the cursor and queue the chosen occurrence, in one transaction; an occurrence
    that cannot become a job pauses the template (its reason stored, logged once)."""
    from orchestrator.queue.store import insert_jobs

    fault = None
    with db.write() as session:
        fresh = session.get(CronTemplate, row.id)
        if fresh is None or fresh.removed_at is not None or fresh.last_fire != row.last_fire:
            return None  # removed, or another pass moved it
        fresh.last_fire = todo.cursor
        session.add(fresh)
        if todo.chosen is None:
            return None
        when = todo.chosen
        try:
            spec = _build(fresh, when)
            if (why := too_wide(spec.gpus_min, largest_node_gpus)) is not None:
                raise SpecError(why)
        except SpecError as exc:
            fault = f"{PAUSED}{exc}"
        if fault is not None:
            if fault != fresh.fault:
                log.error("cron template %s %s (occurrence %s skipped)", row.id, fault,
                          _iso(when))  # fmt: skip
            fresh.fault = fault
            return None
        if fresh.fault is not None:
            log.info("cron template %s resumed (was %s)", row.id, fresh.fault)
            fresh.fault = None
        user = User(name=fresh.user, uid=fresh.uid)
        (job,) = insert_jobs(session, [spec], user=user, now=when, cron_id=fresh.id)
        return job.id


def _set_fault(db, row: CronTemplate, fault: str | None) -> None:
    """Store why the template is disabled (None: it is not), and log it, once."""
    if row.fault == fault:
        return
    with db.write() as session:
        fresh = session.get(CronTemplate, row.id)
        if fresh is None or fresh.fault == fault:
            return
        fresh.fault = fault
        session.add(fresh)
    if fault is None:
        log.info("cron template %s can be read again; enabled", row.id)
    else:
        log.error("cron template %s %s", row.id, fault)


def _iso(when: datetime | None) -> str:
    return when.isoformat(timespec="seconds") if when is not None else "-"
