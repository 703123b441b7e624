"""The planning problem on a grid of slots, shared by ``budget``, ``optimal`` and ``oracle``.

Time is cut into slots of ``slot_s`` on UTC boundaries (the grid's ``origin`` is the
boundary at or before ``now``, so slots fall on the signal's own intervals; the first slot
is partly past). Each job has a few configurations (GPU
count × power cap, from its performance model, kept only where no other one is at once
faster, more frugal and narrower) and may start at its release (now, or its arrival for a
clairvoyant planner) or at any later slot boundary from which its fastest configuration
still meets its latest finish. For every (job, configuration, start) the problem holds,
as (J, C, S) arrays, the start, end, GPUs, power, objective cost, grams of CO2e and
whether it meets the job's latest finish, so a policy compares options with array
operations. Capacity is a profile over slots: free GPUs and free watts after what is
already committed (running jobs, plans that stand); on a cluster of several GPU types,
also the free GPUs of each tier of types that jobs too wide for the smaller types need
(``policies.tiers``: ``room_for`` folds them into the free GPUs a job may count on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.planning.devices.idlecost import wait_cost
from orchestrator.planning.policies.base import QueuedJob, Snapshot
from orchestrator.planning.policies.tiers import Tiers

DEFAULT_GPU_W = 350.0  # facility draw per GPU of a job without a model (300 W + host)
CAP_STEP = 0.05
MAX_CONFIGS = 5  # per job: enough to shrink, cap and widen; few enough for the MILP
MAX_HORIZON_S = 14 * 86400.0
# Share of the expected arrivals' load kept free in later slots (the plan's room for jobs
# not yet submitted). Arrivals are planned in turn and the deadline guard suspends jobs to
# start an urgent one, so the plan need not hold room for all of it. On the benchmark's
# DE-LU sample (README, "Planner benchmark") 1.0 emitted 26 kg more than 0.5 and missed 2
# deadlines instead of 54 (the oracle misses 71); before the guard, 0 missed 479.
ARRIVAL_ROOM = 0.5


@dataclass(frozen=True, slots=True)
class Config:
    gpus: int
    cap: float
    run_s: float
    power_w: float

    @property
    def energy_j(self) -> float:
        return self.power_w * self.run_s


def widths(job: QueuedJob) -> list[int]:
    lo, hi = job.min_gpus or job.gpus, job.max_gpus or job.gpus
    powers = (1 << e for e in range(hi.bit_length()))  # 1, 2, 4, ... up to hi
    return sorted({lo, hi, job.gpus, *(p for p in powers if p >= lo)})


def full_power(job: QueuedJob) -> Config:
    """The job as submitted: its requested width, uncapped."""
    run = float(job.duration_s or 0.0)
    if job.model is None or run <= 0:
        return Config(job.gpus, 1.0, run, job.gpus * DEFAULT_GPU_W)
    return Config(job.gpus, 1.0, run, job.model.power_w(job.gpus, 1.0))


def job_configs(job: QueuedJob, max_configs: int = MAX_CONFIGS) -> list[Config]:
    """The job's Pareto configurations; the first is always its requested width at full
    power (what ``fifo`` runs, and what the deadline guard falls back to)."""
    run = float(job.duration_s or 0.0)
    model = job.model
    if model is None or run <= 0:
        return [Config(job.gpus, 1.0, run, job.gpus * DEFAULT_GPU_W)]
    table = tuple(sorted(model.throughput_table.items())) if model.throughput_table else None
    lo, hi = job.min_gpus or job.gpus, job.max_gpus or job.gpus
    power = model.host_w_per_gpu, model.pue, model.power_scale
    shape = _shapes(model.curve, job.gpus, lo, hi, model.efficiency, table, *power, max_configs)
    return [Config(n, f, run * factor, watts) for n, f, factor, watts in shape]


@lru_cache(maxsize=4096)
def _shapes(curve, gpus, lo, hi, efficiency, table, host_w, pue, power_scale, max_configs):
    """(GPUs, cap, run-time factor, watts) of the Pareto configurations of every job of
    this shape (they differ only in length)."""
    from orchestrator.planning.perfmodel import JobModel

    rates = dict(table) if table else None
    power = dict(host_w_per_gpu=host_w, pue=pue, power_scale=power_scale)
    model = JobModel(1.0, gpus, curve, efficiency=efficiency, throughput_table=rates, **power)
    caps = {1.0, round(curve.min_fraction, 3)}
    f = 1.0 - CAP_STEP
    while f > curve.min_fraction:
        caps.add(round(f, 3))
        f -= CAP_STEP
    ref_rate = model.throughput(gpus, 1.0)
    probe = QueuedJob(0, gpus, 0.0, min_gpus=lo, max_gpus=hi)
    every = [
        Config(n, f, ref_rate / model.throughput(n, f), model.power_w(n, f))
        for n in widths(probe)
        for f in sorted(caps, reverse=True)
    ]
    ref = every[[(c.gpus, c.cap) for c in every].index((gpus, 1.0))]
    kept = [ref] + [c for c in every if c is not ref and not _dominated(c, every)]
    if max_configs < 3:
        kept = [ref, min(kept, key=lambda c: c.energy_j)][:max_configs]
    elif len(kept) > max_configs:  # the reference, the most frugal, evenly between by speed
        rest = sorted(kept[1:], key=lambda c: c.run_s)
        frugal = min(rest, key=lambda c: c.energy_j)
        rest.remove(frugal)
        pick = np.linspace(0, len(rest) - 1, max_configs - 2).round().astype(int)
        kept = [ref, *[rest[i] for i in sorted(set(pick.tolist()))], frugal]
    return tuple((c.gpus, c.cap, c.run_s, c.power_w) for c in kept)


def _dominated(c: Config, every: list[Config]) -> bool:
    def beats(o: Config) -> bool:
        le = o.run_s <= c.run_s and o.energy_j <= c.energy_j and o.gpus <= c.gpus
        return le and (o.run_s < c.run_s or o.energy_j < c.energy_j or o.gpus < c.gpus)

    return any(o is not c and beats(o) for o in every)


def objective_series(snapshot: Snapshot, t0: float, t1: float):
    """The objective per joule over ``[t0, t1)`` as a StepSeries: g/J for ``carbon``,
    currency/J for ``cost``, and for ``mix:W`` W × carbon/mean + (1−W) × price/mean."""
    from grid.steps import StepSeries
    from orchestrator.errors import SpecError

    carbon = snapshot.forecast.window(snapshot.now_s, t0, t1)
    kind, _, arg = snapshot.objective.partition(":")
    if kind == "carbon":
        return carbon.with_values(carbon.values / J_PER_KWH)
    if snapshot.price is None:
        raise SpecError(f"objective {snapshot.objective!r} needs a price signal")
    price = snapshot.price.window(snapshot.now_s, t0, t1)
    if kind == "cost":
        return price.with_values(price.values / (J_PER_KWH * 1000))
    weight = float(arg) if arg else 0.5
    step = min(carbon.step_s, price.step_s)
    grid = np.arange(t0, t1 + step, step)
    c = carbon.value_at(grid)
    p = price.value_at(grid)
    mixed = weight * c / max(abs(c.mean()), 1e-9) + (1 - weight) * p / max(abs(p.mean()), 1e-9)
    return StepSeries(t0, step, mixed / J_PER_KWH)


class Problem:
    def __init__(
        self, snapshot: Snapshot, max_configs: int = MAX_CONFIGS, horizon_s: float | None = None
    ):
        self.snapshot = snap = snapshot
        self.now = now = snap.now_s
        self.slot = slot = snap.slot_s
        # the grid's origin: the UTC slot boundary at or before now, so that slots fall on
        # the signal's own intervals (an hourly or half-hourly signal's for slots dividing
        # them); the first slot is then partly past and nothing is planned before now
        self.origin = origin = math.floor(now / slot + 1e-9) * slot
        self.jobs = jobs = snap.jobs
        self.configs = [job_configs(j, max_configs) for j in jobs]
        n_jobs = len(jobs)
        self.release = np.array([j.release_s(now) for j in jobs], dtype=float)
        self.latest = np.array([j.latest_finish_s(snap.max_defer_s) for j in jobs], dtype=float)
        horizon = MAX_HORIZON_S if horizon_s is None else horizon_s
        last = float(self.latest.max()) if n_jobs else now + slot
        self.K = max(1, math.ceil((min(last, now + horizon) - origin) / slot))
        self.t = origin + np.arange(self.K + 1) * slot  # slot edges
        C = self.C = max((len(c) for c in self.configs), default=1)
        fastest = np.array([min(c.run_s for c in cs) for cs in self.configs])
        self.rk = np.floor((self.release - origin) / slot + 1e-9).astype(np.int64)
        lk = np.floor((self.latest - fastest - origin) / slot + 1e-9).astype(np.int64)
        self.lk = np.minimum(np.maximum(lk, self.rk), self.K - 1)
        S = self.S = int(max(1, (self.lk - self.rk).max() + 1)) if n_jobs else 1
        shape = (n_jobs, C, S)
        self.gpus = np.zeros((n_jobs, C), dtype=np.int64)
        self.power_w = np.zeros((n_jobs, C))
        self.run_s = np.full((n_jobs, C), np.inf)
        self.has = np.zeros((n_jobs, C), dtype=bool)
        for j, cs in enumerate(self.configs):
            for c, cfg in enumerate(cs):
                self.gpus[j, c], self.power_w[j, c] = cfg.gpus, cfg.power_w
                self.run_s[j, c], self.has[j, c] = cfg.run_s, True
        k = self.rk[:, None, None] + np.arange(S)[None, None, :]  # (J, 1, S)
        self.k = np.broadcast_to(k, shape)
        grid_start = origin + k * slot
        self.start = np.broadcast_to(np.maximum(grid_start, self.release[:, None, None]), shape)
        run = np.where(self.has, self.run_s, 0.0)[:, :, None]
        self.end = self.start + run
        in_window = (k <= self.lk[:, None, None]) & self.has[:, :, None]
        self.meets = in_window & (self.end <= self.latest[:, None, None] + 1e-6)
        self.exists = in_window | ((k == self.rk[:, None, None]) & self.has[:, :, None])
        t_end = float(np.max(self.end[self.exists])) if n_jobs else now + slot
        self.t_end = max(t_end, float(self.t[-1]))
        self.carbon = snap.forecast.window(now, now, self.t_end)
        self.obj = objective_series(snap, now, self.t_end)
        p = self.power_w[:, :, None]
        self._index: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._values: dict[tuple, tuple] = {}  # (series, its values) by (id, at)
        obj = self.cumulative(self.obj, "end") - self.cumulative(self.obj, "start")
        self.obj_cost = np.where(self.exists, np.multiply(p, obj, out=obj), np.inf)
        if snap.idle_w_per_gpu:  # a later start keeps the job's GPUs idle meanwhile
            idle_w = self.gpus[:, :, None] * snap.idle_w_per_gpu
            rel = self.release[:, None, None]
            self.obj_cost += wait_cost(self.obj, rel, self.start, idle_w, snap.idle_wait_s)
        carbon = self.cumulative(self.carbon, "end") - self.cumulative(self.carbon, "start")
        carbon_g = np.multiply(p, carbon, out=carbon)  # (in place: the same numbers)
        carbon_g /= J_PER_KWH
        self.carbon_g = np.where(self.exists, carbon_g, np.inf)
        self.slot_obj = self.per_slot(self.obj)  # per watt, per slot
        self.slot_carbon = self.per_slot(self.carbon) / J_PER_KWH
        self.free_gpus, self.free_w = self._capacity()
        self._cover_a, self._cover_b = self._covers()
        self.watt_limited = snap.power_limit_w is not None
        self._all_fit = np.ones((C, S), dtype=bool)  # (read only: shared by ``fits``)
        self._all_fit.flags.writeable = False
        self.memo: dict = {}  # answers a policy keeps between its passes over this problem

    def cumulative(self, series, at: str) -> np.ndarray:
        """``series.cumulative`` (the same numbers) at every option's ``at`` ("start" or
        "end"), the slot indices kept for every series on the same steps and the values
        for each series (a carbon budget's ``Periods`` reads the carbon's again; not to
        be written to)."""
        kept = self._values.get((id(series), at))
        if kept is not None and kept[0] is series:
            return kept[1]
        t = self.start if at == "start" else self.end
        key = (series.start_s, series.step_s, len(series.values), at)
        if key not in self._index:
            i = series.index(t)
            self._index[key] = (i, t - (series.start_s + i * series.step_s))
        i, offset = self._index[key]
        out = series.values[i]  # (v × offset + cum, in place: the same numbers)
        out *= offset
        out += series.cum[i]
        self._values[(id(series), at)] = (series, out)
        return out

    def per_slot(self, series) -> np.ndarray:
        """``series`` integrated over each slot at its mean from now on (the first slot,
        partly past, at the rate of its part still to come): a slot's price per watt."""
        a = np.maximum(self.t[:-1], self.now)
        b = self.t[1:]
        return series.integral(a, b) * self.slot / np.maximum(b - a, 1e-9)

    def slot_of(self, t_s) -> np.ndarray:
        """The index of the slot holding time ``t_s``."""
        return np.floor((np.asarray(t_s) - self.origin) / self.slot + 1e-9).astype(np.int64)

    # -- capacity -----------------------------------------------------------------------
    def slot_range(self, start_s: float, end_s: float) -> tuple[int, int]:
        a = math.floor((start_s - self.origin) / self.slot + 1e-9)  # (np.floor's numbers)
        b = math.ceil((end_s - self.origin) / self.slot - 1e-9)
        return max(a, 0), min(max(b, a + 1), self.K)

    def _capacity(self) -> tuple[np.ndarray, np.ndarray]:
        snap = self.snapshot
        total = np.inf if snap.total_gpus is None else float(snap.total_gpus)
        limit = np.inf if snap.power_limit_w is None else float(snap.power_limit_w)
        free_gpus = np.full(self.K, total)
        free_w = np.full(self.K, limit)
        self.reserved = np.zeros(self.K)
        if snap.expected_load > 0 and np.isfinite(total):
            # jobs still to come claim a growing share of later slots: none now, a share
            # of their expected load one deferral window ahead
            ahead = (self.t[:-1] - self.now) / max(snap.max_defer_s, self.slot)
            share = ARRIVAL_ROOM * min(snap.expected_load, 1.0)
            self.reserved = total * share * np.clip(ahead, 0.0, 1.0)
        # on a cluster of several GPU types, the free GPUs of each tier of types too
        self.tier = Tiers(snap.type_gpus, self.K)
        self.free_tiers = self.tier.free
        for c in snap.committed:
            a, b = self.slot_range(max(c.start_s, self.now), c.end_s)
            free_gpus[a:b] -= c.gpus
            free_w[a:b] -= c.power_w
            if self.tier:
                self.tier.take(self.free_tiers, c.gpus, a, b, c.gpu_type)
        return free_gpus, free_w

    def room_for(self, j: int, free_gpus: np.ndarray, tiers: np.ndarray) -> np.ndarray:
        """``free_gpus`` as job j may count on them: less where a tier of GPU types it
        needs (``tiers``: their free GPUs) has less room; ``free_gpus`` itself with one
        type."""
        if not self.tier:
            return free_gpus
        return self.tier.room_for(int(self.gpus[j].max()), free_gpus, tiers)

    def fits(self, j: int, free_gpus: np.ndarray, free_w: np.ndarray) -> np.ndarray:
        """(C, S): whether each option of job j finds its GPUs and watts in every slot it
        covers (the part beyond the horizon is not checked); all where every slot from
        its release has the GPUs (and watts) of its widest (most power hungry)."""
        g, w = free_gpus[self.rk[j] :], free_w[self.rk[j] :]
        watts = not self.watt_limited or (w.size and w.min() >= self.power_w[j].max() - 1e-6)
        if g.size and watts and g.min() >= self.gpus[j].max() - 1e-9:
            return self._all_fit
        bad = free_gpus[None, :] < self.gpus[j][:, None] - 1e-9
        if self.watt_limited:  # (with no power limit, every slot has the watts)
            bad |= free_w[None, :] < self.power_w[j][:, None] - 1e-6
        cs = np.zeros((self.C, self.K + 1), dtype=np.int64)
        np.cumsum(bad, axis=1, out=cs[:, 1:])
        flat = cs.ravel()
        return flat[self._cover_b[j]] == flat[self._cover_a[j]]

    def _covers(self) -> tuple[np.ndarray, np.ndarray]:
        """(J, C, S) flat indices into a (C, K + 1) array of the slot edges each option
        starts and ends its cover at (for ``fits``)."""
        k = self.k
        m = np.ceil((self.end - (self.origin + k * self.slot)) / self.slot - 1e-9)
        a = np.clip(k, 0, self.K)
        b = np.clip(k + np.maximum(m, 1).astype(np.int64), 0, self.K)
        rows = (self.K + 1) * np.arange(self.C)[None, :, None]
        return rows + a, rows + b

    def reserve(self, free_gpus, free_w, gpus: int, power_w: float, intervals,
                tiers: np.ndarray | None = None) -> None:  # fmt: skip
        """Take ``gpus`` and ``power_w`` (negative: give them back) over ``intervals``;
        given ``tiers``, from the tiers of GPU types a job of that width needs too."""
        for a_s, b_s in intervals:
            a, b = self.slot_range(a_s, b_s)
            free_gpus[a:b] -= gpus
            if free_w is not None:
                free_w[a:b] -= power_w
            if tiers is not None and self.tier:
                self.tier.take(tiers, gpus, a, b)
