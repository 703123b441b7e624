"""The site power limit in what-if runs: admission at launch, then caps (PowerGrad).

What counts is the site's modelled draw: the jobs' (GPUs at their cap, the host's share,
× PUE: the power segments the simulated executor records) and the idle draw (idle GPUs at
their idle draw and the idle servers' share, × PUE: ``sim.hardware.power``), the measure
``peak_power_kw`` reports. A limit below the cluster's idle draw (every server on, nothing
running) cannot hold and is refused, as the daemon refuses one below its GPUs' lowest
limits. A job starts only when every running job and it, each at its lowest cap, and the
idle draw fit the limit (else it waits for an end); at its
launch the running jobs' caps are lowered first and it starts under its own share; after
every pass the caps are split again (``planning.policies.powersplit``: by each job's
gradient, within each node, then across nodes), lowered before any is raised. A job
that does not fit the limit even alone at its lowest cap starts only when nothing else
runs (a run never deadlocks; ``limit_exceeded`` then says so). With right-sizing a node
off draws nothing and its wake-up is an admission (``wake_fits``: its idle draw beside the
running jobs at their lowest caps; else it stays off until an end frees power).

``peak_w``: the largest draw over power segments; ``site_peak_w``: a run's, idle included.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.planning.devices.rightsizing import ON
from orchestrator.planning.perfmodel import JobModel
from orchestrator.planning.pieces import piece_index
from orchestrator.planning.policies.powersplit import PowerJob, lowest_w, model_job, split_site


class SimSiteLimit:
    """The simulator's side of the site limit, over ``SimDaemon``'s running attempts."""

    def __init__(self, limit_w: float, executor, model_of: Callable[[int], JobModel],
                 power, name: str = "invalid power_limit_w") -> None:  # fmt: skip
        self.limit_w = float(limit_w)  # (``name``: what its errors call it, e.g. the flag)
        self.power = power  # sim.hardware.power.SimPower: the idle draw
        floor_w = sum(n.idle_w for n in power.nodes) * power.pue
        if floor_w > self.limit_w:
            raise SpecError(
                f"{name}: {self.limit_w:.10g} W is less than the cluster's "
                f"idle draw ({floor_w:.0f} W: every server on, nothing running), so it cannot hold"
            )
        self.executor = executor
        self.model_of = model_of
        self.node_of: dict[int, str] = {}  # job id -> its (first) node
        self.pending: dict[int, PowerJob] = {}  # admitted this pass, not launched yet
        self._jobs: dict[tuple, PowerJob] = {}  # (job, node, GPUs, highest cap) -> as split
        self._lowest: tuple | None = None  # ((now, running attempts), their lowest draw)

    def _power_job(self, job_id: int, gpus: int, highest: float = 1.0,
                   model: JobModel | None = None) -> PowerJob:  # fmt: skip
        node = self.node_of.get(job_id, "")  # (a node has one GPU type: one model there)
        key = (job_id, node, gpus, highest)
        job = self._jobs.get(key)
        if job is None:  # kept: its draw and speed at each cap are remembered
            model = model or self.model_of(job_id)
            job = self._jobs[key] = model_job(job_id, node, model, gpus, highest)
        return job

    def _running(self, running: dict, now_s: float) -> list[PowerJob]:
        out = []
        for att in running.values():
            planned = att.decision.piece_config(piece_index(att.decision, now_s))[1]
            out.append(self._power_job(att.job.id, att.gpus, planned))
        return out

    def admits(self, job_id: int, gpus: int, node: str, model: JobModel, running: dict,
               now_s: float) -> bool:  # fmt: skip
        """Whether the job, on ``gpus`` GPUs of ``node`` (``model``: its model there), may
        start now (every job at its lowest cap fits); admitted jobs count until launched."""
        self.node_of[job_id] = node
        new = self._power_job(job_id, gpus, model=model)
        key = (now_s, tuple(running))  # the running jobs' lowest draw, once per pass
        if self._lowest is None or self._lowest[0] != key:
            self._lowest = (key, lowest_w(self._running(running, now_s)))
        others_w = self._lowest[1] + lowest_w(list(self.pending.values())) + self.idle_w()
        if not (running or self.pending) or others_w + lowest_w([new]) <= self.limit_w + 1e-6:
            self.pending[job_id] = new
            return True
        return False

    def wake_fits(self, extra_w: float, now_s: float) -> bool:
        """Whether a node's wake-up (``extra_w``: its idle draw, × PUE) fits beside every
        running and admitted job at its lowest cap and the idle draw: a wake is an
        admission (with nothing running it always fits: the limit holds every server idle)."""
        running = self.power.daemon._running
        jobs = [*self._running(running, now_s), *self.pending.values()]
        return lowest_w(jobs) + self.idle_w() + extra_w <= self.limit_w + 1e-6

    def launch_cap(self, job_id: int, gpus: int, planned_cap: float, model: JobModel,
                   running: dict, now_s: float) -> float:  # fmt: skip
        """The cap the job starts under: its share of a split with it; the running jobs'
        caps the split lowers are lowered first (none is raised here)."""
        self.pending.pop(job_id, None)
        new = self._power_job(job_id, gpus, planned_cap, model)
        caps = self._split([*self._running(running, now_s), new], running, lower_only=True)
        return min(planned_cap, caps[job_id])

    def split(self, running: dict, now_s: float) -> None:
        """After a pass: every running job's cap by the split, lowered before raised."""
        self.pending.clear()
        if len(self._jobs) > 4 * len(running) + 1000:  # the jobs that left
            ids = {a.job.id for a in running.values()}
            self._jobs = {k: j for k, j in self._jobs.items() if k[0] in ids}
        self._split(self._running(running, now_s), running, lower_only=False)

    def _split(self, jobs: list[PowerJob], running: dict, lower_only: bool) -> dict:
        caps, _ = split_site(jobs, self.limit_w, self.idle_w())
        by_job = {a.job.id: a for a in running.values()}
        moves = []
        for job in jobs:
            att = by_job.get(job.key)
            current = self.executor.cap_of(att.handle) if att is not None else None
            if current is not None and abs(current[0] - caps[job.key]) > 1e-9:
                moves.append((caps[job.key] - current[0], att, caps[job.key]))
        for delta, att, cap in sorted(moves, key=lambda m: m[0]):  # decreases first
            if delta > 0 and lower_only:
                break
            self.executor.set_power_cap(att.handle, cap)
            att.power_w = self.executor.cap_of(att.handle)[1]
        return caps

    def idle_w(self) -> float:
        """The idle draw now (× PUE): the free GPUs' and the idle servers' share (GPUs an
        admitted job holds are not free); a node off draws nothing, one waking all."""
        power = self.power
        if power._uniform_w is not None:
            return power._uniform_w * power.daemon.alloc.free_gpus * power.pue
        free = power.daemon.alloc.free_per_node()
        watts = 0.0
        for i, n in enumerate(power.nodes):
            watts += n.idle_w * free[i] / n.gpus if n.state == ON else power._node_w[i]
        return watts * power.pue


def site_peak_w(run) -> float:
    """The largest draw of a run (a ``RunResult``): its jobs' and its idle draw."""
    idle = run.idle
    if idle is None:
        return peak_w(run.seg_start_s, run.seg_end_s, run.seg_power_w)
    return peak_w(
        np.concatenate((run.seg_start_s, idle.start_s)),
        np.concatenate((run.seg_end_s, idle.end_s)),
        np.concatenate((run.seg_power_w, idle.power_w)),
    )


def peak_w(seg_start_s: np.ndarray, seg_end_s: np.ndarray, seg_power_w: np.ndarray) -> float:
    """The largest total draw over a run's power segments (at a moment where one segment
    ends and another starts, the end counts first)."""
    if len(seg_start_s) == 0:
        return 0.0
    times = np.concatenate((seg_start_s, seg_end_s))
    steps = np.concatenate((seg_power_w, -seg_power_w))
    kind = np.concatenate((np.ones(len(seg_start_s)), np.zeros(len(seg_end_s))))  # ends first
    order = np.lexsort((kind, times))
    return float(max(0.0, np.cumsum(steps[order]).max()))
