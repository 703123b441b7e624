"""The daemon's bookkeeping of attempts: recover them after a crash, reap those that
ended (a job that checkpointed on the planner's SIGTERM is requeued), account those still
running, stop cancelled ones, and keep the GPUs' power limits in step with them."""

from __future__ import annotations

import contextlib
import logging
import signal
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, select

from executors.base import Handle, PollResult, RunStatus
from executors.errors import HostUnreachable
from orchestrator.calibration import learn
from orchestrator.errors import translate
from orchestrator.models import Attempt, Job
from orchestrator.states import JobState, transition

log = logging.getLogger("gridshift.daemon")
ACTOR = "daemon"


class Reaper:
    """Mixed into ``Dispatcher``: uses its ``db``, ``executor``, ``settings``, ``nodes``,
    ``planner``, ``caps`` and ``accountant``."""

    def _modelled_power_w(self, att: Attempt) -> float:
        """GPU draw where no counter measures it: the GPU type's curve at the cap."""
        from orchestrator.perfmodel import curve_for

        node = next((n for n in self.nodes if n.name == att.node), None)
        model = next((g.model for g in node.gpus), None) if node and node.gpus else None
        curve = self.planner.curve if self.planner else curve_for(model)
        return curve.power_w(att.cap or 1.0) * len(att.gpu_ids)

    # -- recovery -----------------------------------------------------------------------
    def recover(self, now: datetime) -> None:
        """Settle attempts whose launch did not finish, before anything new starts: those
        a crash left behind (at start) and those whose server went away mid-launch (each
        pass, once it answers again, or given up after the node's ``lost_after``)."""
        with self.db.read() as session:
            launching = session.exec(select(Attempt).where(Attempt.state == "launching")).all()
        down = self.executor.unreachable_nodes() if launching else {}
        for attempt in launching:
            if attempt.node in down:  # not asked: that would wait on a dead server
                self._unreachable(attempt, "unreachable", now)
                continue
            try:
                handle = self.executor.recover(attempt.id, attempt.run_dir, attempt.node)
            except HostUnreachable as exc:
                self._unreachable(attempt, str(exc), now)
                continue
            with self.db.write() as session:
                att = session.get(Attempt, attempt.id)
                job = session.get(Job, att.job_id)
                if handle is None:
                    att.state, att.finished_at = "abandoned", now
                    att.detail = "the daemon stopped before the job started"
                    transition(
                        session,
                        job,
                        JobState.QUEUED,
                        at=now,
                        actor=ACTOR,
                        reason="launch interrupted; requeued",
                    )
                    log.info("job %s: launch was interrupted; requeued", job.id)
                else:
                    mark_running(
                        session,
                        att,
                        job,
                        handle,
                        now,
                        reason="found started after an interrupted launch",
                    )
                    log.info("job %s: reattached after an interrupted launch", job.id)
                session.add(att)

    # -- unreachable servers --------------------------------------------------------------
    def _unreachable(self, att: Attempt, why: str, now: datetime) -> None:
        """An attempt whose server cannot be asked: nothing happens until the server has
        been down for its node's ``lost_after``; then the attempt is given up (it may
        still run there: it is fenced when the server is back) and its job is lost and
        requeued, to resume from its checkpoint where it made one."""
        since = self.executor.unreachable_nodes().get(att.node)
        if since is None or now.timestamp() - since < self._lost_after_s(att.node):
            return
        with self.db.write() as session:
            row, job = session.get(Attempt, att.id), session.get(Job, att.job_id)
            if row.state not in ("launching", "running", "stopped"):
                return
            row.state, row.finished_at = "orphaned", now
            row.detail = f"node {att.node} unreachable for {now.timestamp() - since:.0f}s: {why}"
            session.add(row)
            reason = f"node {att.node} unreachable since {_hms(since)}"
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
                    att.job_id, att.node, att.id)  # fmt: skip

    def fence_orphans(self) -> None:
        """Attempts given up while their server was away: once it answers, make sure they
        do not run (never started, or killed), then they are plainly lost."""
        with self.db.read() as session:
            orphans = session.exec(select(Attempt).where(Attempt.state == "orphaned")).all()
        down = self.executor.unreachable_nodes()
        for att in orphans:
            if att.node in down:
                continue
            handle = Handle.from_dict(att.handle) if att.handle else None
            if handle is None:
                handle = Handle(att.id, att.run_dir, {"node": att.node})
            try:
                settled = self.executor.fence(handle)
            except Exception as exc:  # logged; the next pass tries again
                log.warning("attempt %s: cannot fence: %s", att.id, translate(exc) or exc)
                continue
            if settled:
                with self.db.write() as session:
                    row = session.get(Attempt, att.id)
                    row.state = "lost"
                    session.add(row)
                log.info("attempt %s on %s: fenced", att.id, att.node)

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
                select(Attempt).where(col(Attempt.state).in_(["running", "stopped"]))
            ).all()
        held: dict[str, dict[int, float | None]] = {}
        for a in rows:
            held.setdefault(a.node, {}).update(dict.fromkeys(a.gpu_ids, a.cap))
        self.caps.reconcile(held, skip=self.executor.unreachable_nodes())

    def restore_caps(self) -> None:
        """At stop: every GPU back to its default limit (running jobs run on uncapped
        until a daemon starts again)."""
        if self.caps is not None and self.caps.enabled:
            self.caps.reconcile({}, skip=self.executor.unreachable_nodes())

    # -- reap ---------------------------------------------------------------------------
    def reap(self, now: datetime) -> int:
        """Record attempts that ended, and account those still running. Returns how many
        ended."""
        with self.db.read() as session:
            live = session.exec(
                select(Attempt).where(col(Attempt.state).in_(["submitted", "running", "stopped"]))
            ).all()
        ended = 0
        self.executor.refresh([Handle.from_dict(a.handle) for a in live])
        for attempt in live:
            handle = Handle.from_dict(attempt.handle)
            result = self.executor.poll(handle)
            if result.status is RunStatus.UNREACHABLE:
                self._unreachable(attempt, result.detail or "unreachable", now)
                continue
            if result.status is RunStatus.PENDING:  # a batch scheduler still holds it
                continue
            if attempt.state == "submitted" and result.started_at is not None:
                self._started(attempt, handle, result.started_at)
            self._record_progress(attempt, self.executor.progress(handle), now)
            if result.status is RunStatus.RUNNING:
                self._account_running(attempt, now)
                continue
            self._record_end(attempt.id, result, now)
            ended += 1
        return ended

    def _started(self, attempt: Attempt, handle: Handle, started_at: datetime) -> None:
        """A submitted attempt the batch scheduler started: running since its real start."""
        with self.db.write() as session:
            att, job = session.get(Attempt, attempt.id), session.get(Job, attempt.job_id)
            if att.state == "submitted":
                mark_running(session, att, job, handle, started_at, reason="started by Slurm")
        attempt.state = "running"
        log.info("job %s: started by Slurm at %s", attempt.job_id, started_at.isoformat())

    def _account_running(self, att: Attempt, now: datetime) -> None:
        totals = self.accountant.measure(att, now.timestamp())
        every = self.power_sample_s or 5.0
        if totals is None or now.timestamp() - self._last_written.get(att.id, 0.0) < every:
            return
        self._last_written[att.id] = now.timestamp()
        with self.db.write() as session:
            row = session.get(Attempt, att.id)
            if row.state in ("running", "stopped"):
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
            job = session.get(Job, att.job_id)
            ended_at = result.ended_at or now
            started = result.started_at or _run_started_at(att)
            if started is not None:  # the monitor's (or Slurm's) clock: the real start
                att.started_at = started
            att.finished_at, att.exit_code, att.signal = ended_at, result.exit_code, result.signal
            att.detail = result.detail
            att.state = "exited" if result.status is RunStatus.EXITED else "lost"
            session.add(att)
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
            elif result.status is RunStatus.LOST and job.state == JobState.PLANNED.value:
                to, reason = JobState.QUEUED, f"{result.detail or 'vanished'} before it started"
            elif result.status is RunStatus.LOST:
                to, reason = JobState.LOST, result.detail or "vanished"
            elif checkpointed and result.exit_code == 0:
                to, reason = JobState.QUEUED, _suspended_reason(att, ended_at)
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
                to, reason = JobState.FAILED, _exit_reason(result)
            transition(session, job, to, at=ended_at, actor=ACTOR, reason=reason)
            if to is JobState.QUEUED:
                job.finished_at = None
                session.add(job)
            if to is JobState.COMPLETED:
                learn(session, job, att, now)
        if self.caps is not None:
            self.caps.restore(att.node, att.gpu_ids)
        log.info("job %s: %s%s", job.id, to, f" ({reason})" if reason else "")

    # -- cancel -------------------------------------------------------------------------
    def stop_cancelled(self, now: datetime) -> None:
        """SIGTERM the process group of each running job whose cancel was requested;
        SIGKILL once the grace period has passed."""
        grace = timedelta(seconds=self.settings.cancel_grace_s)
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(col(Attempt.state).in_(["submitted", "running", "stopped"]))
                .where(col(Job.cancel_requested_at).is_not(None))
            ).all()
        down = self.executor.unreachable_nodes()
        for att in rows:
            if att.kill_sent_at is not None or att.node in down:
                continue
            if att.state == "stopped":  # a stopped job must run to hear its SIGTERM
                with contextlib.suppress(Exception):
                    self.executor.signal(Handle.from_dict(att.handle), signal.SIGCONT)
            if att.term_sent_at is None:
                sig, field = signal.SIGTERM, "term_sent_at"
            elif now - att.term_sent_at >= grace:
                sig, field = signal.SIGKILL, "kill_sent_at"
            else:
                continue
            try:
                self.executor.signal(Handle.from_dict(att.handle), sig)
            except Exception as exc:  # logged; retried next tick
                log.warning("job %s: cannot signal: %s", att.job_id, translate(exc) or exc)
                continue
            with self.db.write() as session:
                row = session.get(Attempt, att.id)
                setattr(row, field, now)
                session.add(row)

    # -- schedule and launch ------------------------------------------------------------


def mark_running(
    session: Session,
    att: Attempt,
    job: Job,
    handle: Handle,
    now: datetime,
    reason: str | None = None,
) -> None:
    att.state, att.handle, att.started_at = "running", handle.to_dict(), now
    session.add(att)
    job.started_at = job.started_at or now
    transition(session, job, JobState.RUNNING, at=now, actor=ACTOR, reason=reason)


def _hms(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S UTC")


def _run_started_at(att: Attempt) -> datetime | None:
    """When the monitor started the job (its job.json), or None."""
    from pathlib import Path

    from executors import runfiles

    data = runfiles.read_json(Path(att.run_dir) / runfiles.JOB) if att.run_dir else None
    if not data or "started_at" not in data:
        return None
    return datetime.fromisoformat(data["started_at"])


def _suspended_reason(att: Attempt, at: datetime) -> str:
    done = ""
    if att.progress_total and att.progress_done is not None:
        done = f" at {100 * att.progress_done / att.progress_total:.0f}%"
    return f"checkpointed{done} and exited; requeued with its progress"


def _exit_reason(result: PollResult) -> str:
    if result.detail:
        return result.detail
    if result.signal:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"killed by {name}"
    return f"exit code {result.exit_code}"
