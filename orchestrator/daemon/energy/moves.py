"""Co-location moves on the live daemon: a running ``--share --interruptible`` job alone on
its GPU is checkpointed and restarts next to another sharing job alone, when the pair is
predicted to save more than twice what the checkpoint costs (``interference.move_gain_j``,
the simulator's rule, ``sim.hardware.colocation``).

After each pass's launches that left a job due waiting for GPUs (a move slows two jobs
down to free one: with nobody waiting, no move), at most one job moves, and none while an
earlier move's job still holds the GPU it left or any running job is told to checkpoint
(the waiting job may get that GPU: one waiting job, one move). A failure of the step is
logged once and the pass goes on. A job may move when

- it asked to share (``--share``), may be suspended (``--interruptible``), has a
  ``--duration`` (its work left is the daemon's estimate) and runs alone on one GPU of a
  node whose ``share`` policy shares (never a Slurm node), whose server answers;
- it is not running a planned piece (it stops at its end anyway), nor told to checkpoint,
  stop or cancel, nor booked as another moved job's host;
- the GPU it frees lets the waiting job start: the pass's allocator's answer with its
  GPUs freed (buddy blocks, a job across servers' parts, GPUs held back, the GPU type);
- it has run at least twice its checkpoint cost plus ``daemon.move_after`` (10 min) since
  it started: a job never moves twice in quick succession, nor before its SIGTERM handler
  is up;
- another job runs alone that it may join by the rule a newcomer is placed by
  (``Sharing.joins``: one GPU each, one user's jobs unless the node says ``share_users =
  "any"``, each keeps ``MIN_SPEED`` and its deadline at the paired speeds, its own work
  left plus the checkpoint's cost; the energy per unit of work falls), on a server that
  answers, that nobody is booked next to.

The gain is ``move_gain_j`` with each job's draw alone by its GPU type's power curve at its
cap, the model's predicted speeds (never what a job reports of its own), each one's work
left by the estimate the pairing's deadline check uses (``sharing._left_s``: its
``--duration`` less the time all its attempts ran), here the smaller of the one by its
progress reports and the one by the time it ran (a job's reports
are its own: they never make a move look better than its ``--duration`` does), and the
job's checkpoint cost (``--checkpoint-cost``, else ``daemon.checkpoint_cost``). The best
positive gain moves, emptiest servers first (a server a move empties may be powered off):
the job gets SIGTERM through the suspend path the deadline guard uses (SIGKILL after its
checkpoint's cost plus ``cancel_grace_s``, at most ``MOVE_GRACE_CAP_S``; requeued with
its progress once it exits 0, the move named as the reason), and
``Sharing.booked`` keeps its host's GPU for it: it restarts at once (``pinned``) next to
that job, unless the host has ended, has a partner, is leaving or does not answer by then
(it restarts as any job). The move is a job event: its history keeps it. A job whose
checkpoint cost plus ``cancel_grace_s`` is over ``MOVE_GRACE_CAP_S`` never moves.
Bookings and graces are in memory: after a daemon restart a moved job restarts as any,
and one still checkpointing gets its checkpoint's cost from its job row
(``Suspender.suspend_due``).

``daemon.moves`` says which moves: ``"waiting-jobs"`` (the above), ``"empty-servers"``
(while no job waits, the jobs of a server right-sizing may power off move next to jobs
alone on other servers, when that pays with the idle draw saved and the receiving
servers' kept on: ``daemon.energy.emptying``), ``true`` both (``settings.move_kinds``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlmodel import col, func, select

from orchestrator.daemon.contain import OncePerReason
from orchestrator.daemon.energy.emptying import emptying
from orchestrator.daemon.energy.sharing import Booking, Sharing, _left_s, _policy
from orchestrator.daemon.guard import MOVE_GRACE_CAP_S, MOVED, note_reason
from orchestrator.planning.devices.gputypes import type_of
from orchestrator.planning.devices.interference import MOVE_AFTER_S, may_move_again, move_gain_j
from orchestrator.planning.perfmodel import curve_for
from orchestrator.queue.attempts import HOLDING, AttemptState, values
from orchestrator.queue.models import Attempt, Event, Job
from orchestrator.queue.states import JobState

log = logging.getLogger(__name__)
_WAITING = (JobState.RUNNING.value, JobState.SUSPENDED.value, JobState.QUEUED.value,
            JobState.PLANNED.value)  # fmt: skip


@dataclass
class Move:
    """A move chosen: ``att`` of ``job`` to join ``host``'s attempt ``host_att``."""

    att: Attempt
    job: Job
    host_att: Attempt
    host: Job
    gain_j: float
    server: str | None = None  # the server its move empties (``emptying``), if any
    speeds: tuple[float, float] = (1.0, 1.0)  # its and the host's, paired
    left_s: float = 0.0  # its work left, at full speed
    host_left_s: float = 0.0  # the host's
    ckpt_s: float = 0.0  # its checkpoint's cost
    kept_j: float = 0.0  # the idle draw of the server it joins, kept on longer (``emptying``)


@dataclass
class Mover:
    """Chooses and starts co-location moves (``step``, once per pass)."""

    sharing: Sharing
    checkpoint: Callable[[Attempt, datetime], bool]  # the guard's SIGTERM (``Suspender``)
    checkpoint_s: float  # the lab's checkpoint cost, for a job without its own
    after_s: float = MOVE_AFTER_S
    down: Callable[[], Collection[str]] = frozenset  # the servers that do not answer
    waiting: Callable[[], object] = lambda: None  # the job due that found no GPUs, if any
    alloc: Callable[[], object] = lambda: None  # the pass's allocator (SqlQueue.alloc)
    # a moved job's grace before SIGKILL, by attempt (``Suspender.grant``), and the lab's
    grace: Callable[[int, float], None] = lambda attempt_id, seconds: None
    grace_s: float = 0.0  # ``cancel_grace_s``
    waiting_jobs: bool = True  # ``daemon.moves``: moves for a job waiting for GPUs
    empty_servers: bool = False  # and moves that empty a server (``emptying``)
    # the servers right-sizing may power off once idle (on, ``idle_off_after`` set)
    emptiable: Callable[[], Collection[str]] = frozenset
    # a server's idle draw with ``busy`` of its ``gpus`` held, IT power as the gains are
    # (``Levers.it_idle_w``: ``IdleMeter.draw_w`` without PUE)
    idle_w: Callable[[str, int, int], float] = lambda name, gpus, busy: 0.0
    moves: int = 0
    _faults: OncePerReason = field(
        default_factory=lambda: OncePerReason(
            log, "co-location moves", "no move this pass; the daemon goes on"
        )
    )

    def step(self, now_s: float) -> Move | None:
        """Move one job for a job waiting, or the jobs that empty one server (SIGTERM,
        each booked next to its host); the (first) move, or None. A
        failure (a bug, the store away) is logged once per reason and the pass goes on
        with its other steps, as the energy levers' do: the jobs come first."""
        move = None
        with self._faults.step():
            move = self._step(now_s)
        return move

    def _step(self, now_s: float) -> Move | None:
        self._forget()
        head = self.waiting()  # a move slows two jobs down to free a GPU: only for a job
        # waiting for one, or to empty a server (the simulator's rule, sim.hardware)
        if not (self.waiting_jobs if head is not None else self.empty_servers):
            return None
        if head is None and not self.emptiable():  # no server right-sizing may power off
            return None
        if self._in_flight():  # the GPU it frees is not free yet: the head waits for it
            return None
        if head is None:  # nobody waits: all the jobs of one server, or none
            moves = emptying(self, now_s)
        else:
            moves = [m] if (m := self.pick(now_s, head)) is not None else []
        moves.sort(key=lambda m: -m.gain_j)  # those that pay on their own first
        first = None
        for i, move in enumerate(moves):
            if not self._start(move, now_s):  # the server stays on: no more checkpoints
                if i + 1 < len(moves):
                    log.warning("job %s: SIGTERM to move it not delivered: server %s stays "
                                "on; its %d other move(s) not sent", move.job.id,
                                move.server, len(moves) - i - 1)  # fmt: skip
                break
            first = first or move
        return first

    def _start(self, move: Move, now_s: float) -> bool:
        """SIGTERM to checkpoint, booked next to its host; whether it was delivered."""
        sharing = self.sharing
        now = datetime.fromtimestamp(now_s, UTC)
        gpu = move.host_att.gpu_ids[0]
        note = f"{MOVED} {gpu} on {move.host_att.node} with job {move.host.id}"
        if move.server is not None:
            note += f" to empty server {move.server}"
        booking = Booking(move.host_att.node, gpu, move.host_att.id, move.host.id, move.att.id)
        sharing.booked[move.job.id], sharing.notes[move.job.id] = booking, note
        reason = f"{note}: SIGTERM to checkpoint"
        was = note_reason(sharing.db, move.job.id, reason)  # before the signal (its grace)
        sent = False
        try:  # its grace: at least its checkpoint's cost (capped), the lab's if longer
            ckpt = self._checkpoint_s(move.job)
            self.grace(move.att.id, min(ckpt + self.grace_s, MOVE_GRACE_CAP_S))
            sent = self.checkpoint(move.att, now)
        finally:
            if not sent:  # not delivered (or it raised): a later pass may try again
                sharing.booked.pop(move.job.id)
                sharing.notes.pop(move.job.id)
                note_reason(sharing.db, move.job.id, was, unless=reason)
        if not sent:
            return False
        with sharing.db.write() as session:  # in its history: said even if it then fails
            row = session.get(Job, move.job.id)
            session.add(Event(job_id=row.id, at=now, from_state=row.state, to_state=row.state,
                              reason=reason, actor="daemon"))  # fmt: skip
        also = "; with its server's other moves and idle draw, it pays" if move.server else ""
        log.info("job %s: %s (the pair predicted to save %.1f kJ net of twice its checkpoint's "
                 "cost%s); SIGTERM to checkpoint", move.job.id, note, move.gain_j / 1e3,
                 also)  # fmt: skip
        self.moves += 1
        return True

    def pick(self, now_s: float, head=None) -> Move | None:
        """The move to make now, if any (nothing done); with ``head`` (the job waiting for
        GPUs), only of a job whose GPU lets it start."""
        nodes = {n.name: n for n in self.sharing.nodes if _policy(n) != "never"}
        alone = self.sharing._alone(nodes) if nodes else []
        if len(alone) < 2:
            return None
        return self.choose(alone, nodes, now_s, set(self.down()), head)

    def choose(self, alone: list, nodes: dict, now_s: float, down: set, head=None) -> Move | None:
        """The first job (emptiest servers first) with a host whose gain is positive,
        next to the host with the largest gain."""
        hosts_booked = {b.host_attempt for b in self.sharing.booked.values()}
        taken = self.sharing.booked_gpus()  # (a GPU joined in this pass holds two attempts)
        free = self._free(nodes)
        movers = [
            (att, job) for att, job in alone
            if self._may_move(att, job, now_s, down) and att.id not in hosts_booked
            and (head is None or self._lets_start(head, nodes[att.node], att, free))
        ]  # fmt: skip
        movers.sort(key=lambda r: (-free.get(r[0].node, 0), r[0].id))
        before = self.sharing.earlier_s([att for att, _ in alone]) if movers else {}
        for att, job in movers:
            best = self.best_host(att, job, alone, nodes, now_s, down, before, taken)
            if best is not None and best.gain_j > 0:
                return best
        return None

    def best_host(self, att: Attempt, job: Job, alone: list, nodes: dict, now_s: float,
                  down: set, before: dict, taken: Collection, avoid: Collection = (),
                  kept: Callable[[Move], float] | None = None) -> Move | None:  # fmt: skip
        """``job``'s move next to the job alone that it may join with the largest gain
        (of any sign; None: none it may join), less ``kept`` (what it costs the server
        it joins, ``Move.kept_j``): not a booked host, not on ``avoid``'s servers, nor on
        a GPU in ``taken``."""
        hosts_booked = {b.host_attempt for b in self.sharing.booked.values()}
        ckpt = self._checkpoint_s(job)
        left = _work_left(job, att, now_s, before.get(att.id, 0.0))
        if left is None:
            return None
        power = _draw_w(nodes[att.node], att)
        best = None
        mine_type = type_of(nodes[att.node].model_of(att.gpu_ids))
        for host_att, host in alone:
            node = nodes.get(host_att.node)
            if host_att.id == att.id or host_att.id in hosts_booked or node is None:
                continue
            if host_att.node in avoid or type_of(node.model_of(host_att.gpu_ids)) != mine_type:
                continue  # its draw and time left are on its own GPU type
            # its deadline: as the pairing check reads it
            mine = _left_s(job, att, now_s, before_s=before.get(att.id, 0.0))
            host_before = before.get(host_att.id, 0.0)
            speeds = self.sharing.joins(job, mine + ckpt, host_att, host, node, now_s,
                                        down, taken, host_before)  # fmt: skip
            left_host = _work_left(host, host_att, now_s, host_before)
            if speeds is None or left_host is None:
                continue
            power_host = _draw_w(node, host_att)
            gain = move_gain_j(power, power_host, *speeds, left, left_host, ckpt)
            move = Move(att, job, host_att, host, gain, None, tuple(speeds), left, left_host,
                        ckpt)  # fmt: skip
            move.kept_j = kept(move) if kept is not None else 0.0
            if best is None or gain - move.kept_j > best.gain_j - best.kept_j:
                best = move
        return best

    @staticmethod
    def work_left(job: Job, att: Attempt, now_s: float, before_s: float = 0.0) -> float | None:
        return _work_left(job, att, now_s, before_s)

    def _may_move(self, att: Attempt, job: Job, now_s: float, down: set) -> bool:
        if not (job.share and job.interruptible and job.duration_s) or att.node in down:
            return False
        if job.cancel_requested_at is not None or att.planned_until is not None:
            return False  # on its way out, or running a planned piece (it stops at its end)
        if att.term_sent_at is not None or att.started_at is None:
            return False
        if self._checkpoint_s(job) + self.grace_s > MOVE_GRACE_CAP_S:
            return False  # it could not finish its checkpoint before its SIGKILL
        ran_s = now_s - att.started_at.timestamp()
        return may_move_again(ran_s, self._checkpoint_s(job), self.after_s)

    def _lets_start(self, head, node, att: Attempt, free: dict[str, int]) -> bool:
        """Whether the waiting job ``head`` could be placed only with ``att``'s GPUs free:
        the pass's allocator's own answer (``room_if_freed``: buddy blocks, a job across
        servers' parts, GPUs held back, servers down, its GPU type; one that fits already
        waits for something else), as the simulator asks it; without one (outside a pass),
        by counting the node's free GPUs."""
        alloc = self.alloc()
        if alloc is None:
            return _frees_room(head, node, att, free)
        width = head.min_gpus or head.gpus
        return alloc.room_if_freed(("attempt", att.id), width, head.gpu_type)

    def _in_flight(self) -> bool:
        """Whether a moved job still holds the GPU it left, or any running job was told to
        checkpoint (the deadline guard waits for those too): the waiting job may get its
        GPU then, and one move more would slow two jobs down for nothing."""
        left = [b.attempt for b in self.sharing.booked.values()]
        with self.sharing.db.read() as session:
            checkpointing = (Attempt.state == AttemptState.RUNNING.value) & col(
                Attempt.suspend_sent_at
            ).is_not(None)  # as the guard reads it (``Running.checkpointing``)
            row = session.exec(
                select(Attempt.id).where(
                    checkpointing
                    | (col(Attempt.id).in_(left) & col(Attempt.state).in_(values(HOLDING)))
                )
            ).first()
        return row is not None

    def _checkpoint_s(self, job: Job) -> float:
        return self.checkpoint_s if job.checkpoint_s is None else job.checkpoint_s

    def _free(self, nodes: dict) -> dict[str, int]:
        """Each sharing node's GPUs that no attempt holds."""
        with self.sharing.db.read() as session:
            rows = session.exec(
                select(Attempt.node, Attempt.gpu_ids).where(
                    col(Attempt.state).in_(values(HOLDING)), col(Attempt.node).in_(list(nodes))
                )
            ).all()
        held: dict[str, set] = {}
        for node, gpus in rows:
            held.setdefault(node, set()).update(gpus or ())
        return {name: n.gpu_count - len(held.get(name, ())) for name, n in nodes.items()}

    def _forget(self) -> None:
        """Bookings of jobs that ended, or that started again some other way."""
        booked = self.sharing.booked
        if not booked:
            return
        with self.sharing.db.read() as session:
            states = dict(session.exec(select(Job.id, Job.state)
                                       .where(col(Job.id).in_(list(booked)))).all())  # fmt: skip
            latest = dict(
                session.exec(
                    select(Attempt.job_id, func.max(Attempt.id))
                    .where(col(Attempt.job_id).in_(list(booked)))
                    .group_by(col(Attempt.job_id))
                ).all()
            )
        for job_id, booking in list(booked.items()):
            if states.get(job_id) not in _WAITING or latest.get(job_id) != booking.attempt:
                booked.pop(job_id)
                self.sharing.notes.pop(job_id, None)


def _frees_room(head, node, att: Attempt, free: dict[str, int]) -> bool:
    """Whether the GPUs ``att`` frees let the waiting job ``head`` start on its node (its
    narrowest width there, of the GPU type it asked for)."""
    typed = head.gpu_type is None or type_of(node.model_of(att.gpu_ids)) == head.gpu_type
    room = free.get(att.node, 0) + len(att.gpu_ids or ())
    return typed and room >= (getattr(head, "min_gpus", None) or head.gpus)


def _work_left(job: Job, att: Attempt, now_s: float, before_s: float = 0.0) -> float | None:
    """Work left for the gain: the pairing check's estimate, never more than the time its
    attempts ran leaves (``before_s``: its earlier ones'; its own reports cannot make a
    move look better)."""
    told = _left_s(job, att, now_s, before_s=before_s)
    timed = _left_s(job, att, now_s, reports=False, before_s=before_s)
    return None if told is None or timed is None else min(told, timed)


def _draw_w(node, att: Attempt) -> float:
    """The attempt's GPU's draw alone, by its type's power curve at its cap."""
    return curve_for(node.model_of(att.gpu_ids)).power_w(att.cap or 1.0)
