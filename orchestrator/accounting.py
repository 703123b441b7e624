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
from orchestrator.budget import J_PER_KWH
from orchestrator.models import Attempt, Job, Usage

DAY_S = 86400.0
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
        self, carbon: Integral, price: Integral, modelled_power_w: Callable[[Attempt], float]
    ):
        self.carbon = carbon
        self.price = price
        self.modelled_power_w = modelled_power_w
        self._meters: dict[int, _Meter] = {}

    def measure(self, att: Attempt, now_s: float, end_s: float | None = None) -> Totals | None:
        """Bring the attempt's meter up to date (to ``end_s`` when it ended). None for an
        attempt with no GPUs or that has not started: there is nothing to account."""
        if not att.gpu_ids:
            return None
        run_dir = Path(att.run_dir)
        started = runfiles.read_json(run_dir / runfiles.JOB)
        if started is None:
            return None  # not started (yet): nothing ran
        meter = self._meters.setdefault(att.id, _Meter())
        log = run_dir / runfiles.POWER
        if log.exists():  # the monitor creates it before job.json where GPUs count energy
            samples, meter.offset = runfiles.read_power_log(log, meter.offset)
            for t, e in samples:
                if meter.last is not None and t > meter.last[0]:
                    self._stretch(meter, meter.last[0], t, max(0.0, e - meter.last[1]))
                meter.last = (t, e) if meter.last is None or t >= meter.last[0] else meter.last
            modelled = False
        else:
            start = datetime.fromisoformat(started["started_at"]).timestamp()
            t0 = meter.modelled_until_s or start
            t1 = end_s if end_s is not None else now_s
            if t1 > t0:
                self._stretch(meter, t0, t1, self.modelled_power_w(att) * (t1 - t0))
                meter.modelled_until_s = t1
            modelled = True
        energy = sum(v[0] for v in meter.days.values())
        carbon = sum(v[1] for v in meter.days.values()) if meter.carbon_known else None
        cost = sum(v[2] for v in meter.days.values()) if meter.cost_known else None
        return Totals(energy, carbon, cost, modelled)

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


def spent_g(session: Session, start: datetime, end: datetime) -> float:
    """Grams of CO2e accounted to UTC days in ``[start, end)``."""
    from sqlalchemy import func

    total = session.exec(
        select(func.sum(Usage.carbon_g)).where(col(Usage.day) >= start).where(col(Usage.day) < end)
    ).one()
    return float(total or 0.0)
