"""Splitting a running pair on the live daemon (EaCO's early-stage observations): a job
sharing its GPU whose own measured speed next to its partner would make it end after its
deadline is checkpointed and restarts alone (the rule: ``planning.devices.splitting``; the
simulator's: ``sim.hardware.splits``).

After each pass, for each attempt of a pair (``Sharing.paired``) with a measured speed
(``Sharing.measured``: two progress reports next to its partner after a rate alone), a job
that may be interrupted (``--interruptible``), has a deadline, is not told to checkpoint,
stop or cancel nor killed, runs on a server that answers, and whose checkpoint's cost plus
``cancel_grace_s`` fits ``MOVE_GRACE_CAP_S``, splits when its work left (``_left_s``: by
its own reports, else its ``--duration`` less the time its attempts ran; at its cap's
rate), at its measured speed, ends after its deadline, and alone (its checkpoint's cost
lost) would end by it, on a GPU free now (the pass's allocator; one split at a time: none
while an earlier split's job still runs, checkpointing, since nothing holds a GPU for it
until it restarts, one another daemon sent included (``_in_flight``); none while a job
due waits for GPUs: it would restart behind it). Its speed counts only if measured next
to the partner it has now (the rate's stretch began after that partner started), and a
partner that has run past its ``--duration`` has an unknown end. Its partner is expected
to leave after its ``--duration`` less the time its attempts ran (not its reports), at the model's
predicted speed: the job runs alone from then on (unknown: paired to the end). Only that
job: its reports are its own (untrusted), so they never make its partner be checkpointed;
a job that lies about itself only moves itself.

It gets SIGTERM through the suspend path the deadline guard uses (``Suspender.checkpoint``,
SIGKILL after its checkpoint's cost plus ``cancel_grace_s``, at most ``MOVE_GRACE_CAP_S``,
also after a daemon restart: ``Suspender.kill_after_s`` reads the reason), at most once per
attempt, and is requeued with its progress, the reason starting with ``SPLIT``; placement
then keeps it alone in its next attempt (``pairs.after_split``: neither joining nor joined).
Its partner runs alone at full speed. The split is a job event and a log line, counted in
``splits``. Always on where a node shares (it only protects deadlines). A failure of the
step is logged once and the pass goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlmodel import col, select

from orchestrator.daemon.contain import OncePerReason
from orchestrator.daemon.energy.sharing import Sharing, _left_s, kind_of
from orchestrator.daemon.guard import MOVE_GRACE_CAP_S, SPLIT, note_reason
from orchestrator.planning.devices.gputypes import type_of
from orchestrator.planning.devices.splitting import Member, to_split
from orchestrator.planning.perfmodel import curve_for
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.models import Attempt, Event, Job

log = logging.getLogger(__name__)


@dataclass
class Splitter:
    """Splits pairs whose measured speed puts one job's deadline at risk (``step``)."""

    sharing: Sharing
    checkpoint: Callable[[Attempt, datetime], bool]  # the guard's SIGTERM (``Suspender``)
    checkpoint_s: float  # the lab's checkpoint cost, for a job without its own
    down: Callable[[], Collection[str]] = frozenset  # the servers that do not answer
    alloc: Callable[[], object] = lambda: None  # the pass's allocator (SqlQueue.alloc)
    waiting: Callable[[], object] = lambda: None  # the job due that found no GPUs, if any
    grace: Callable[[int, float], None] = lambda attempt_id, seconds: None  # ``grant``
    grace_s: float = 0.0  # ``cancel_grace_s``
    splits: int = 0
    told: dict[int, int] = field(default_factory=dict)  # attempt split -> its job
    _faults: OncePerReason = field(
        default_factory=lambda: OncePerReason(
            log, "co-location splits", "no split this pass; the daemon goes on"
        )
    )

    def step(self, now_s: float) -> list[int]:
        """Checkpoint each paired job at risk by the rule; the jobs told. A failure is
        logged once per reason and the pass goes on."""
        done: list[int] = []
        with self._faults.step():
            done = self._step(now_s)
        return done

    def _step(self, now_s: float) -> list[int]:
        self._forget()
        measured = self.sharing.measured
        if not measured or self.waiting() is not None:
            return []  # a job due waits for GPUs: the one split would restart behind it
        self._in_flight()
        if self.told:
            return []  # one at a time: the GPU the last one will take is nobody's yet
        paired = self.sharing.paired()
        ids = [a for a in paired if a in measured and a not in self.told]
        if not ids:
            return []
        with self.sharing.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(col(Attempt.id).in_(ids))
            ).all()
            others = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(col(Attempt.id).in_({o for a in ids for o in paired[a]}))
            ).all()
        partner = {att.id: (att, job) for att, job in others}
        down = set(self.down())
        candidates = [
            (att, job) for att, job in rows
            if self._may_split(att, job, down) and self._measured_now(att, paired, partner)
        ]  # fmt: skip
        before = self.sharing.earlier_s([att for att, _ in candidates] + [a for a, _ in others])
        members, by_id = [], {}
        for att, job in candidates:
            left = _left_s(job, att, now_s, before_s=before.get(att.id, 0.0))
            rate = self._rate(att)
            with_ = [partner[o] for o in paired[att.id] if o in partner]
            member = Member(att.id, measured[att.id], None if left is None else left / rate,
                            job.deadline.timestamp(), True, self._checkpoint_s(job),
                            self._partner_end_s(job, with_, now_s, before))  # fmt: skip
            members.append(member)
            by_id[att.id] = (att, job, member)
        room = self.alloc()
        for att_id in to_split(members, now_s):
            att, job, member = by_id[att_id]
            if room is not None and not room.fits_now(1, getattr(job, "gpu_type", None)):
                continue  # no GPU free for it now: waiting would not save it
            partners = [partner[o][1].id for o in paired[att_id] if o in partner]
            if self._start(att, job, member, partners, now_s):
                return [job.id]  # one at a time
        return []

    def _measured_now(self, att: Attempt, paired: dict, partner: dict) -> bool:
        """Whether its measured speed is next to the one partner it has now: the rate's
        stretch began once that partner had started (one measured next to an earlier
        partner says nothing of this one)."""
        others = [partner[o][0] for o in paired.get(att.id, ()) if o in partner]
        since = self.sharing.measured_from.get(att.id)
        if len(others) != 1 or since is None or others[0].started_at is None:
            return False
        return since >= others[0].started_at.timestamp()

    def _may_split(self, att: Attempt, job: Job, down: set) -> bool:
        if not (job.share and job.interruptible) or job.deadline is None:
            return False
        if att.state != AttemptState.RUNNING.value or att.node in down:
            return False
        if job.cancel_requested_at is not None or att.stopped_at is not None:
            return False  # on its way out, or stopped (``--suspend stop``)
        if any(t is not None for t in (att.suspend_sent_at, att.term_sent_at, att.kill_sent_at)):
            return False  # told to checkpoint or stop already, or killed
        return self._checkpoint_s(job) + self.grace_s <= MOVE_GRACE_CAP_S

    def _start(self, att: Attempt, job: Job, member: Member, partners: list, now_s: float):
        """SIGTERM to checkpoint, its requeue's reason noted; whether it was delivered."""
        sharing = self.sharing
        now = datetime.fromtimestamp(now_s, UTC)
        with_ = ", ".join(f"job {p}" for p in partners if p is not None) or "its partner"
        note = (f"{SPLIT} ({with_}): at {member.speed:.0%} of its speed alone it would end "
                "after its deadline; alone it keeps it")  # fmt: skip
        sharing.notes[job.id] = note  # the reaper's requeue reason (``Reaper.moved``)
        reason = f"{note}: SIGTERM to checkpoint"
        was = note_reason(sharing.db, job.id, reason)  # before the signal: a daemon that
        sent = False  # dies right after it still finds why (``Suspender.kill_after_s``)
        try:  # its grace: at least its checkpoint's cost (capped), the lab's if longer
            self.grace(att.id, min(member.checkpoint_s + self.grace_s, MOVE_GRACE_CAP_S))
            sent = self.checkpoint(att, now)
        finally:
            if not sent:  # not delivered (or it raised): a later pass may try again
                sharing.notes.pop(job.id, None)
                note_reason(sharing.db, job.id, was, unless=reason)
        if not sent:
            return False
        self.told[att.id] = job.id  # once per attempt
        with sharing.db.write() as session:  # in its history: said even if it then fails
            row = session.get(Job, job.id)
            session.add(Event(job_id=row.id, at=now, from_state=row.state, to_state=row.state,
                              reason=reason, actor="daemon"))  # fmt: skip
        log.info("job %s: %s; SIGTERM to checkpoint", job.id, note)
        self.splits += 1
        return True

    def _in_flight(self) -> None:
        """Splits read from the store, at every step that could split: those whose jobs
        still checkpoint (running, told to checkpoint, their reason the split's) count as
        told, whichever daemon sent them (one before a restart, or another that held the
        lease while this one stood by), so no second split goes while the first one's GPU
        is nobody's."""
        with self.sharing.db.read() as session:
            rows = session.exec(
                select(Attempt.id, Job.id)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(
                    col(Attempt.finished_at).is_(None),
                    col(Attempt.suspend_sent_at).is_not(None),
                    col(Job.reason).startswith(SPLIT),
                )
            ).all()
        for att_id, job_id in rows:
            self.told.setdefault(att_id, job_id)

    def _forget(self) -> None:
        """Attempts split that have ended: their requeue has its reason (the reaper runs
        before this step), so the note goes (a later suspension is no split)."""
        if not self.told:
            return
        with self.sharing.db.read() as session:
            running = set(
                session.exec(
                    select(Attempt.id).where(
                        col(Attempt.id).in_(list(self.told)),
                        col(Attempt.finished_at).is_(None),
                    )
                ).all()
            )
        for att_id in [a for a in self.told if a not in running]:
            job_id = self.told.pop(att_id)
            if self.sharing.notes.get(job_id, "").startswith(SPLIT):
                self.sharing.notes.pop(job_id, None)

    def _partner_end_s(self, job: Job, with_: list, now_s: float, before: dict) -> float | None:
        """When its one partner is expected to leave (None: unknown, it counts as never):
        its ``--duration`` less the time its attempts ran (never its reports), at the
        model's predicted speed next to ``job`` at its cap. An estimate that can only make
        ``job``'s end earlier: a partner's claims keep a job from a split, never cause one."""
        if len(with_) != 1:
            return None
        other, other_job = with_[0]
        left = _left_s(other_job, other, now_s, reports=False, before_s=before.get(other.id, 0.0))
        if left is None or left <= 0:
            return None  # no estimate, or run past its --duration: its end is unknown
        node = next((n for n in self.sharing.nodes if n.name == other.node), None)
        gpu = type_of(node.model_of(other.gpu_ids) if node else None) or "v100"
        _, speed = self.sharing.model.speeds(kind_of(job), kind_of(other_job), gpu)
        speed *= self._rate(other)
        return now_s + left / speed if speed > 0 else None

    def _rate(self, att: Attempt) -> float:
        """Its speed alone at its cap, as a share of full speed (``Sharing.joins``')."""
        node = next((n for n in self.sharing.nodes if n.name == att.node), None)
        if node is None:
            return 1.0
        rate = curve_for(node.model_of(att.gpu_ids)).throughput_fraction(att.cap or 1.0)
        return rate if rate > 0 else 1.0

    def _checkpoint_s(self, job: Job) -> float:
        return self.checkpoint_s if job.checkpoint_s is None else job.checkpoint_s
