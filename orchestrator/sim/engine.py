"""One what-if run: the daemon's pass, ``tick(now)``, on simulated time.

``SimDaemon.tick`` has the live daemon's parts: reap what ended (recording progress of
suspended jobs), admit arrivals to the queue, plan with the policy, and launch what is due
through buddy placement, all with the same ``Scheduler``, policy and ``ClusterAllocator``
the live daemon uses, on a ``SimulatedExecutor``. Only the bookkeeping differs: jobs live
in arrays, not in the database, so a trace of 100,000 jobs runs in seconds.

A job planned to run in intervals (``lowest-slots``) is suspended at the end of each
(SIGTERM: it checkpoints and leaves its GPUs) and requeued with the rest of its plan; if it
fell behind (it waited for GPUs), the policy plans its remaining work again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from executors.base import Handle, LaunchSpec
from executors.simulated import SimulatedExecutor, Workload
from orchestrator.perfmodel import JobModel
from orchestrator.policies.base import Decision, Policy, QueuedJob
from orchestrator.scheduler import Scheduler
from orchestrator.sim.events import EventLoop
from orchestrator.sim.inputs import SimInputs
from placement.cluster import ClusterAllocator

SAMPLE_S = 900.0  # fragmentation is sampled at most this often (simulated seconds)
PROGRESS_EVERY = 2000  # ticks between progress reports


@dataclass
class RunResult:
    policy: str
    forecast: str
    first_start_s: np.ndarray
    finish_s: np.ndarray
    seg_start_s: np.ndarray
    seg_end_s: np.ndarray
    seg_power_w: np.ndarray
    seg_gpus: np.ndarray
    suspensions: int
    fragmentation: float  # mean share of the cluster free but unusable by a waiting job
    wall_s: float
    ticks: int


@dataclass(slots=True)
class _Attempt:
    job: QueuedJob
    key: tuple
    handle: Handle
    decision: Decision
    suspend_event: object | None


class SimDaemon:
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
        self.scheduler = Scheduler(policy, forecaster, inputs.max_defer_s)
        self.forecast_label = getattr(forecaster, "label", "perfect")
        self.progress = progress
        self.first_start = np.full(self.n, np.nan)
        self.finish = np.full(self.n, np.nan)
        self.done = np.zeros(self.n)  # share of each job's work done
        self._submit = jobs.submit_s.tolist()
        self._duration = jobs.duration_s.tolist()
        self._gpus = jobs.gpus.tolist()
        self._priority = jobs.priority.tolist()
        self._deadline = [None if np.isnan(d) else float(d) for d in inputs.deadline_s]
        self._interruptible = inputs.interruptible.tolist()
        self._next = 0
        self._arrival_wake = -1
        self._attempt_id = 0
        self._running: dict[int, _Attempt] = {}
        self._models: dict[int, JobModel] = {}
        self._wakes: set[float] = set()
        self._next_sample = -np.inf
        self._frag: list[float] = []
        self.suspensions = 0
        self.ticks = 0

    # -- the pass -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.ticks += 1
        self.reap(now)
        self.admit(now)
        self.scheduler.plan(now)
        self.launch_due(now)
        self._sample(now)
        wake = self.scheduler.next_start_s()
        if wake is not None and wake > now and wake not in self._wakes:
            self._wakes.add(wake)
            self.loop.schedule(wake)
        if self.progress is not None and self.ticks % PROGRESS_EVERY == 0:
            self.progress(now)

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
                self._requeue(att, now)
            else:
                self.finish[i] = now

    def admit(self, now: float) -> None:
        jobs, i = [], self._next
        while i < self.n and self._submit[i] <= now:
            jobs.append(self._queued(i, self._duration[i]))
            i += 1
        self._next = i
        if jobs:
            self.scheduler.add(jobs)
        if i < self.n and self._arrival_wake != i:
            self._arrival_wake = i  # one wake-up per arrival, however many ticks pass
            self.loop.schedule(self._submit[i])

    def launch_due(self, now: float) -> None:
        for job, decision, allocation in self.scheduler.launchable(now, self._allocate):
            self._launch(job, decision, allocation, now)

    # -- parts --------------------------------------------------------------------------
    def _queued(self, i: int, remaining_s: float) -> QueuedJob:
        return QueuedJob(
            id=i,
            gpus=self._gpus[i],
            submitted_s=self._submit[i],
            priority=self._priority[i],
            duration_s=remaining_s,
            deadline_s=self._deadline[i],
            interruptible=self._interruptible[i],
        )

    def _allocate(self, job: QueuedJob):
        return self.alloc.allocate(("job", job.id), job.gpus)

    def _model(self, i: int) -> JobModel:
        model = self._models.get(i)
        if model is None:
            cfg = self.inputs.cluster
            model = JobModel(
                full_duration_s=self._duration[i],
                ref_gpus=self._gpus[i],
                curve=self.inputs.curve,
                host_w_per_gpu=cfg.host_w_per_gpu,
                pue=cfg.pue,
            )
            self._models[i] = model
        return model

    def _launch(self, job: QueuedJob, decision: Decision, allocation, now: float) -> None:
        i, width = job.id, job.gpus
        model = self._model(i)
        self._attempt_id += 1
        att_id = self._attempt_id
        self.executor.prepare(
            att_id,
            Workload(
                work=1.0,
                done=float(self.done[i]),
                rate=lambda f: model.throughput(width, f),
                power_w=lambda f: model.power_w(width, f),
            ),
        )
        gpus = [g for _, part in allocation.parts for g in part]
        spec = LaunchSpec(i, att_id, ["simulated"], "", {}, gpus, "", "")
        handle = self.executor.launch(spec)
        if self.first_start[i] != self.first_start[i]:  # NaN: its first start
            self.first_start[i] = now
        event = None
        if decision.intervals:
            end = next((b for _, b in decision.intervals if b > now), None)
            if end is not None:
                event = self.loop.schedule(end, lambda: self._suspend(att_id), priority=0)
        self._running[att_id] = _Attempt(job, ("job", i), handle, decision, event)

    def _suspend(self, att_id: int) -> None:
        att = self._running.get(att_id)
        if att is not None:
            att.suspend_event = None
            self.executor.signal(att.handle, signal.SIGTERM)

    def _requeue(self, att: _Attempt, now: float) -> None:
        i = att.job.id
        remaining = self._duration[i] * (1.0 - self.done[i])
        job = self._queued(i, remaining)
        rest = tuple((a, b) for a, b in (att.decision.intervals or ()) if a >= now)
        if rest and sum(b - a for a, b in rest) >= remaining - 1e-6:
            self.scheduler.add_planned(job, Decision(rest[0][0], rest))
        else:
            self.scheduler.add([job])  # fell behind: plan the rest again

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_S
        blocked = self.scheduler.blocked()
        total = self.alloc.total_gpus
        if blocked is None or blocked.gpus > total:
            self._frag.append(0.0)
        else:
            self._frag.append(self.alloc.fragmentation(blocked.gpus) / total)

    # -- run ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        started = time.perf_counter()
        self.loop.schedule(self._submit[0])
        self.loop.run(after=self.tick)
        unfinished = int(np.isnan(self.finish).sum())
        if unfinished:
            raise RuntimeError(f"{unfinished} jobs never finished under {self.policy.name}")
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
            wall_s=time.perf_counter() - started,
            ticks=self.ticks,
        )
