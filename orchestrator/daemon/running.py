"""The running attempts as the pass's resize step and backfill see them, on the SQL
store. ``SqlQueue`` takes these methods from ``RunningViews``.

- Resizing running elastic jobs (``orchestrator.planning.resize`` decides,
  ``planning.resizestep`` carries a decision out over a ``QueueState``): the SQL queue's
  ``resize`` (a checkpoint whose job starts again at once on its new width, the width kept
  on the attempt, ``attempt.resize_to``, so that a restarted daemon knows it), the
  allocator with the GPUs pending grows wait for held, and each running job as the resize
  step sees it.
- Backfill (``planning.backfill``): ``cluster``, when each running attempt gives its GPUs
  back, as far as a reservation may trust it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sqlmodel import Session, col, func, select

from orchestrator.daemon.energy.pairs import movable_alone, pair_ends
from orchestrator.daemon.planner import LivePlanner
from orchestrator.planning.backfill import running_end_s
from orchestrator.planning.onepass import Running
from orchestrator.planning.policies.base import DEFAULT_CHECKPOINT_S
from orchestrator.planning.resize import run_s, width_rate
from orchestrator.planning.resizestep import pin_resized, reserve_resized
from orchestrator.planning.scheduler import Scheduler
from orchestrator.queue.attempts import AttemptState, ran_s, remaining_run_s, width_of_attempt
from orchestrator.queue.models import Attempt, Job
from orchestrator.queue.states import JobState
from placement.cluster import ClusterAllocator

log = logging.getLogger("orchestrator.daemon.sqlqueue")


class RunningViews:
    """Mixed into ``SqlQueue`` (which holds the fields these read)."""

    resize_to: dict[int, int]
    resize_from: dict[int, object]
    eligible: dict
    alloc: ClusterAllocator | None
    planner: LivePlanner | None

    def resize(self, run: Running, width: int, now_s: float) -> bool:
        """Checkpoint a running elastic job (SIGTERM) to start it again on ``width`` GPUs
        once it has left (``_restart_resized``)."""
        self.resize_to[run.job.id] = width
        self.resize_from[run.job.id] = run.key
        if self.suspender.checkpoint(run.ref, self._at(now_s)):
            with self.db.write() as session:  # kept across a restart of the daemon
                row = session.get(Attempt, run.ref.id)
                row.resize_to = width
                session.add(row)
            log.info("job %s: resized from %s to %s GPUs: SIGTERM to checkpoint",
                     run.job.id, run.gpus, width)  # fmt: skip
            return True
        del self.resize_to[run.job.id]
        del self.resize_from[run.job.id]
        return False

    def _allocator(self, session: Session) -> ClusterAllocator:
        """The allocator over what runs, with the GPUs pending grows wait for held."""
        alloc = self.dispatcher.allocator(session)
        self._pending_resizes(session)
        pending = {i: (self.resize_from[i], w) for i, w in self.resize_to.items()
                   if i in self.resize_from}  # fmt: skip
        reserve_resized(alloc, pending)
        return alloc

    def _pending_resizes(self, session: Session) -> None:
        """The resizes under way, from the database (``attempt.resize_to``): each job
        whose latest attempt a resize checkpointed, still running (checkpointing) or
        queued to start again. A daemon restarted meanwhile knows them too."""
        rows = session.exec(
            select(Attempt, Job)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(col(Attempt.resize_to).is_not(None))
            .where(col(Job.state).in_([JobState.QUEUED, JobState.PLANNED, JobState.RUNNING]))
        ).all()
        latest = dict(
            session.exec(
                select(Attempt.job_id, func.max(Attempt.number))
                .where(col(Attempt.job_id).in_([job.id for _, job in rows]))
                .group_by(col(Attempt.job_id))
            ).all()
        ) if rows else {}  # fmt: skip
        self.resize_to, self.resize_from = {}, {}
        for att, job in rows:
            if att.number != latest.get(job.id):
                continue  # it has started again since
            self.resize_to[job.id] = att.resize_to
            if att.state == AttemptState.RUNNING:
                self.resize_from[job.id] = ("attempt", att.id)

    def _restart_resized(self, scheduler: Scheduler, running: set[int], now_s: float) -> None:
        """Resized jobs that have left their GPUs start again now, on their new width; so
        do jobs moved to share a GPU (``daemon.energy.moves``), on one."""
        for job_id in [i for i in self.resize_to if i not in self.eligible and i not in running]:
            del self.resize_to[job_id]  # cancelled, failed or ended meanwhile
            self.resize_from.pop(job_id, None)
        pin_resized(scheduler, self.resize_to, now_s)
        sharing = getattr(self.dispatcher, "sharing", None)
        if sharing is not None and sharing.booked:  # moved to share a GPU: restart at once
            pin_resized(scheduler, dict.fromkeys(sharing.booked, 1), now_s)

    def _elastic(self, run: Running, job: Job, att: Attempt, now_s: float) -> Running:
        """A running job as the resize step sees it: its range, its run time left at its
        widest (as planned), its width now and expected end; one running a planned piece
        (it keeps its plan) or on a batch node is not resized."""
        width = width_of_attempt(att)
        if self.alloc is None or run.remaining_s is None or att.parts:
            return replace(run, gpus=width)  # a job across servers is not resized
        node = next((n for n in self.dispatcher.nodes if n.name == att.node), None)
        batch = node is None or node.executor == "slurm"
        widest = min(job.gpus_max, self.alloc.max_node_gpus)
        lab_s = self.planner.checkpoint_s if self.planner is not None else DEFAULT_CHECKPOINT_S
        own_s = job.checkpoint_s
        view = replace(run.job, gpus=widest, min_gpus=min(job.gpus_min, widest), max_gpus=widest,
                       checkpoint_s=lab_s if own_s is None else own_s)  # fmt: skip
        end_s = now_s + run_s(view, run.remaining_s, width) if width else None
        capped = att.cap is not None and att.cap < 1.0  # its plan chose a power cap
        cancelling = job.cancel_requested_at is not None  # it is on its way out
        elastic = not batch and att.planned_until is None and not capped and not cancelling
        return replace(run, job=view, gpus=width, end_s=end_s, elastic=elastic)

    def cluster(self, now_s: float) -> tuple:
        """For backfill: this pass's allocator and each running attempt's expected end,
        as far as reservations may trust it (``backfill.running_end_s``): by --duration or
        history, shortened (never lengthened) by its own progress reports, unknown past
        its estimate or without one; one told to checkpoint leaves within its grace."""
        now = self._at(now_s)
        ends: dict = {}
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(Attempt.state == AttemptState.RUNNING)
            ).all()
            for att, job in rows:
                est = self.known.get(job.id)
                source = "duration" if job.duration_s else est and est.source
                run_s = job.duration_s or (est.run_s if est else None)
                leaves = None
                if att.suspend_sent_at is not None:
                    leaves = att.suspend_sent_at.timestamp() + self.suspender.kill_after_s(
                        att.id, job.checkpoint_s, job.reason
                    )  # a move's grace is its checkpoint's cost: it may leave that late
                reported = None
                if est is not None and est.source == "progress":
                    reported = remaining_run_s(session, job, now, est.run_s)
                atts = session.exec(select(Attempt).where(Attempt.job_id == job.id)).all()
                ran = ran_s(list(atts), now)
                ends[("attempt", att.id)] = running_end_s(
                    now_s, run_s, source, ran, reported, leaves
                )
        if (sharing := getattr(self.dispatcher, "sharing", None)) is not None:  # both ends
            ends = pair_ends(ends, sharing.paired())
        return self.alloc, ends

    # -- co-location (``daemon.energy.sharing``) ---------------------------------------
    def _shared(self, job, width: int, now_s: float):
        """The node and GPU a ``--share`` job should share, never on a server that does
        not answer; None: it is placed as usual."""
        sharing = getattr(self.dispatcher, "sharing", None)
        if sharing is None:
            return None
        return sharing.place(job, width, now_s, self.dispatcher.executor.unreachable_nodes())

    def _not_paired(self, movable: dict) -> dict:
        """The deadline guard's candidates less the attempts sharing their GPU."""
        sharing = getattr(self.dispatcher, "sharing", None)
        return movable if sharing is None else movable_alone(movable, sharing.paired())


def elastic_rate(job: Job, alloc: ClusterAllocator):
    """An elastic job's speed on n GPUs as a share of its widest's (the run time left
    counts each attempt's time at its width)."""
    return width_rate(min(job.gpus_max, alloc.max_node_gpus))
