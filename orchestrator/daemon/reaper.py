"""The daemon's bookkeeping of attempts, a collaborator of the pass: recover them after a
crash, reap those that ended (a job that checkpointed on the planner's SIGTERM is
requeued), account those still running, stop cancelled ones, and keep the GPUs' power
limits in step with them."""

from __future__ import annotations

import contextlib
import logging
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import Session, col, func, select

from executors import runfiles
from executors.base import Executor, Handle, PollResult, RunStatus
from executors.errors import HostUnreachable
from executors.gang import bare_handle
from orchestrator.accounting.calibration import learn
from orchestrator.accounting.meter import Accountant
from orchestrator.daemon.contain import Faults
from orchestrator.daemon.energy.sharedcaps import held_caps, settle
from orchestrator.nodes.inventory import ResolvedNode
from orchestrator.nodes.powercaps import PowerCaps
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job
from orchestrator.queue.states import JobState, transition
from orchestrator.settings import Settings

log = logging.getLogger(__name__)
ACTOR = "daemon"
LOST_RETRIES = 3  # a lost job is requeued this many times at most
MAX_RUN = timedelta(days=366)  # a start a run's own files give is believed this far back


@dataclass
class Reaper:
    """Recovers, reaps, accounts and cancels attempts; keeps GPU power limits in step."""

    db: Database
    executor: Executor
    settings: Settings
    nodes: list[ResolvedNode]
    accountant: Accountant
    caps: PowerCaps | None = None
    power_sample_s: float | None = None
    faults: Faults = field(default_factory=Faults)
    moved: dict[int, str] = field(default_factory=dict)  # job -> why it moves (Sharing.notes)
    _last_written: dict[int, float] = field(default_factory=dict)

    # -- recovery -----------------------------------------------------------------------
    def recover(self, now: datetime) -> None:
        """Settle attempts whose launch did not finish, before anything new starts: those
        a crash left behind (at start) and those whose server went away mid-launch (each
        pass, once it answers again, or given up after the node's ``lost_after``)."""
        with self.db.read() as session:
            launching = session.exec(
                select(Attempt).where(Attempt.state == AttemptState.LAUNCHING)
            ).all()
        down = self.executor.unreachable_nodes() if launching else {}
        for attempt in launching:
            with self.faults.contained(
                f"attempt {attempt.id}", f"job {attempt.job_id}: recovering attempt "
                f"{attempt.id}", lambda why, a=attempt: self._note_fault(a, why),
            ):  # fmt: skip
                self._recover_one(attempt, down, now)

    def _recover_one(self, attempt: Attempt, down: dict[str, float], now: datetime) -> None:
        if attempts.down_since(attempt, down) is not None:  # not asked: it would wait on it
            self._unreachable(attempt, "unreachable", now)
            return
        with self.db.read() as session:
            wait = session.get(Job, attempt.job_id).interruptible
        try:  # a job across servers: every part found started, or every part fenced
            nodes = attempts.nodes_of(attempt)
            handle = self.executor.recover_parts(attempt.id, attempt.run_dir, nodes, wait)
        except HostUnreachable as exc:
            self._unreachable(attempt, str(exc), now)
            return
        with self.db.write() as session:
            att = session.get(Attempt, attempt.id)
            job = session.get(Job, att.job_id)
            if handle is None:
                attempts.move(
                    session, att, AttemptState.ABANDONED, at=now, finished_at=now,
                    detail="the daemon stopped before the job started",
                )  # fmt: skip
                transition(session, job, JobState.QUEUED, at=now, actor=ACTOR,
                           reason="launch interrupted; requeued")  # fmt: skip
                log.info("job %s: launch was interrupted; requeued", job.id)
            else:
                mark_running(session, att, job, handle, now,
                             reason="found started after an interrupted launch")  # fmt: skip
                log.info("job %s: reattached after an interrupted launch", job.id)
            session.add(att)
        if handle is not None:  # recorded: a batch job submitted held may start now
            self.executor.release(handle)

    # -- unreachable servers --------------------------------------------------------------
    def _unreachable(self, att: Attempt, why: str, now: datetime) -> None:
        """An attempt whose server cannot be asked: nothing happens until the server has
        been down for its node's ``lost_after``; then the attempt is given up (it may
        still run there: it is fenced when the server is back) and its job is lost and
        requeued, to resume from its checkpoint where it made one."""
        down = self.executor.unreachable_nodes()
        gone = [n for n in attempts.nodes_of(att) if n in down]  # a job across servers: any
        node = min(gone, key=down.__getitem__) if gone else att.node  # part's, first down
        since = down.get(node)
        if since is None or now.timestamp() - since < self._lost_after_s(node):
            return
        with self.db.write() as session:
            row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
            if row.state not in (AttemptState.LAUNCHING, *attempts.ON_GPU):
                return
            detail = f"node {node} unreachable for {now.timestamp() - since:.0f}s: {why}"
            attempts.move(
                session, row, AttemptState.ORPHANED, at=now, finished_at=now, detail=detail
            )
            reason = f"node {node} unreachable since {_hms(since)}"
            if job.cancel_requested_at is not None:
                transition(session, job, JobState.CANCELLED, at=now, actor=ACTOR, reason=reason)
            elif job.state == JobState.PLANNED.value:
                transition(session, job, JobState.QUEUED, at=now, actor=ACTOR,
                           reason=f"{reason}; requeued")  # fmt: skip
            else:
                transition(session, job, JobState.LOST, at=now, actor=ACTOR, reason=reason)
                transition(session, job, JobState.QUEUED, at=now, actor=ACTOR,
                           reason="requeued after its node was lost")  # fmt: skip
                job.finished_at = None
                session.add(job)
        self.accountant.forget(att.id)
        log.warning("job %s: node %s lost; attempt %s given up, job requeued",
                    att.job_id, node, att.id)  # fmt: skip

    def fence_orphans(self, now: datetime | None = None) -> None:
        """Attempts given up while their server was away: once it answers, make sure they
        do not run (never started, or killed), then they are plainly lost. A job across
        servers whose launch a server's going away interrupted is requeued then."""
        now = now or _now()
        with self.db.read() as session:
            orphans = session.exec(select(Attempt).where(Attempt.state == "orphaned")).all()
        down = self.executor.unreachable_nodes()
        for att in orphans:  # a job across servers: its reachable parts fenced at once
            if all(n in down for n in attempts.nodes_of(att)):
                self._requeue_interrupted(att, False, down, now)
                continue
            bare = bare_handle(att.id, att.run_dir, attempts.nodes_of(att))
            try:
                settled = self.executor.fence(Handle.from_dict(att.handle) if att.handle else bare)
            except Exception as exc:  # logged; the next pass tries again
                log.warning("attempt %s: cannot fence: %s", att.id, exc)
                continue
            if settled:
                with self.db.write() as session:
                    row = session.get(Attempt, att.id)
                    attempts.move(session, row, AttemptState.LOST, at=_now(), reason="fenced")
                log.info("attempt %s on %s: fenced", att.id, att.node)
            self._requeue_interrupted(att, settled, down, now)

    def _requeue_interrupted(self, att: Attempt, fenced: bool, down: dict, now: datetime) -> None:
        """A job still planned on this orphaned attempt (a launch across servers that a
        server's going away interrupted): requeued (or cancelled, if asked) once every
        part is fenced, or a part's server has been away for its ``lost_after``."""
        node = min((n for n in attempts.nodes_of(att) if n in down), key=down.get, default=None)
        if not fenced and (node is None or now.timestamp() - down[node] < self._lost_after_s(node)):
            return
        with self.db.write() as session:
            job = session.get(Job, att.job_id)
            if job.state == JobState.PLANNED.value and job.attempts == att.number:
                why = "every part fenced" if fenced else f"node {node} lost"
                to = JobState.QUEUED if job.cancel_requested_at is None else JobState.CANCELLED
                transition(session, job, to, at=now, actor=ACTOR,
                           reason=f"launch interrupted; {why}; {to.value}")  # fmt: skip

    def _lost_after_s(self, node: str) -> float:
        cfg = next((n.config for n in self.nodes if n.name == node), None)
        return cfg.seconds("lost_after") if cfg is not None else 300.0

    # -- power caps -----------------------------------------------------------------------
    def reconcile_caps(self) -> None:
        """At start: GPUs of running jobs to their caps, every other GPU to its default
        (a daemon killed mid-run could not restore them)."""
        if self.caps is None or not self.caps.enabled:
            return
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt).where(col(Attempt.state).in_(attempts.values(attempts.ON_GPU)))
            ).all()
        held = held_caps(list(rows))  # a shared GPU: the lowest of its attempts' caps
        self.caps.reconcile(held, skip=self.executor.unreachable_nodes())

    def restore_caps(self) -> None:
        """At stop: every GPU back to its default limit (running jobs run on uncapped
        until a daemon starts again)."""
        if self.caps is not None and self.caps.enabled:
            self.caps.reconcile({}, skip=self.executor.unreachable_nodes())

    # -- reap ---------------------------------------------------------------------------
    def reap(self, now: datetime, only: list[int] | None = None) -> int:
        """Record attempts that ended, and account those still running (``only``: these
        attempts alone). Returns how many ended."""
        query = select(Attempt).where(col(Attempt.state).in_(attempts.values(attempts.LIVE)))
        if only is not None:
            query = query.where(col(Attempt.id).in_(only))
        with self.db.read() as session:
            live = session.exec(query).all()
        ended = 0
        with self.faults.contained("refresh", "asking the nodes about their attempts"):
            self.executor.refresh([Handle.from_dict(a.handle) for a in live])
        for attempt in live:
            with self.faults.contained(
                f"attempt {attempt.id}", f"job {attempt.job_id}: reaping attempt {attempt.id}",
                lambda why, a=attempt: self._note_fault(a, why),
            ):  # fmt: skip
                ended += self._reap_one(attempt, now)
        return ended

    def _reap_one(self, attempt: Attempt, now: datetime) -> int:
        handle = Handle.from_dict(attempt.handle)
        result = self.executor.poll(handle)
        if result.status is RunStatus.UNREACHABLE:
            self._unreachable(attempt, result.detail or "unreachable", now)
            return 0
        if result.status is RunStatus.PENDING:  # a batch scheduler still holds it
            return 0
        if attempt.state == AttemptState.SUBMITTED and result.started_at is not None:
            self._started(attempt, handle, result.started_at)
        self._record_progress(attempt, self.executor.progress(handle), now)
        if result.status is RunStatus.RUNNING:
            self._account_running(attempt, now)
            return 0
        self._record_end(attempt.id, result, now)
        return 1

    def _note_fault(self, attempt: Attempt, why: str) -> None:
        """An attempt whose bookkeeping failed: skipped (it keeps its GPUs), and why is
        its job's reason, which ``show`` prints, until its bookkeeping works again."""
        with self.db.write() as session:
            row, job = session.get(Attempt, attempt.id), session.get(Job, attempt.job_id)
            row.detail, job.reason = why, f"daemon error, retried each pass: {why}"
            session.add(row)
            session.add(job)

    def _started(self, attempt: Attempt, handle: Handle, started_at: datetime) -> None:
        """A submitted attempt the batch scheduler started: running since its real start."""
        with self.db.write() as session:
            att, job = session.get(Attempt, attempt.id), session.get(Job, attempt.job_id)
            if att.state == AttemptState.SUBMITTED:
                mark_running(session, att, job, handle, started_at, reason="started by Slurm")
        attempt.state = AttemptState.RUNNING.value  # this pass's copy
        log.info("job %s: started by Slurm at %s", attempt.job_id, started_at.isoformat())

    def _account_running(self, att: Attempt, now: datetime) -> None:
        totals = self.accountant.measure(att, now.timestamp())
        every = self.power_sample_s or 5.0
        if totals is None or now.timestamp() - self._last_written.get(att.id, 0.0) < every:
            return
        self._last_written[att.id] = now.timestamp()
        with self.db.write() as session:
            row = session.get(Attempt, att.id)
            if row.state in attempts.ON_GPU:
                self.accountant.write(session, row, totals, now)

    def _record_progress(self, attempt: Attempt, progress, now: datetime) -> None:
        if progress is None or progress == (attempt.progress_done, attempt.progress_total):
            return
        with self.db.write() as session:
            row = session.get(Attempt, attempt.id)
            row.progress_done, row.progress_total = progress
            row.progress_at = now
            session.add(row)

    def _record_end(self, attempt_id: int, result: PollResult, now: datetime) -> None:
        with self.db.write() as session:
            att = session.get(Attempt, attempt_id)
            if att.state not in attempts.LIVE:  # recorded meanwhile (``cancel`` with no daemon)
                return
            job = session.get(Job, att.job_id)
            started = result.started_at or _run_started_at(att)
            if started is not None:  # the monitor's (or Slurm's) clock: the real start
                # (the run's own files say so: believed within a year before now)
                att.started_at = min(max(started, now - MAX_RUN), now)
            # an end the run's files put in the future, or before its start, is not believed
            ended_at = min(result.ended_at or now, now)
            if att.started_at is not None:
                ended_at = max(ended_at, att.started_at)
            att.finished_at, att.exit_code, att.signal = ended_at, result.exit_code, result.signal
            end_state = (
                AttemptState.EXITED if result.status is RunStatus.EXITED else AttemptState.LOST
            )
            attempts.move(session, att, end_state, at=ended_at, detail=result.detail)
            totals = self.accountant.measure(att, now.timestamp(), ended_at.timestamp())
            if totals is not None:
                self.accountant.write(session, att, totals, now)
            self.accountant.forget(att.id)
            self._last_written.pop(att.id, None)
            job.exit_code = result.exit_code
            job.finished_at = ended_at
            checkpointed = att.suspend_sent_at is not None
            if job.cancel_requested_at is not None:
                to, reason = JobState.CANCELLED, "cancelled by request"
            elif (
                result.status is RunStatus.LOST
                and job.state == JobState.PLANNED.value
                and not result.unknown_outcome
            ):
                to, reason = JobState.QUEUED, f"{result.detail or 'vanished'} before it started"
            elif result.status is RunStatus.LOST:
                to, reason = JobState.LOST, result.detail or "vanished"
                if result.unknown_outcome:
                    reason = f"ended with unknown outcome ({reason}); not rerun: it may have run"
            elif checkpointed and result.exit_code == 0:
                to, reason = JobState.QUEUED, _suspended_reason(att, self.moved.get(job.id))
                if job.state != JobState.SUSPENDED.value:
                    transition(session, job, JobState.SUSPENDED, at=ended_at, actor=ACTOR,
                               reason=reason)  # fmt: skip
                job.finished_at = None
            elif checkpointed:
                to = JobState.FAILED
                reason = (
                    f"{_exit_reason(result)} after SIGTERM to suspend it (a job that may be "
                    "suspended checkpoints and exits 0)"
                )
            elif result.exit_code == 0:
                to, reason = JobState.COMPLETED, None
            else:
                to, reason = JobState.FAILED, _exit_reason(result, att)
            transition(session, job, to, at=ended_at, actor=ACTOR, reason=reason)
            if to is JobState.LOST and not result.unknown_outcome:
                to, reason = self._retry_lost(session, job, now)
            if to is JobState.QUEUED:
                job.finished_at = None
                session.add(job)
            if to is JobState.COMPLETED:
                learn(session, job, att, now)
        settle(self.caps, self.db, att.node, att.gpu_ids, without=att.id)  # a partner's cap
        if att.run_dir:  # left where the monitor never read it: it holds the environment
            runfiles.remove(Path(att.run_dir) / runfiles.SPEC)
        log.info("job %s: %s%s", job.id, to, f" ({reason})" if reason else "")

    @staticmethod
    def _retry_lost(session: Session, job: Job, now: datetime) -> tuple[JobState, str]:
        """lost → queued, as the state machine says, while the job has been lost at most
        ``LOST_RETRIES`` times; after that it stays lost (a job that keeps vanishing, or
        keeps writing run files that cannot be believed, is not retried for ever)."""
        lost = session.exec(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.job_id == job.id)
            .where(Attempt.state == AttemptState.LOST)
        ).one()
        if lost > LOST_RETRIES:
            reason = f"{job.reason}; lost {lost} times, not requeued again"
            job.reason = reason
            session.add(job)
            return JobState.LOST, reason
        reason = f"requeued after it was lost ({lost} of {LOST_RETRIES + 1} tries)"
        transition(session, job, JobState.QUEUED, at=now, actor=ACTOR, reason=reason)
        return JobState.QUEUED, reason

    # -- cancel -------------------------------------------------------------------------
    def stop_cancelled(self, now: datetime, only: list[int] | None = None) -> None:
        """SIGTERM the process group of each running job whose cancel was requested;
        SIGKILL once the grace period has passed (``only``: these attempts' alone)."""
        grace = timedelta(seconds=self.settings.cancel_grace_s)
        query = (
            select(Attempt)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(col(Attempt.state).in_(attempts.values(attempts.LIVE)))
            .where(col(Job.cancel_requested_at).is_not(None))
        )
        if only is not None:
            query = query.where(col(Attempt.id).in_(only))
        with self.db.read() as session:
            rows = session.exec(query).all()
        down = self.executor.unreachable_nodes()
        for att in rows:  # a job across servers: its parts that can be reached hear it
            if att.kill_sent_at is not None or all(n in down for n in attempts.nodes_of(att)):
                continue
            if att.state == AttemptState.STOPPED:  # a stopped job must run to hear its SIGTERM
                with contextlib.suppress(Exception):
                    self.executor.signal(Handle.from_dict(att.handle), signal.SIGCONT)
            if att.term_sent_at is None:
                sig, field = signal.SIGTERM, "term_sent_at"
            elif now - att.term_sent_at >= grace:
                sig, field = signal.SIGKILL, "kill_sent_at"
            else:
                continue
            try:
                sent = self.executor.signal(Handle.from_dict(att.handle), sig)
            except Exception as exc:  # logged; retried next tick
                log.warning("job %s: cannot signal: %s", att.job_id, exc)
                continue
            if not sent:  # not started yet (or ended): its grace starts when it hears it
                continue
            with self.db.write() as session:
                row = session.get(Attempt, att.id)
                setattr(row, field, now)
                session.add(row)


def mark_running(session: Session, att: Attempt, job: Job, handle: Handle, now: datetime,
                 reason: str | None = None) -> None:  # fmt: skip
    attempts.move(
        session, att, AttemptState.RUNNING, at=now, reason=reason, handle=handle.to_dict(),
        started_at=now,
    )  # fmt: skip
    job.started_at = job.started_at or now
    transition(session, job, JobState.RUNNING, at=now, actor=ACTOR, reason=reason)


def _now() -> datetime:
    return datetime.now(UTC)


def _hms(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S UTC")


def _run_started_at(att: Attempt) -> datetime | None:
    """When the monitor started the job (its job.json), or None (none, or not a time)."""
    data = runfiles.read_json(Path(att.run_dir) / runfiles.JOB) if att.run_dir else None
    try:
        return runfiles.started_at(data) if data else None
    except runfiles.BadRunFile:
        return None


def _suspended_reason(att: Attempt, why: str | None = None) -> str:
    done = ""
    if att.progress_total and att.progress_done is not None:
        done = f" at {100 * att.progress_done / att.progress_total:.0f}%"
    return f"{why + ': ' if why else ''}checkpointed{done} and exited; requeued with its progress"


def _exit_reason(result: PollResult, att: Attempt | None = None) -> str:
    said = result.detail or result.exit_words()
    if att is not None and att.backfilled_until is not None and att.term_sent_at is not None:
        return f"ran past the run time it was backfilled on ({said})"  # and told to stop
    return said
