"""Accounting per attempt: energy, carbon and cost of what actually ran.

Energy comes from the attempt's power log (``executors.shim.PowerLog``: the GPUs' energy
counters sampled over the run); where its GPUs have no counter it is the model's (the
GPU type's power curve at the attempt's cap, times its GPUs and its time) and marked so.
Carbon is the integral of power × intensity over the run, stretch by stretch between
samples (each stretch's energy times the signal's mean over it), not one value taken at
the start; cost likewise from the price signal.

An attempt's figures are always recomputed from its whole log, never added to: a daemon
restarted after SIGKILL reads the log again from the start and writes the same totals, so
each run is counted once. They are kept per UTC day (``Usage``), which budgets (day, week,
month) and reports add up.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import Session, col, delete, select

from executors import runfiles
from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.queue.models import Attempt, Job, Usage

DAY_S = 86400.0
CLOCK_SLACK_S = 300.0  # a sample may be dated this far past the daemon's now (clock skew)
MAX_RUN_S = 366 * DAY_S  # an attempt's start as its own job.json says: at most this long ago
MAX_GPU_W = 3000.0  # no GPU draws more: energy above it between two samples is not believed
# Integral of a signal over [t0, t1] (value × seconds), or None where there is no signal.
Integral = Callable[[float, float], float | None]


@dataclass
class _Meter:
    offset: int = 0
    last: tuple[float, float] | None = None  # (t_s, joules since start)
    days: dict[float, list] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))
    carbon_known: bool = True
    cost_known: bool = True
    modelled_until_s: float | None = None
    power_w: float | None = None  # over the last stretch


@dataclass
class Totals:
    energy_j: float
    carbon_g: float | None
    cost: float | None
    modelled: bool


class Accountant:
    """Meters for the attempts one daemon watches."""

    def __init__(
        self, carbon: Integral, price: Integral, modelled_power_w: Callable[[Attempt], float],
        split: Callable[[Attempt], Callable[[float, float], float] | None] | None = None,
    ):  # fmt: skip
        self.carbon = carbon
        self.price = price
        self.modelled_power_w = modelled_power_w
        # co-location: the share of its GPU's energy an attempt is charged over [t0, t1)
        self.split = split
        self._meters: dict[object, _Meter] = {}  # attempt (or (attempt, part))

    def measure(self, att: Attempt, now_s: float, end_s: float | None = None) -> Totals | None:
        """Bring the attempt's meter up to date (to ``end_s`` when it ended). None for an
        attempt with no GPUs or that has not started: there is nothing to account.

        The run files are the job's to forge: sample times are clamped to the attempt's
        start .. ``now_s`` + ``CLOCK_SLACK_S`` (a sample dated far in the future cannot
        make the meter walk day by day up to it), energy to ``MAX_GPU_W`` per GPU
        between samples, and malformed lines are skipped (``runfiles.parse_power``)."""
        if getattr(att, "parts", None):  # a job across servers
            return self._measure_parts(att, now_s, end_s)
        return self._measure(att, att.id, att.run_dir, now_s, end_s)

    def _measure_parts(self, att: Attempt, now_s: float, end_s: float | None) -> Totals | None:
        """A job across servers: each part metered from its own run files (its local run
        directory ``part-<rank>``, its GPUs), and the attempt's meter their sum."""
        from executors.gang import part_dir

        total = _Meter()
        measured = []
        for rank, part in enumerate(att.parts or []):
            one = att.model_copy(update={"node": part["node"], "gpu_ids": part["gpu_ids"],
                                         "parts": None})  # fmt: skip
            totals = self._measure(one, (att.id, rank), part_dir(att.run_dir, rank), now_s, end_s)
            if totals is None:
                continue
            measured.append(totals)
            meter = self._meters[(att.id, rank)]
            for day, values in meter.days.items():
                total.days[day] = [a + b for a, b in zip(total.days[day], values, strict=True)]
            total.carbon_known &= meter.carbon_known
            total.cost_known &= meter.cost_known
            total.power_w = (total.power_w or 0.0) + (meter.power_w or 0.0)
        if not measured:
            return None
        self._meters[att.id] = total
        energy = sum(t.energy_j for t in measured)
        carbon = sum(v[1] for v in total.days.values()) if total.carbon_known else None
        cost = sum(v[2] for v in total.days.values()) if total.cost_known else None
        return Totals(energy, carbon, cost, any(t.modelled for t in measured))

    def _measure(
        self, att: Attempt, key: object, where: str, now_s: float, end_s: float | None
    ) -> Totals | None:
        if not att.gpu_ids:
            return None
        run_dir = Path(where)
        if not (run_dir / runfiles.JOB).exists():
            return None  # not started (yet): nothing ran
        try:
            started_at = runfiles.started_at(runfiles.read_json(run_dir / runfiles.JOB))
        except runfiles.BadRunFile:
            started_at = None  # there, but not believable: the daemon's own record counts
        meter = self._meters.setdefault(key, _Meter())
        lo_s, hi_s = self._bounds(att, started_at, now_s)
        max_w = MAX_GPU_W * len(att.gpu_ids)
        log = run_dir / runfiles.POWER
        part = self.split(att) if self.split is not None else None  # a shared GPU
        if log.exists():  # the monitor creates it before job.json where GPUs count energy
            while True:
                samples, offset = runfiles.read_power_log(log, meter.offset)
                for t, e in samples:
                    self._sample(meter, min(max(t, lo_s), hi_s), e, max_w, part)
                if offset == meter.offset:
                    break
                meter.offset = offset
            modelled = False
        else:
            t0 = meter.modelled_until_s or lo_s
            t1 = min(end_s if end_s is not None else now_s, hi_s)
            if t1 > t0:
                share = part(t0, t1) if part is not None else 1.0  # the GPU's, once
                self._stretch(meter, t0, t1, self.modelled_power_w(att) * (t1 - t0) * share)
                meter.modelled_until_s = t1
            modelled = True
        energy = sum(v[0] for v in meter.days.values())
        carbon = sum(v[1] for v in meter.days.values()) if meter.carbon_known else None
        cost = sum(v[2] for v in meter.days.values()) if meter.cost_known else None
        return Totals(energy, carbon, cost, modelled)

    @staticmethod
    def _bounds(att: Attempt, started_at: datetime | None, now_s: float) -> tuple[float, float]:
        """The times a sample of this attempt may carry: from its start (the daemon's
        record; the run's own ``job.json`` where the daemon has none, but not before
        ``MAX_RUN_S`` ago) to ``now_s`` + ``CLOCK_SLACK_S``."""
        hi_s = now_s + CLOCK_SLACK_S
        if att.started_at is not None:
            lo_s = att.started_at.timestamp()
        elif started_at is not None:
            lo_s = max(started_at.timestamp(), now_s - MAX_RUN_S)
        else:
            lo_s = now_s
        return min(lo_s, hi_s), hi_s

    def _sample(self, meter: _Meter, t: float, e: float, max_w: float, part=None) -> None:
        """One sample (cumulative joules at ``t``): the stretch since the last one. A
        sample not later than the last is skipped (its energy counts with the next one:
        the log is cumulative); energy above ``max_w`` over the stretch is not believed."""
        if meter.last is None:
            meter.last = (t, e)
            return
        t0, e0 = meter.last
        if t <= t0:
            return
        energy = min(max(0.0, e - e0), max_w * (t - t0))
        self._stretch(meter, t0, t, energy * (part(t0, t) if part is not None else 1.0))
        meter.last = (t, e0 + energy if e > e0 + energy else e)

    def _stretch(self, meter: _Meter, t0: float, t1: float, energy_j: float) -> None:
        """Charge ``energy_j`` drawn evenly over ``[t0, t1)``, cut at UTC midnights."""
        watts = meter.power_w = energy_j / (t1 - t0)
        a = t0
        while a < t1:
            b = min(t1, (math.floor(a / DAY_S) + 1) * DAY_S)
            day = meter.days[math.floor(a / DAY_S) * DAY_S]
            day[0] += watts * (b - a)
            carbon = self.carbon(a, b)
            if carbon is None:
                meter.carbon_known = False
            else:
                day[1] += watts * carbon / J_PER_KWH
            price = self.price(a, b)
            if price is None:
                meter.cost_known = False
            else:
                day[2] += watts * price / (J_PER_KWH * 1000)  # price per MWh
            a = b

    def write(self, session: Session, att: Attempt, totals: Totals, now: datetime) -> None:
        """Store the attempt's totals, its days and its job's totals (all recomputed)."""
        meter = self._meters[att.id]
        att.energy_j, att.carbon_g, att.cost = totals.energy_j, totals.carbon_g, totals.cost
        att.energy_modelled, att.accounted_until = totals.modelled, now
        session.add(att)
        session.exec(delete(Usage).where(col(Usage.attempt_id) == att.id))
        for day_s, (energy, carbon, cost) in sorted(meter.days.items()):
            session.add(
                Usage(
                    attempt_id=att.id,
                    day=datetime.fromtimestamp(day_s, UTC),
                    job_id=att.job_id,
                    energy_j=energy,
                    carbon_g=carbon if meter.carbon_known else 0.0,
                    cost=cost if meter.cost_known else None,
                )
            )
        session.flush()
        job_totals(session, att.job_id)

    def power_w(self, attempt_id: int) -> float | None:
        meter = self._meters.get(attempt_id)
        return None if meter is None else meter.power_w

    def forget(self, attempt_id: int) -> None:
        self._meters.pop(attempt_id, None)
        for key in [k for k in self._meters if isinstance(k, tuple) and k[0] == attempt_id]:
            del self._meters[key]


def job_totals(session: Session, job_id: int) -> None:
    """A job's energy, carbon and cost: the sums over its attempts."""
    atts = session.exec(select(Attempt).where(Attempt.job_id == job_id)).all()
    counted = [a for a in atts if a.energy_j is not None]
    job = session.get(Job, job_id)
    if not counted:
        return
    job.energy_j = sum(a.energy_j for a in counted)
    carbons = [a.carbon_g for a in counted]
    job.carbon_g = None if None in carbons else sum(carbons)
    costs = [a.cost for a in counted]
    job.cost = None if None in costs else sum(costs)
    job.energy_modelled = any(a.energy_modelled for a in counted)
    session.add(job)


def spent_g(session: Session, start: datetime, end: datetime, kind: str = "carbon") -> float:
    """Grams of CO2e accounted to UTC days in ``[start, end)``; for an energy budget
    (``kind="energy"``), watt-hours (a budget's units: ``planning.budgets``)."""
    from sqlalchemy import func

    column = Usage.carbon_g if kind == "carbon" else Usage.energy_j
    total = session.exec(
        select(func.sum(column)).where(col(Usage.day) >= start).where(col(Usage.day) < end)
    ).one()
    return float(total or 0.0) / (1.0 if kind == "carbon" else 3600.0)


def modelled_power(nodes: list, curve=None, site=None) -> Callable[[Attempt], float]:
    """GPU draw where no counter measures it: the GPU type's curve (the planner's, when
    one plans) at the attempt's cap, each GPU at most the limit a site power limit
    (``site``: ``daemon.energy.sitelimit.SiteLimit``) last set or read on it: a GPU draws
    no more than its limit, whatever its cap."""
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.queue.attempts import parts_of

    def power_w(att: Attempt) -> float:
        node = next((n for n in nodes if n.name == att.node), None)
        model = next((g.model for g in node.gpus), None) if node and node.gpus else None
        each_w = (curve or curve_for(model)).power_w(att.cap or 1.0)
        total = 0.0
        for part_node, gpus in parts_of(att):  # a job across servers: every part's GPUs
            for index in gpus:
                limit_w = _limit_w(site, part_node, index)
                total += each_w if limit_w is None else min(each_w, limit_w)
        return total

    return power_w


def _limit_w(site, node: str, index: int) -> float | None:
    """The limit the site power limit last set or read on that GPU (None: none known)."""
    if site is None:
        return None
    caps = site.caps.by_node.get(node)
    limit_w = site.last.get((id(caps), index)) if caps is not None else None
    return float(limit_w) if limit_w is not None and limit_w > 0 else None
