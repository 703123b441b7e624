"""The carbon-aware parts of the daemon's pass: suspend jobs whose planned piece ended,
checkpoint those the deadline guard moves, and the plan notes that tell people why a job
waits.

Suspending (``daemon.suspend``):
- ``signal`` (default): SIGTERM; the job checkpoints and exits 0, and is requeued with
  its progress (its remaining run time is planned again). A job that exits non-zero on
  SIGTERM failed; one still running ``cancel_grace_s`` later is killed and failed.
- ``stop``: SIGSTOP; it keeps its GPUs (and their memory) and is resumed with SIGCONT
  when its next piece is due.

The deadline guard itself is the pass's (``orchestrator.planning.onepass``); it checkpoints
the jobs it moves here (SIGTERM, in either mode: a stopped job would keep its GPUs), and
the urgent job starts once they have left their GPUs.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlmodel import col, select

from executors.base import Executor, Handle
from orchestrator.planning.scheduler import Scheduler
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job
from orchestrator.queue.states import JobState, transition

if TYPE_CHECKING:
    from orchestrator.daemon.planner import LivePlanner

log = logging.getLogger(__name__)
ACTOR = "daemon"
MOVE_GRACE_CAP_S = 1800.0  # a moved job's grace to checkpoint: its cost, at most this
MOVED = "moved to share GPU"  # how a co-location move's reason starts (the daemon writes it)
SPLIT = "split from its GPU partner"  # how a pair split's reason starts (the daemon's)


@dataclass
class Suspender:
    """Signals running jobs to leave their GPUs: at the end of a planned piece, and for
    the deadline guard. A job a co-location move (or a pair's split) told to checkpoint, by
    a daemon before this one started (a restart: the longer graces were in its memory; its
    reason, which only the daemon writes, says it moved or was split from its partner),
    gets its checkpoint's cost plus ``grace_s``, at most ``MOVE_GRACE_CAP_S``, before
    SIGKILL; any other, ``grace_s`` as before."""

    db: Database
    executor: Executor
    grace_s: float  # SIGKILL a job that ignored its SIGTERM this long
    mode: str = "signal"  # signal (SIGTERM, requeue) | stop (SIGSTOP/SIGCONT)
    # longer graces, by attempt (a co-location move's: its checkpoint's cost; in memory)
    graces: dict[int, float] = field(default_factory=dict)
    checkpoint_s: float = 0.0  # the lab's checkpoint cost, for a job without its own
    _sent: set[int] = field(default_factory=set)  # attempts this daemon told to checkpoint

    def grant(self, attempt_id: int, seconds: float) -> None:
        """The attempt's next SIGTERM to checkpoint is killed only ``seconds`` after it
        (never less than ``grace_s``)."""
        self.graces[attempt_id] = seconds

    def kill_after_s(
        self, attempt_id: int, checkpoint_s: float | None, reason: str | None
    ) -> float:
        """How long after its SIGTERM to checkpoint the attempt is killed: ``grace_s``, or
        the longer grace granted to a move; a move told by a daemon before a restart (its
        grace was in that one's memory; its reason says it moved, or was split from its
        partner) gets its checkpoint's cost plus ``grace_s``, at most ``MOVE_GRACE_CAP_S``."""
        mine = max(self.grace_s, self.graces.get(attempt_id, 0.0))
        if (reason or "").startswith((MOVED, SPLIT)) and attempt_id not in self._sent:
            own = self.checkpoint_s if checkpoint_s is None else checkpoint_s
            mine = max(mine, min(own + self.grace_s, MOVE_GRACE_CAP_S))
        return mine

    def suspend_due(self, now: datetime) -> int:
        """Suspend running jobs whose planned piece has ended; SIGKILL those that ignored
        the SIGTERM for the grace period. Returns how many were signalled."""
        with self.db.read() as session:
            found = session.exec(
                select(Attempt, Job.checkpoint_s, Job.reason)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(Attempt.state == AttemptState.RUNNING)
                .where(col(Job.cancel_requested_at).is_(None))
                .where(
                    col(Attempt.planned_until).is_not(None)
                    | col(Attempt.suspend_sent_at).is_not(None)
                )
            ).all()
        ids = {att.id for att, _, _ in found}
        self.graces = {i: s for i, s in self.graces.items() if i in ids}
        self._sent &= ids
        count = 0
        for att, ckpt, reason in found:
            if att.suspend_sent_at is not None:
                mine = timedelta(seconds=self.kill_after_s(att.id, ckpt, reason))
                if att.kill_sent_at is None and now - att.suspend_sent_at >= mine:
                    self._send(att, signal.SIGKILL, "kill_sent_at", now)
                continue
            if att.planned_until > now:
                continue
            if self.mode == "stop":
                count += self._stop(att, now)
            else:
                if sent := self._send(att, signal.SIGTERM, "suspend_sent_at", now):
                    log.info("job %s: its planned piece ended; SIGTERM to checkpoint", att.job_id)
                count += sent
        return count

    def checkpoint(self, att: Attempt, now: datetime) -> bool:
        """SIGTERM for the deadline guard: the job checkpoints and is requeued."""
        return bool(self._send(att, signal.SIGTERM, "suspend_sent_at", now))

    def promised(self, job_id: int, until: datetime) -> None:
        """The job's attempt just started by backfill, on its promise to give its GPUs
        back by ``until`` (``backfill.promise_s``): recorded, shown, enforced."""
        with self.db.write() as session:
            att = session.exec(
                select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number).desc())
            ).first()
            if att is not None:
                att.backfilled_until = until
                session.add(att)

    def overran(self, now: datetime, passed_since: datetime) -> int:
        """Running jobs started by backfill after ``passed_since`` (when the blocked head of
        the queue was submitted: they passed it) and past their promise: one that may be
        suspended (signal mode) checkpoints and is requeued; any other gets SIGTERM, and
        SIGKILL ``grace_s`` later, and fails (the reaper names why). Returns how many were
        signalled."""
        grace = timedelta(seconds=self.grace_s)
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(Attempt.state == AttemptState.RUNNING)
                .where(col(Job.cancel_requested_at).is_(None))
                .where(col(Attempt.suspend_sent_at).is_(None))
                .where(col(Attempt.kill_sent_at).is_(None))
                .where(col(Attempt.backfilled_until) < now)
                .where(col(Attempt.started_at) >= passed_since)
            ).all()
        count = 0
        for att, job in rows:
            if att.term_sent_at is not None:
                if now - att.term_sent_at >= grace:
                    count += self._send(att, signal.SIGKILL, "kill_sent_at", now)
                continue
            checkpoints = job.interruptible and self.mode == "signal"
            stamp = "suspend_sent_at" if checkpoints else "term_sent_at"
            if sent := self._send(att, signal.SIGTERM, stamp, now):
                log.info("job %s: past the run time it was backfilled on; SIGTERM", att.job_id)
            count += sent
        return count

    def _send(self, att: Attempt, sig: int, stamp: str, now: datetime) -> int:
        """Signal the job and stamp when, only if it was delivered: a job whose process
        is not there yet (its monitor still starting it, seconds on a loaded machine)
        gets its SIGTERM on a later pass, and its grace counts from then (stamped on a
        signal that reached nothing, the SIGKILL came first and failed the job)."""
        try:
            sent = self.executor.signal(Handle.from_dict(att.handle), sig)
        except Exception as exc:  # logged; retried next pass
            log.warning("job %s: cannot signal: %s", att.job_id, exc)
            return 0
        if not sent:
            return 0  # not started yet, or ended meanwhile (the next reap records it)
        if stamp == "suspend_sent_at":
            self._sent.add(att.id)
        with self.db.write() as session:
            row = session.get(Attempt, att.id)
            setattr(row, stamp, now)
            session.add(row)
        return 1

    def _stop(self, att: Attempt, now: datetime) -> int:
        try:
            sent = self.executor.signal(Handle.from_dict(att.handle), signal.SIGSTOP)
        except Exception as exc:
            log.warning("job %s: cannot stop: %s", att.job_id, exc)
            return 0
        if not sent:
            return 0  # it ended meanwhile; the next reap records it
        with self.db.write() as session:
            row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
            attempts.move(
                session, row, AttemptState.STOPPED, at=now, reason="SIGSTOP", stopped_at=now,
                planned_until=None,
            )  # fmt: skip
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


def note_plans(
    db: Database, planner: LivePlanner, scheduler: Scheduler, eligible: dict[int, Job],
    now: datetime, waiting: dict[int, Job] | None = None, power: dict[int, str] | None = None,
    wakes: dict[int, str] | None = None,
) -> None:  # fmt: skip
    """Write each waiting job's planned start and, in words, why it waits (only what
    changed); a job waiting for a dependency (``waiting``) is planned ahead from its
    dependencies' expected ends (``planner.ahead``); ``power``: jobs the site power limit
    kept waiting, and why (``SiteLimit.refused``); ``wakes``: jobs waiting for a server to
    wake, their notes (``Levers.wake_notes``)."""
    blocked = scheduler.blocked()
    feed = planner.feed
    changes = {}
    jobs = {**eligible, **(waiting or {})}
    for view, decision in [*scheduler.planned(), *planner.ahead]:
        job = jobs.get(view.id)
        if job is None:
            continue
        start = datetime.fromtimestamp(decision.start_s, UTC)
        if view.id in (waiting or {}):
            at = start.strftime("%H:%M:%S UTC")
            waits = _ids(planner.after.get(view.id))
            note = f"after job {waits}: planned for {at}, once it has ended"
        elif wakes and view.id in wakes:
            note = wakes[view.id]
        else:
            note = _why(planner, feed, view, decision, now, blocked, power)
        old = job.planned_start
        moved = old is None or abs((old - start).total_seconds()) >= 1.0
        if moved or job.plan_note != note:
            changes[view.id] = (start, note)
    if not changes:
        return
    with db.write() as session:
        for job_id, (start, note) in changes.items():
            job = session.get(Job, job_id)
            if job.state in (JobState.QUEUED.value, JobState.SUSPENDED.value):
                job.planned_start, job.plan_note = start, note
                session.add(job)


def _ids(ids) -> str:
    return ", ".join(str(i) for i in sorted(ids or ())) or "?"


def _why(planner, feed, view, decision, now: datetime, blocked, power=None) -> str:
    if blocked is not None and blocked.id == view.id:
        if power and view.id in power:
            return f"due; waiting for power: {power[view.id]}"
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
    cap = f" at a {100 * decision.cap:.0f}% power cap" if decision.cap < 1 - 1e-9 else ""
    later, current = window_means(series, decision, now.timestamp())
    if later < current - 0.5:
        return (
            f"waiting for lower carbon: starts {at}{cap}; {later:.0f} g/kWh over its run "
            f"(now: {current:.0f})"
        )
    return f"planned for {at}{cap} by {planner.policy.name} ({later:.0f} g/kWh over its run)"


def window_means(series, decision, now_s: float) -> tuple[float, float]:
    """Mean intensity over the planned run (its pieces, or start to its expected end)
    and over a run of the same length starting now. A job with no expected end is
    judged by the hour after its start."""
    pieces = decision.intervals or ((decision.start_s, decision.end_s or decision.start_s),)
    if all(b <= a for a, b in pieces):
        pieces = ((decision.start_s, decision.start_s + 3600.0),)
    length_s = sum(max(0.0, b - a) for a, b in pieces)
    later = sum(float(series.integral(a, b)) for a, b in pieces if b > a) / length_s
    current = float(series.integral(now_s, now_s + length_s)) / length_s
    return later, current


def note_reason(db, job_id: int, reason: str | None, unless: str | None = None) -> str | None:
    """Set the job's reason (only if it is still ``unless``, when given); the one before.
    A move's or a split's is written before its SIGTERM: a daemon that dies right after
    the signal leaves the reason ``Suspender.kill_after_s`` reads after a restart."""
    with db.write() as session:
        row = session.get(Job, job_id)
        if row is None:
            return None
        was = row.reason
        if unless is None or was == unless:
            row.reason = reason
            session.add(row)
        return was
