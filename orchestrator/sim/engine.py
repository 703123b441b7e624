"""One what-if run: the daemon's pass on simulated time.

``SimDaemon`` is the array-backed ``QueueState`` of the one pass both the daemon and the
simulator run (``orchestrator.planning.onepass``): the same named steps (suspend, reap,
admit, plan, launch, guard), ``Scheduler``, policy and ``ClusterAllocator`` as the live
daemon, on a ``SimulatedExecutor``. Only the bookkeeping differs: jobs live in arrays, not
in the database, so a trace of 100,000 jobs runs in seconds; and the event loop jumps to
what is due next instead of sleeping.

A job planned to run in intervals (``lowest-slots``, ``budget``, ``optimal``) is suspended
at the end of each but the last (SIGTERM: it checkpoints and leaves its GPUs; the event
loop sends it at the piece's end, before that time's pass) and requeued with the rest of
its plan; if it fell behind (it waited for GPUs), the policy plans its remaining work
again. Each attempt runs on the GPU count and power cap its plan says.

The deadline guard is the pass's (``onepass``: the planner's slack rule, at least four
slots of it); not under the oracle, which plans once and could not place the jobs it
moves again.

With a budget, a ledger charges what ran to its periods before every plan; with a site
power limit, a job starts only when it fits at the lowest caps, and running jobs' caps
are split under it at every launch and pass (``sim.sitelimit``). A clairvoyant policy
(``oracle``) plans the whole trace once, before the first arrival.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from executors.base import Handle, LaunchSpec
from executors.simulated import SimulatedExecutor, Workload
from orchestrator.planning.budgets import J_PER_KWH, Ledger
from orchestrator.planning.onepass import Pass, Running
from orchestrator.planning.pieces import held_pieces, piece_index, width_of
from orchestrator.planning.policies.base import (
    Decision,
    Policy,
    QueuedJob,
    Snapshot,
    recent_load,
)
from orchestrator.planning.resizestep import pin_resized
from orchestrator.planning.scheduler import Scheduler
from orchestrator.sim.elastic import Resizing, resizes
from orchestrator.sim.events import EventLoop
from orchestrator.sim.hardware.devices import Devices
from orchestrator.sim.hardware.power import SimPower
from orchestrator.sim.inputs import SimInputs
from orchestrator.sim.result import RunResult
from orchestrator.sim.sitelimit import SimSiteLimit
from placement.cluster import ClusterAllocator

SAMPLE_S = 900.0  # fragmentation is sampled at most this often (simulated seconds)
PROGRESS_EVERY = 2000  # ticks between progress reports


@dataclass(slots=True)
class _Attempt:
    job: QueuedJob
    key: tuple
    handle: Handle
    decision: Decision
    suspend_event: object | None
    gpus: int
    power_w: float
    end_s: float  # expected
    start_s: float = 0.0


class SimDaemon(Resizing, Devices):
    def __init__(
        self,
        inputs: SimInputs,
        policy: Policy,
        forecaster,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.inputs = inputs
        self.policy = policy
        jobs = inputs.jobs
        self.n = len(jobs)
        self.loop = EventLoop(float(jobs.submit_s[0]))
        self.executor = SimulatedExecutor(self.loop)
        self.alloc = ClusterAllocator(inputs.topology)
        self._init_devices(inputs)
        self.scheduler = Scheduler(
            policy, forecaster, inputs.max_defer_s, self._context,
            self._ahead if inputs.jobs.after is not None else None, inputs.backfill,
        )  # fmt: skip
        self.ledger = None
        if inputs.budget is not None:  # a whole-run budget is paced to the last arrival
            self.ledger = Ledger(inputs.budget, arrivals_end_s=float(jobs.submit_s.max()))
        self._price = None
        if inputs.price is not None:
            from grid.forecasters import StepForecaster

            self._price = StepForecaster(inputs.price)
        self.clairvoyant = getattr(policy, "clairvoyant", False)
        self._oracle: dict[int, Decision] = {}
        self._seg_seen = 0
        self.forced = 0
        self.forecast_label = getattr(forecaster, "label", "perfect")
        self.progress = progress
        self.first_start = np.full(self.n, np.nan)
        self.finish = np.full(self.n, np.nan)
        self.done = np.zeros(self.n)  # share of each job's work done
        self._submit = jobs.submit_s.tolist()
        self._duration = jobs.duration_s.tolist()
        self._gpus = jobs.gpus.tolist()
        self._min_gpus = (inputs.min_gpus if inputs.min_gpus is not None else jobs.gpus).tolist()
        self._max_gpus = (inputs.max_gpus if inputs.max_gpus is not None else jobs.gpus).tolist()
        self._tables = inputs.tables or [None] * self.n
        run_s = np.minimum(jobs.duration_s, inputs.max_defer_s)  # at most the load's window
        self._gpu_s_cum = np.concatenate(([0.0], np.cumsum(jobs.gpus * run_s)))
        self._load_from = 0
        self._priority = jobs.priority.tolist()
        self._deadline = [None if np.isnan(d) else float(d) for d in inputs.deadline_s]
        self._interruptible = inputs.interruptible.tolist()
        self._next = 0
        self._after = jobs.after  # per job, the jobs it waits for (None: no waits)
        self._held: list[int] = []  # arrived, waiting for a dependency to end
        self._attempt_id = 0
        self._running: dict[int, _Attempt] = {}
        self._wakes: set[float] = set()
        self._next_sample = -np.inf
        self._frag: list[float] = []
        self.suspensions = 0
        self.ticks = 0
        self.slot_s, self.max_defer_s = inputs.slot_s, inputs.max_defer_s
        after = [("sample", self._sample)]
        self.power = SimPower(self)  # idle power, right-sizing: after launch, each pass
        self.limit = None  # the site power limit (``sim.sitelimit``): admission, then caps
        if inputs.power_limit_w is not None:
            named = inputs.scenario.named("power_limit_w")  # the flag, if it gave the limit
            self.limit = SimSiteLimit(inputs.power_limit_w, self.executor, self._running_model,
                                      self.power, named)  # fmt: skip
            after.insert(0, ("split power", lambda now: self.limit.split(self._running, now)))
        after.insert(0, ("power", self.power.step))
        self._resize_to: dict[int, int] = {}  # resized jobs: the width each restarts on
        self._restarted: set[int] = set()  # jobs that checkpointed: each start costs
        resize = resizes(inputs) and not self.clairvoyant and self.limit is None
        self.onepass = Pass(self, guard=not self.clairvoyant, after=after, resize=resize)

    # -- the pass -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.ticks += 1
        self.onepass.tick(now)
        for at in self.onepass.wakes:  # each, as found: a joint planner replans on ticks
            self._wake(at)
        if self.progress is not None and self.ticks % PROGRESS_EVERY == 0:
            self.progress(now)

    # -- QueueState: the pass's steps on arrays --------------------------------------------
    def suspend_due(self, now: float) -> None:
        """Nothing to do: the event loop sent each ended piece its SIGTERM already."""

    def reap(self, now: float) -> None:
        for handle in self.executor.drain_ended():
            att = self._running.pop(handle.attempt_id)
            result = self.executor.poll(handle)
            done, _ = self.executor.progress(handle)
            self.executor.forget(handle.attempt_id)
            self.alloc.free(att.key)
            if att.suspend_event is not None:
                self.loop.cancel(att.suspend_event)
            i = att.job.id
            self.done[i] = done
            if result.detail == "checkpointed":
                self.suspensions += 1
                self._restarted.add(i)
                self._requeue(att, now)
            else:
                self.finish[i] = now

    def admit(self, now: float) -> None:
        jobs, i = [], self._next
        while i < self.n and self._submit[i] <= now:
            if self._after is not None and self._after[i]:
                self._held.append(i)  # queued when its dependencies have ended
            else:
                jobs.append(self._queued(i, self._duration[i]))
            i += 1
        self._next = i
        if self._held:
            jobs += self._released()
        if self.clairvoyant:
            for job in jobs:
                self.scheduler.add_planned(job, self._oracle.get(job.id) or Decision(now))
        elif jobs:
            self.scheduler.add(jobs)
        self._charge()

    def _released(self) -> list[QueuedJob]:
        """Held jobs whose dependencies have all ended, each planned from the last end."""
        out, held = [], []
        for i in self._held:
            ends = [self.finish[d] for d in self._after[i]]
            if any(np.isnan(e) for e in ends):
                held.append(i)
                continue
            job = self._queued(i, self._duration[i])
            job.earliest_s = float(max(ends))
            out.append(job)
        self._held = held
        return out

    def _ahead(self, now: float) -> tuple[list[QueuedJob], dict, dict]:
        """The held jobs, planned ahead by a joint replan (``Scheduler.ahead``) from their
        dependencies' planned ends, as the daemon plans them: the plans of the others
        leave room for them. They start only once their dependencies have ended."""
        if not self._held:
            return [], {}, {}
        held = [self._queued(i, self._duration[i]) for i in self._held]
        # a job running in pieces ends with its plan's last piece, not the current one
        ends = {a.job.id: max(c.end_s for c in held_pieces(a, now)) for a in self._running.values()}
        return held, {i: list(self._after[i]) for i in self._held}, ends

    def plan(self, now: float) -> Scheduler:
        if not self.clairvoyant:
            self.scheduler.plan(now)
            pin_resized(self.scheduler, self._resize_to, now)
        return self.scheduler

    def allocate(self, job: QueuedJob, decision: Decision, now: float):
        got = super().allocate(job, decision, now)  # on a type (``sim.hardware.devices``)
        if (
            got is not None
            and self.limit is not None
            and not self.limit.admits(
                job.id,
                width_of(job, decision, now),
                got.parts[0][0],
                self._placed_model(job.id, got),
                self._running,
                now,
            )
        ):  # over the site's power limit even at the lowest caps: it waits for an end
            self.alloc.free(("job", job.id))
            return None
        return got

    def make_room(self, width: int, movable: dict, gpu_type: str | None = None) -> list:
        if self.power.answers_in_time(width, gpu_type):
            return []  # a node woken answers in time: no job is suspended for it
        return self.alloc.make_room(width, movable, gpu_type) or []

    def cluster(self, now: float) -> tuple:  # backfill's: the allocator, each attempt's end
        return self.alloc, {a.key: a.end_s for a in self._running.values()}

    def checkpoint(self, run: Running, now: float) -> bool:
        return bool(self.executor.signal(run.ref.handle, signal.SIGTERM))

    def next_due_s(self, now: float) -> float | None:
        """The next arrival (piece ends and job ends are on the event loop itself)."""
        return self._submit[self._next] if self._next < self.n else None

    def _wake(self, at: float) -> None:
        if at not in self._wakes:
            self._wakes.add(at)
            self.loop.schedule(at)

    # -- parts --------------------------------------------------------------------------
    def _queued(self, i: int, remaining_s: float) -> QueuedJob:
        """Job ``i`` with ``remaining_s`` (at its traced width) left, at its widest."""
        return QueuedJob(
            id=i,
            gpus=self._max_gpus[i],
            submitted_s=self._submit[i],
            priority=self._priority[i],
            duration_s=self._at_width(i, remaining_s),
            deadline_s=self._deadline[i],
            interruptible=self._interruptible[i],
            min_gpus=self._min_gpus[i], max_gpus=self._max_gpus[i],
            model=self._model(i),
            checkpoint_s=self.inputs.checkpoint_s,
            gpu_type=self._wants[i],
        )  # fmt: skip

    def _context(self, now: float) -> dict:
        running = [c for a in self._running.values() for c in self._typed(held_pieces(a, now))]
        inp = self.inputs
        return {
            "expected_load": self._recent_load(now),
            **self.power.context(now, running),  # committed: running, and nodes off
            "total_gpus": self.alloc.total_gpus,
            "type_gpus": dict(self._per_type) if self._mixed else None,
            "budget": self.ledger.state(now) if self.ledger is not None else None,
            "price": self._price,
            "objective": inp.objective,
            "power_limit_w": inp.power_limit_w,
            "slot_s": inp.slot_s,
        }

    def _recent_load(self, now: float) -> float:
        """GPU time submitted over the last deferral window, as a share of the cluster's."""
        window = self.inputs.max_defer_s
        lo = self._load_from
        while lo < self._next and self._submit[lo] < now - window:
            lo += 1
        self._load_from = lo
        demand = self._gpu_s_cum[self._next] - self._gpu_s_cum[lo]
        return recent_load(demand, now, self._submit[0], window, self.alloc.total_gpus)

    def _charge(self) -> None:
        """Charge the power stretches recorded since the last pass to the ledger."""
        ex = self.executor
        if self.ledger is None:
            return
        for att in self._running.values():
            ex.progress(att.handle)  # closes each running stretch at now
        carbon = self.inputs.carbon
        for k in range(self._seg_seen, len(ex.seg_start)):
            self.ledger.record(ex.seg_start[k], ex.seg_end[k], ex.seg_power_w[k], carbon)
        self._seg_seen = len(ex.seg_start)

    def launch(self, job: QueuedJob, decision: Decision, allocation, now: float) -> None:
        i = job.id
        piece = piece_index(decision, now)
        cap = decision.piece_config(piece)[1]
        width = width_of(job, decision, now)
        model = self._placed_model(i, allocation)  # on the type it was given
        if self.limit is not None:  # running jobs' caps lowered first, its own share
            cap = self.limit.launch_cap(i, width, cap, model, self._running, now)
        self._resize_to.pop(i, None)
        if i in self._restarted:  # from a checkpoint: loses checkpoint_s (_requeue adds it)
            self.done[i] -= job.checkpoint_s * model.throughput(width, cap)  # may go below 0
        self._attempt_id = att_id = self._attempt_id + 1
        work = Workload(
            work=1.0,
            done=float(self.done[i]),
            rate=lambda f: model.throughput(width, f),
            power_w=lambda f: model.power_w(width, f),
            cap_fraction=cap,
        )
        self.executor.prepare(att_id, work)
        gpu_ids = [g for _, part in allocation.parts for g in part]
        spec = LaunchSpec(i, att_id, ["simulated"], "", {}, gpu_ids, "", "")
        handle = self.executor.launch(spec)
        if self.first_start[i] != self.first_start[i]:  # NaN: its first start
            self.first_start[i] = now
        end = now + (1.0 - float(self.done[i])) / work.rate(cap)
        if decision.forced:
            self.forced += 1
            if self.ledger is not None:
                signal = self.ledger.budget.measure(self.inputs.carbon)
                grams = work.power_w(cap) * float(signal.integral(now, end)) / J_PER_KWH
                self.ledger.note_forced(now, i, grams)
        event = None
        if decision.intervals and piece < len(decision.intervals) - 1:
            stop = decision.intervals[piece][1]
            if stop < end:
                event = self.loop.schedule(stop, lambda: self._suspend(att_id), priority=0)
                end = stop
        attempt = _Attempt(job, ("job", i), handle, decision, event, width, work.power_w(cap), end,
                           now)  # fmt: skip
        self._running[att_id] = attempt

    def _suspend(self, att_id: int) -> None:
        att = self._running.get(att_id)
        if att is not None:
            att.suspend_event = None
            self.executor.signal(att.handle, signal.SIGTERM)

    def _requeue(self, att: _Attempt, now: float) -> None:
        i = att.job.id
        job = self._queued(i, self._duration[i] * (1.0 - self.done[i]) + self.inputs.checkpoint_s)
        if self._restart_resized(job, now):
            return
        d = att.decision
        keep = [k for k, (a, _) in enumerate(d.intervals or ()) if a >= now - 1e-6]
        rest = tuple(d.intervals[k] for k in keep)
        # enough planned time left, at the rate of each piece's configuration?
        enough = (
            sum(
                (b - a) * self._model(i).throughput(*self._piece_rate_args(d, k, job))
                for k, (a, b) in zip(keep, rest, strict=True)
            )
            >= (1.0 - self.done[i]) - 1e-6
        )
        if rest and enough:
            configs = tuple(d.configs[k] for k in keep) if d.configs else None
            self.scheduler.add_planned(
                job, replace(d, start_s=rest[0][0], intervals=rest, configs=configs, forced=False)
            )
        elif self.clairvoyant:
            self.scheduler.add_planned(job, Decision(now, gpus=att.gpus))
        else:
            self.scheduler.add([job])  # fell behind: plan the rest again

    def _piece_rate_args(self, d: Decision, k: int, job: QueuedJob) -> tuple[int, float]:
        gpus, cap, _ = d.piece_config(k)
        return gpus or job.gpus, cap

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_S
        blocked, total = self.scheduler.blocked(), self.alloc.total_gpus
        wide = blocked is None or blocked.gpus > total  # nothing waits, or it never fits
        self._frag.append(0.0 if wide else self.alloc.fragmentation(blocked.gpus) / total)

    # -- run ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        solver = None
        if self.clairvoyant:
            solver = self._plan_whole_run()
        self.loop.schedule(self._submit[0])
        self.loop.run(after=self.tick)
        if np.isnan(self.finish).any():
            raise self._never_started(np.isnan(self.finish))
        ex = self.executor
        return RunResult(
            policy=self.policy.name,
            forecast=self.forecast_label,
            first_start_s=self.first_start,
            finish_s=self.finish,
            seg_start_s=np.asarray(ex.seg_start),
            seg_end_s=np.asarray(ex.seg_end),
            seg_power_w=np.asarray(ex.seg_power_w),
            seg_gpus=np.asarray(ex.seg_gpus, dtype=float),
            suspensions=self.suspensions,
            fragmentation=float(np.mean(self._frag)) if self._frag else 0.0,
            ticks=self.ticks,
            forced=self.forced,
            guard_suspensions=self.onepass.guard_suspensions,
            replans=self.scheduler.replans,
            ledger=self.ledger,
            solver=solver,
            idle=self.power.account(float(np.nanmax(self.finish))),
        )

    def _plan_whole_run(self) -> dict:
        """The clairvoyant policy's one plan: every job with its arrival, the actual
        signal, the empty cluster."""
        from grid.forecasters import StepForecaster

        first = self._submit[0]
        jobs = [self._queued(i, self._duration[i]) for i in range(self.n)]
        snapshot = Snapshot(first, jobs, StepForecaster(self.inputs.carbon))
        snapshot.max_defer_s = self.inputs.max_defer_s
        for key, value in self._context(first).items():
            setattr(snapshot, key, value)
        if self._price is not None:
            snapshot.price = self._price
        self._oracle = self.policy.plan(snapshot)
        return dict(getattr(self.policy, "last", {}) or {})
