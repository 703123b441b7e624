"""Co-location on the live daemon (EaCO): two jobs on one GPU, both accounted.

A node shares GPUs only where its ``[[nodes]]`` table says ``share = "time-slice"`` (CUDA
time-slicing: two processes, one ``CUDA_VISIBLE_DEVICES``) or ``share = "mps"`` (the same,
through the node's CUDA MPS control daemon, which the lab runs: gridshift does not start
it). The default, ``"never"``, keeps one job per GPU; Slurm nodes never share (Slurm's
own GPU sharing, ``gres/shard`` or MPS, is Slurm's to configure). Only one user's jobs
pair on a GPU unless the node's (root-owned) config says ``share_users = "any"``, and
never two users' under MPS (it serves one user's processes).

A queued one-GPU job submitted with ``--share`` is placed on a GPU where exactly one
running one-GPU job that was itself submitted with ``--share`` runs (a job that did not
ask is never joined, whoever asks), when the interference model
(``planning.devices.interference``) predicts each keeps at least ``MIN_SPEED`` of its
speed, each still ends by its deadline (a job with a deadline and no ``--duration`` is not
paired), and the energy per unit of work falls. Among such GPUs, the pair with the highest
combined speed. A job's model is its name where that names one of Gavel's job types or
families (``--name "ResNet-50 (batch size 64)"``), else the mean job. The newcomer is not
power-capped: the GPU's cap is its partner's.

The same rule (``joins``) decides where a running job may move (``daemon.energy.moves``):
a moved job's host GPU is ``booked`` for it (nobody else joins it meanwhile) and it
restarts there, the one restart ``place`` puts next to another job, while that still runs
alone on a server that answers. A job told to checkpoint (or killed) is nobody's host.

Measured online, per attempt: a sharing job's progress reports give its rate alone and its
rate next to a partner; their ratio, clamped to [``FLOOR``, 1], is that attempt's
measured speed (``SpeedTracker``, ``Sharing.measured``; in memory, lost on a restart). The
reports are the job's own: they never change the model that places or charges other jobs
(one daemon-wide table keyed by users' ``--name`` would let one user's reports pair or
bill another's jobs).

Accounts: each attempt's power log samples the whole GPU, so while two attempts overlap
on it each is charged its share of the GPU's measured energy (``split_for``): in
proportion to its predicted speed next to the other (the two draw alike alone: one GPU,
one cap), by the fitted model, never by what a job reports about itself. Time either one
is stopped (``--suspend stop``) counts as the other alone (``sharesplit``). The parts sum
to what the GPU drew; where no counter measures it, to its modelled draw.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sqlmodel import col, select

from orchestrator.daemon.energy.pairs import after_split, partners
from orchestrator.daemon.energy.sharesplit import Span, fraction, stopped_within, stops_of
from orchestrator.planning.devices.gputypes import ANY, family_of, type_of
from orchestrator.planning.devices.interference import (
    FLOOR,
    MIN_SPEED,
    Interference,
    split,
    worth_sharing,
)
from orchestrator.planning.perfmodel import curve_for
from orchestrator.queue.attempts import AttemptState, ran_s
from orchestrator.queue.models import Attempt, AttemptEvent, Job

POLICIES = ("never", "time-slice", "mps")
_RUNNING = (AttemptState.RUNNING.value,)
_ON_GPU = (AttemptState.LAUNCHING.value, AttemptState.RUNNING.value, AttemptState.STOPPED.value)
log = logging.getLogger(__name__)


def kind_of(job: Job) -> str:
    """The job's Gavel job type or family, from its name; ``any``: the mean job."""
    name = (job.name or "").strip()
    return name if name and family_of(name) != ANY else ANY


@dataclass(frozen=True)
class Booking:
    """Where a job checkpointed to move restarts: next to ``host_attempt`` (of job
    ``host_job``) on GPU ``gpu`` of ``node``; ``attempt``: the one it left."""

    node: str
    gpu: int
    host_attempt: int
    host_job: int
    attempt: int


@dataclass
class Sharing:
    """Placement of ``--share`` jobs on GPUs already running one, and the energy split."""

    db: object  # orchestrator.queue.db.Database
    nodes: list  # orchestrator.nodes.inventory.ResolvedNode
    model: Interference = field(default_factory=Interference)
    claimed: dict[int, tuple[str, int, float]] = field(default_factory=dict)  # job -> GPU
    tracker: SpeedTracker = field(default_factory=lambda: SpeedTracker())
    measured: dict[int, float] = field(default_factory=dict)  # attempt -> speed paired
    measured_from: dict[int, float] = field(default_factory=dict)  # and since when (its rate's)
    # co-location moves (``daemon.energy.moves``; in memory: lost on a restart): each
    # moved job's GPU to restart on, and why it was checkpointed, for its requeue's reason
    booked: dict[int, Booking] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)

    @classmethod
    def for_nodes(cls, db, nodes: list) -> Sharing | None:
        """None when no node shares: then nothing is ever asked of it."""
        return cls(db, nodes) if any(_policy(n) != "never" for n in nodes) else None

    # -- placement ---------------------------------------------------------------------
    def place(
        self, job: Job | None, width: int, now_s: float, down: Collection[str] = ()
    ) -> tuple[str, list[int]] | None:
        """The node and GPU ``job`` should share, or None (it is placed as usual). Never
        on a server that does not answer (``down``), nor next to a job backfilled on the
        promise of giving its GPU back (the newcomer would keep it past that). A job moved
        to share (``booked``, ``daemon.energy.moves``) restarts next to its host while
        that still runs alone; otherwise as any restart."""
        self.claimed = {j: c for j, c in self.claimed.items() if c[2] == now_s}  # this pass
        if job is not None and job.id in self.booked:
            return self._restart_booked(job, width, now_s, down)
        if job is None or not job.share or width != 1 or job.attempts:
            return None  # a job restarting keeps its own GPU: its checkpoint is its own
        sharing = {n.name: n for n in self.nodes if _policy(n) != "never"}
        if not sharing:
            return None
        taken = {(node, gpu) for node, gpu, _ in self.claimed.values()} | self.booked_gpus()
        best, alone = None, self._alone(sharing)
        before = self.earlier_s([a for a, host in alone if host.deadline is not None])
        for att, host in alone:
            node = sharing.get(att.node)
            if node is None:
                continue
            speeds = self.joins(job, _left_s(job, None, now_s), att, host, node, now_s,
                                down, taken, before.get(att.id, 0.0))  # fmt: skip
            if speeds is not None and (best is None or sum(speeds) > best[0]):
                best = (sum(speeds), (att.node, att.gpu_ids[0]))
        if best is None:
            return None
        node, gpu = best[1]
        self.claimed[job.id] = (node, gpu, now_s)
        return node, [gpu]

    def joins(
        self, job, left_s: float | None, att: Attempt, host: Job, node, now_s: float,
        down: Collection[str] = (), taken: Collection = (), host_before_s: float = 0.0,
    ) -> tuple[float, float] | None:  # fmt: skip
        """The rule, for ``job`` (``left_s`` of its work left at full speed: None, unknown)
        joining ``host``'s attempt ``att``, alone on its GPU of ``node``: the two speeds
        the model predicts, or None where it may not. One user's jobs only unless the
        node's root-owned config says so; each keeps ``MIN_SPEED`` and ends by its
        deadline at its paired speed (at the GPU's cap; the host's work left by
        ``_left_s``, its earlier attempts' ``host_before_s`` counted); the energy per unit
        of work falls."""
        where = (att.node, att.gpu_ids[0])
        if where in taken or (host.uid != job.uid and not _across_users(node)):
            return None
        if att.node in down or getattr(att, "backfilled_until", None) is not None:
            return None
        gpu = type_of(node.model_of(att.gpu_ids)) or "v100"
        if getattr(job, "gpu_type", None) and job.gpu_type != gpu:
            return None  # it asked for another type
        speed_job, speed_host = self.model.speeds(kind_of(job), kind_of(host), gpu)
        if not worth_sharing(speed_job, speed_host, 1.0, 1.0, MIN_SPEED):
            return None
        rate = curve_for(node.model_of(att.gpu_ids)).throughput_fraction(att.cap or 1.0)
        if not (
            _in_time(job, left_s, speed_job * rate, now_s)
            and _in_time(
                host, _left_s(host, att, now_s, before_s=host_before_s), speed_host * rate, now_s
            )
        ):
            return None
        return speed_job, speed_host

    def earlier_s(self, atts: list[Attempt]) -> dict[int, float]:
        """Attempt id -> how long its job's earlier attempts ran (``attempts.ran_s``)."""
        if not atts:
            return {}
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt).where(col(Attempt.job_id).in_({a.job_id for a in atts}))
            ).all()
        return {
            a.id: ran_s([r for r in rows if r.job_id == a.job_id and r.number < a.number], None)
            for a in atts
        }

    def booked_gpus(self) -> set[tuple[str, int]]:
        """The GPUs moved jobs will restart on: nobody else joins them meanwhile."""
        return {(b.node, b.gpu) for b in self.booked.values()}

    def _restart_booked(self, job: Job, width: int, now_s: float, down) -> tuple | None:
        """A moved job restarts next to its host, if that still runs alone on the GPU and
        its server answers; the booking is spent either way."""
        booking = self.booked.pop(job.id)
        self.notes.pop(job.id, None)
        nodes = {n.name: n for n in self.nodes if _policy(n) != "never"}
        still = any(
            att.id == booking.host_attempt and att.gpu_ids == [booking.gpu]
            for att, _ in self._alone(nodes)
        )
        if width != 1 or not still or booking.node in down:
            log.info("job %s: restarts as usual (its host %s no longer runs alone on %s)",
                     job.id, booking.host_job, booking.node)  # fmt: skip
            return None
        self.claimed[job.id] = (booking.node, booking.gpu, now_s)
        return booking.node, [booking.gpu]

    def paired(self) -> dict[int, list[int]]:
        """Attempt id -> the others on its GPU, for every GPU two attempts hold."""
        with self.db.read() as session:
            return partners(session)

    def shares(self, job_id: int) -> bool:
        """Whether ``job_id`` was placed on a GPU another job runs on, in this pass."""
        return job_id in self.claimed

    def _alone(self, nodes: dict) -> list[tuple[Attempt, Job]]:
        """Running one-GPU attempts of ``--share`` jobs, alone on their GPU, on ``nodes``
        (not one leaving its GPU: told to checkpoint, stop or cancel, killed, or running a
        planned piece, which stops at its end; nor one split from its partner in its
        previous attempt: ``pairs.after_split``)."""
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(col(Attempt.state).in_(_ON_GPU), col(Attempt.node).in_(list(nodes)))
            ).all()
            split = after_split(session, [att for att, _ in rows])  # alone this time
        count: dict[tuple[str, int], int] = {}
        for att, _ in rows:
            for g in att.gpu_ids or ():
                count[(att.node, g)] = count.get((att.node, g), 0) + 1
        return [
            (att, job)
            for att, job in rows
            if att.state in _RUNNING and job.share and not att.parts
            and att.suspend_sent_at is None and att.kill_sent_at is None
            and att.term_sent_at is None and att.planned_until is None
            and job.cancel_requested_at is None and att.id not in split
            and len(att.gpu_ids or ()) == 1 and count[(att.node, att.gpu_ids[0])] == 1
        ]  # fmt: skip

    # -- accounts ------------------------------------------------------------------------
    def split_for(self, att: Attempt) -> Callable[[float, float], float] | None:
        """The share of its GPU's measured energy ``att`` is charged over ``[t0, t1)``
        (``sharesplit``: by the fitted model, cut at either one's stops); None when it
        never shared."""
        if not att.gpu_ids or len(att.gpu_ids) != 1 or att.started_at is None:
            return None
        start = att.started_at.timestamp()
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt, Job)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(
                    Attempt.node == att.node,
                    col(Attempt.id) != att.id,
                    col(Attempt.started_at).is_not(None),
                    col(Job.share).is_(True),
                )
                .where(
                    (col(Attempt.finished_at).is_(None))
                    | (col(Attempt.finished_at) > att.started_at)
                )
            ).all()
            mine = session.get(Job, att.job_id)
            rows = [(o, j) for o, j in rows if list(o.gpu_ids or ()) == list(att.gpu_ids)]
            stops = _stops(session, [att.id] + [o.id for o, _ in rows])
        if mine is None or not mine.share:
            return None
        node = next((n for n in self.nodes if n.name == att.node), None)
        gpu = type_of(node.model_of(att.gpu_ids) if node else None) or "v100"
        spans = []
        for other, job in rows:
            mine_speed, other_speed = self.model.speeds(kind_of(mine), kind_of(job), gpu)
            part, _ = split(1.0, 1.0, 1.0, mine_speed, other_speed)  # one GPU: alike draws
            end = other.finished_at.timestamp() if other.finished_at else float("inf")
            begin = max(start, other.started_at.timestamp())
            spans.append(Span(begin, end, part, kind_of(job), stops.get(other.id, ())))
        self._learn(att, spans, stops.get(att.id, ()))
        if not spans:
            return None
        return fraction(spans, stops.get(att.id, ()))

    def _learn(self, att: Attempt, spans: list[Span], my_stops: tuple = ()) -> None:
        """The attempt's measured speed next to its partner (its rate there over its rate
        alone, from its progress reports), kept for that attempt alone (``measured``; in
        memory: lost on a restart). The reports are the job's own (untrusted): they never
        change the model other jobs are placed or charged by, and the speed is clamped to
        [``FLOOR``, 1] (a job that crawls next to its partner is judged at its crawl: a split
        it causes is its own). A rate over a stretch where either one was stopped is not a
        speed: the tracker starts again after it."""
        done, total, at = att.progress_done, att.progress_total, att.progress_at
        if done is None or not total or at is None or not 0 <= done <= total:
            return
        t = at.timestamp()
        span = next((s for s in spans if s.start_s <= t < s.end_s), None)
        last = self.tracker.last.get(att.id)
        since = last[0] if last is not None else t
        stops = [my_stops, *(s.partner_stops for s in spans)]
        if any(stopped_within(st, since, t) for st in stops):
            self.tracker.last.pop(att.id, None)  # a stop in between: no rate across it
            self.tracker.sample(att.id, t, done / total, span.partner if span else None)
            return
        speed = self.tracker.sample(att.id, t, done / total, span.partner if span else None)
        if speed is not None and 0 < speed <= 1.5:
            self.measured[att.id] = min(1.0, max(FLOOR, speed))
            self.measured_from[att.id] = since  # next to the partner it had from then on


@dataclass
class SpeedTracker:
    """Each attempt's progress rate alone and next to a partner, from its reports."""

    last: dict[int, tuple[float, float, str | None]] = field(default_factory=dict)
    alone: dict[int, float] = field(default_factory=dict)  # attempt -> share of work per s

    def sample(self, attempt_id: int, t: float, fraction: float, partner: str | None):
        """Note a report (``fraction`` of the work done at ``t``, next to ``partner`` or
        alone); the relative speed next to ``partner`` once both rates are known."""
        last = self.last.get(attempt_id)
        if last is not None and t <= last[0]:
            return None  # the same report, or one dated back
        self.last[attempt_id] = (t, fraction, partner)
        if last is None or last[2] != partner or fraction < last[1]:
            return None  # a rate needs two reports in the same company
        rate = (fraction - last[1]) / (t - last[0])
        if partner is None:
            self.alone[attempt_id] = rate
            return None
        alone = self.alone.get(attempt_id)
        return rate / alone if alone and rate > 0 else None


def _stops(session, ids: list[int]) -> dict[int, tuple]:
    """Each attempt's stopped intervals, from its state moves."""
    rows = session.exec(
        select(AttemptEvent)
        .where(col(AttemptEvent.attempt_id).in_(ids))
        .order_by(col(AttemptEvent.at), col(AttemptEvent.id))
    ).all()
    out: dict[int, tuple] = {}
    for i in ids:
        moves = [(e.at.timestamp(), e.from_state, e.to_state) for e in rows if e.attempt_id == i]
        out[i] = stops_of(moves)
    return out


def _across_users(node) -> bool:
    """Whether two users' jobs may pair on ``node``: only where its config says
    ``share_users = "any"`` and it time-slices (a job's ``--name`` is its own claim: a
    misnamed job could slow another user's; MPS serves one user's processes)."""
    config = getattr(node, "config", None)
    return _policy(node) == "time-slice" and getattr(config, "share_users", "same") == "any"


def _policy(node) -> str:
    config = getattr(node, "config", None)
    if config is None or node.executor == "slurm":
        return "never"
    return getattr(config, "share", "never")


def _in_time(job: Job, left_s: float | None, speed: float, now_s: float) -> bool:
    """Whether ``job`` still ends by its deadline at ``speed`` with ``left_s`` of work left
    at full speed (no deadline: yes; a deadline and nobody knows what is left: no)."""
    if job.deadline is None:
        return True
    if left_s is None:
        return False  # nobody knows when it ends: not slowed
    return now_s + left_s / speed <= job.deadline.timestamp()


def _left_s(
    job: Job, att: Attempt | None, now_s: float, reports: bool = True, before_s: float = 0.0
) -> float | None:
    """The daemon's estimate of ``job``'s work left at full speed (None: it has no
    ``--duration``): all of it for a newcomer; for a running attempt, the share its last
    progress report leaves (a job over-reporting its progress risks only its own
    deadline; ``reports=False``: not read), else its duration less the time its attempts
    ran: this one and, ``before_s``, its earlier ones (``Sharing.earlier_s``: pieces,
    suspensions, moves; as ``attempts.remaining_run_s`` counts for the planner)."""
    if not job.duration_s:
        return None
    left = job.duration_s
    if reports and att is not None and att.progress_total and att.progress_done is not None:
        left = job.duration_s * (1.0 - min(1.0, max(0.0, att.progress_done / att.progress_total)))
    elif att is not None and att.started_at is not None:
        ran = before_s + max(0.0, now_s - att.started_at.timestamp())
        left = max(0.0, job.duration_s - ran)
    return left


def check_policy(value: str) -> str:
    if value not in POLICIES:
        raise ValueError(f"share must be one of {', '.join(POLICIES)}, not {value!r}")
    return value
