"""The carbon-aware parts of the daemon's pass: suspend jobs whose planned piece ended,
the deadline guard, and the plan notes that tell people why a job waits.

Suspending (``daemon.suspend``):
- ``signal`` (default): SIGTERM; the job checkpoints and exits 0, and is requeued with
  its progress (its remaining run time is planned again). A job that exits non-zero on
  SIGTERM failed; one still running ``cancel_grace_s`` later is killed and failed.
- ``stop``: SIGSTOP; it keeps its GPUs (and their memory) and is resumed with SIGCONT
  when its next piece is due.

The deadline guard: when the job at the head of the queue cannot start and must start
within a slot to meet its deadline, jobs that may be suspended and have at least
``GUARD_SLACK_SLOTS`` slots of slack are checkpointed (SIGTERM, in either mode: a stopped
job would keep its GPUs), the fewest GPUs' worth that make room for it
(``ClusterAllocator.make_room``, as in the simulator); it starts on the next pass.
"""

from __future__ import annotations

import logging
import signal
from datetime import UTC, datetime, timedelta

from sqlmodel import col, select

from executors.base import Handle
from orchestrator.errors import translate
from orchestrator.models import Attempt, Job
from orchestrator.pieces import remaining_run_s, width_of
from orchestrator.states import JobState, transition

log = logging.getLogger("gridshift.daemon")
ACTOR = "daemon"
GUARD_SLACK_SLOTS = 4  # a suspended job keeps at least this many slots of slack


def suspend_due(d, now: datetime) -> int:
    """Suspend running jobs whose planned piece has ended; SIGKILL those that ignored the
    SIGTERM for the grace period. Returns how many were signalled."""
    grace = timedelta(seconds=d.settings.cancel_grace_s)
    with d.db.read() as session:
        rows = session.exec(
            select(Attempt)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(Attempt.state == "running")
            .where(col(Job.cancel_requested_at).is_(None))
            .where(
                col(Attempt.planned_until).is_not(None) | col(Attempt.suspend_sent_at).is_not(None)
            )
        ).all()
    count = 0
    for att in rows:
        if att.suspend_sent_at is not None:
            if att.kill_sent_at is None and now - att.suspend_sent_at >= grace:
                _send(d, att, signal.SIGKILL, "kill_sent_at", now)
            continue
        if att.planned_until > now:
            continue
        if d.suspend_mode == "stop":
            count += _stop(d, att, now)
        else:
            count += _send(d, att, signal.SIGTERM, "suspend_sent_at", now)
            log.info("job %s: its planned piece ended; SIGTERM to checkpoint", att.job_id)
    return count


def _send(d, att: Attempt, sig: int, stamp: str, now: datetime) -> int:
    try:
        d.executor.signal(Handle.from_dict(att.handle), sig)
    except Exception as exc:  # logged; retried next pass
        log.warning("job %s: cannot signal: %s", att.job_id, translate(exc) or exc)
        return 0
    with d.db.write() as session:
        row = session.get(Attempt, att.id)
        setattr(row, stamp, now)
        session.add(row)
    return 1


def _stop(d, att: Attempt, now: datetime) -> int:
    try:
        sent = d.executor.signal(Handle.from_dict(att.handle), signal.SIGSTOP)
    except Exception as exc:
        log.warning("job %s: cannot stop: %s", att.job_id, translate(exc) or exc)
        return 0
    if not sent:
        return 0  # it ended meanwhile; the next reap records it
    with d.db.write() as session:
        row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
        row.state, row.stopped_at, row.planned_until = "stopped", now, None
        session.add(row)
        transition(
            session,
            job,
            JobState.SUSPENDED,
            at=now,
            actor=ACTOR,
            reason="stopped (SIGSTOP) until its next planned piece; it keeps its GPUs",
        )
    log.info("job %s: stopped until its next planned piece", att.job_id)
    return 1


def guard_deadlines(d, scheduler, alloc, now: datetime) -> list[int]:
    """Checkpoint the fewest movable jobs that make room for an urgent blocked head.
    Returns the ids of the jobs signalled."""
    latest = scheduler.blocked_latest_start_s()
    slot = d.planner.slot_s
    if latest is None or now.timestamp() < latest - slot:
        return []
    with d.db.read() as session:
        rows = session.exec(
            select(Attempt, Job)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(Attempt.state == "running")
        ).all()
    if any(att.suspend_sent_at is not None for att, _ in rows):
        return []  # room is being made already
    head = scheduler.blocked()
    width = width_of(head, scheduler.decision_of(head.id), now.timestamp())
    movable = {
        ("attempt", att.id): att
        for att, job in rows
        if job.interruptible and _slack_s(d, job, now) >= GUARD_SLACK_SLOTS * slot
    }
    victims = alloc.make_room(width, movable) or []
    signalled = []
    for key in victims:
        att = movable[key]
        if _send(d, att, signal.SIGTERM, "suspend_sent_at", now):
            signalled.append(att.job_id)
            log.info(
                "job %s: checkpointed (SIGTERM) to make room for job %s, due by its deadline",
                att.job_id,
                head.id,
            )
    return signalled


def _slack_s(d, job: Job, now: datetime) -> float:
    """How long the job could still wait and finish by its deadline at full speed."""
    if job.deadline is None or job.duration_s is None:
        return float("inf") if job.deadline is None else 0.0
    with d.db.read() as session:
        left = remaining_run_s(session, job, now)
    return (job.deadline - now).total_seconds() - left


def note_plans(d, scheduler, eligible: dict[int, Job], now: datetime) -> None:
    """Write each waiting job's planned start and, in words, why it waits (only what
    changed)."""
    planner = d.planner
    blocked = scheduler.blocked()
    feed = planner.feed
    changes = {}
    for view, decision in scheduler.planned():
        job = eligible.get(view.id)
        if job is None:
            continue
        start = datetime.fromtimestamp(decision.start_s, UTC)
        note = _why(planner, feed, view, decision, now, blocked)
        old = job.planned_start
        moved = old is None or abs((old - start).total_seconds()) >= 1.0
        if moved or job.plan_note != note:
            changes[view.id] = (start, note)
    if not changes:
        return
    with d.db.write() as session:
        for job_id, (start, note) in changes.items():
            job = session.get(Job, job_id)
            if job.state in (JobState.QUEUED.value, JobState.SUSPENDED.value):
                job.planned_start, job.plan_note = start, note
                session.add(job)


def _why(planner, feed, view, decision, now: datetime, blocked) -> str:
    if blocked is not None and blocked.id == view.id:
        return "due; waiting for GPUs"
    if planner.mode != "plan":
        return f"{planner.mode} fallback: {planner.mode_reason}"
    wait_s = decision.start_s - now.timestamp()
    if decision.forced:
        return "starts now: its deadline allows no later start"
    if wait_s <= 1.0:
        return "due now"
    at = datetime.fromtimestamp(decision.start_s, UTC).strftime("%H:%M:%S UTC")
    if feed is None or feed.series() is None:
        return f"planned for {at} by {planner.policy.name}"
    series = feed.series()
    later = float(series.value_at(decision.start_s))
    current = float(series.value_at(now.timestamp()))
    cap = f" at a {100 * decision.cap:.0f}% power cap" if decision.cap < 1 - 1e-9 else ""
    return f"waiting for lower carbon: starts {at}{cap} at {later:.0f} g/kWh (now {current:.0f})"
