"""How long a job will run, in this order: its ``--duration``; its own progress reports
once it runs (``GRIDSHIFT_PROGRESS_FILE``: the time it ran over the share it reported
done); earlier completed runs of its name (or, unnamed, of its labels and command) by
the same user, on its GPU model and width where there are some (a run at another width
scaled by the model's scaling; one under a power cap brought to full power by its GPU's
curve; CPU-only runs, of width 0, only for a CPU-only job and as they are); else the
lab's ``default_duration``. Whatever the run time's source, the power per GPU that its
user's earlier runs of its name measured on its GPU model (``calibration``) goes with it.
Another user's jobs never set a job's estimate: names are not owned.

A job's GPU model is the one it runs on (its attempt's), else the lab's (the model most
of the inventory's GPUs are). The daemon and ``plan`` look these up and hand them to the
planner (``planning.snapshot.RunEstimate``), which never reads the database."""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from sqlmodel import Session, col, func, select

from orchestrator.accounting.calibration import full_power
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.resize import width_rate
from orchestrator.planning.snapshot import RunEstimate
from orchestrator.queue.models import Attempt, Calibration, Gpu, Job
from orchestrator.timeparse import MAX_DURATION_S, format_duration

log = logging.getLogger(__name__)
HISTORY_RUNS = 5  # the latest completed runs an estimate is the median of
MIN_SHARE = 0.01  # a progress report under 1 % done says too little to extrapolate
NAMED_LOOKBACK = 50  # the latest completed runs of a name searched for its width
UNNAMED_LOOKBACK = 500  # completed unnamed jobs searched for the same labels and command


class Run(NamedTuple):
    """One earlier completed run: its width, its run time at full power, its GPU model."""

    width: int
    seconds: float
    gpu_model: str = ""


@dataclass
class History:
    """Earlier runs, looked up once per job key and kept until a job completes (or a
    completed one is cleaned): the daemon asks at every pass."""

    stamp: tuple | None = None
    runs: dict[tuple, list[Run]] = field(default_factory=dict)

    def lookup(self, session: Session, jobs: list[Job]) -> dict[tuple, list[Run]]:
        done = Job.state == "completed"
        stamp = tuple(
            session.exec(select(func.count(), func.max(Job.finished_at)).where(done)).one()
        )
        if stamp != self.stamp:
            self.stamp, self.runs = stamp, {}
        missing = [j for j in jobs if _key(j) not in self.runs]
        if missing:
            found = _history(session, missing)
            self.runs |= {_key(j): found.get(_key(j), []) for j in missing}
        return self.runs


def estimates(
    session: Session,
    jobs: list[Job],
    default_s: float,
    now: datetime,
    history: History | None = None,
) -> dict[int, RunEstimate]:
    """Each job's estimate (a few queries for all of them; fewer with a kept ``history``)."""
    out: dict[int, RunEstimate] = {}
    ran = _attempts(session, [j.id for j in jobs if j.attempts])
    lab = lab_gpu_model(session)
    models = {j.id: _model_of(ran.get(j.id, []), lab) for j in jobs}
    powers = _powers(session, jobs)
    unknown = [j for j in jobs if not j.duration_s]
    history = (history or History()).lookup(session, unknown) if unknown else {}
    for job in jobs:
        model = models[job.id]
        try:
            if job.duration_s:
                est = RunEstimate(job.duration_s, "duration", "from --duration")
            else:
                est = _from_progress(ran.get(job.id, []), now, job.gpus_max) or _from_history(
                    job, history, model
                )
            power_w = _power_of(powers, job, model)
        except (ArithmeticError, ValueError, TypeError, KeyError) as exc:
            # one job's records (its runs, its name's calibration) that cannot be
            # computed with make that job's estimate the default, for the daemon,
            # `plan`, `submit` and `show` alike: never an error for everyone
            log.warning("job %s: no run-time estimate from its records (%s)", job.id, exc)
            est, power_w = None, None
        if est is None:
            est = RunEstimate(default_s, "default", "by the lab default (default_duration)")
        # what a job reports is untrusted: 1 % done after a month must not make a
        # 100-month plan (the planner's horizon follows the jobs' ends)
        out[job.id] = RunEstimate(min(est.run_s, MAX_DURATION_S), est.source, est.note, power_w)
    return out


def lab_gpu_model(session: Session) -> str:
    """The GPU model most of the inventory's GPUs are ("" when none is known)."""
    rows = session.exec(select(Gpu.model, func.count()).group_by(Gpu.model)).all()
    counted = sorted(((-n, m) for m, n in rows if m and m != "unknown"))
    return counted[0][1] if counted else ""


def _model_of(atts: list[Attempt], lab: str) -> str:
    """The GPU model a job runs (or last ran) on, else the lab's."""
    return next((a.gpu_model for a in reversed(atts) if a.gpu_model), lab)


def describe(est: RunEstimate) -> str:
    """``run time 2h from 3 earlier runs``."""
    return f"run time {format_duration(est.run_s)} {est.note}"


def run_s(att: Attempt, now: datetime | None = None) -> float:
    """How long one attempt ran (a running one: to ``now``; a stopped one: to its stop)."""
    end = att.finished_at or att.stopped_at or (now if att.state == "running" else None)
    if att.started_at is None or end is None:
        return 0.0
    return max(0.0, (end - att.started_at).total_seconds())


def _attempts(session: Session, job_ids: list[int]) -> dict[int, list[Attempt]]:
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    if job_ids:
        query = select(Attempt).where(col(Attempt.job_id).in_(job_ids))
        for att in session.exec(query.order_by(col(Attempt.number))).all():
            by_job[att.job_id].append(att)
    return by_job


def _from_progress(atts: list[Attempt], now: datetime, widest: int = 0) -> RunEstimate | None:
    """Its whole run time (on ``widest`` GPUs; 0: the widest it ran on) from its latest
    report: the time it ran until the report over the share done. The planner takes what
    is left from the same report."""
    last = atts[-1] if atts else None
    if last is None or not last.progress_total or not last.progress_done:
        return None
    share = min(1.0, last.progress_done / last.progress_total)
    # each attempt's time at its width's speed (an elastic job ran narrower than its widest)
    rate = width_rate(widest or max((len(a.gpu_ids) for a in atts), default=0))

    def full_s(a: Attempt, until: datetime) -> float:
        return run_s(a, until) * (rate(len(a.gpu_ids)) if a.gpu_ids else 1.0)

    ran = sum(full_s(a, now) for a in atts[:-1]) + full_s(last, last.progress_at or now)
    if share < MIN_SHARE or ran <= 0:
        return None
    return RunEstimate(ran / share, "progress", f"from its progress ({share:.0%} done)")


def _key(job: Job) -> tuple:
    """Runs of one job: its user's of its name, or (unnamed) of its labels and command."""
    if job.name:
        return (job.uid, "name", job.name)
    return (job.uid, "same", tuple(job.labels), tuple(job.command))


def _history(session: Session, jobs: list[Job]) -> dict[tuple, list[Run]]:
    """The latest completed runs of each job's key, newest first."""
    named = sorted({(j.uid, j.name) for j in jobs if j.name})
    done = select(Job).where(Job.state == "completed").order_by(col(Job.id).desc())
    rows: list[Job] = []
    for uid, name in named:  # one query a name: a queue holds few, a history many runs
        mine = done.where(Job.uid == uid).where(Job.name == name)
        rows += session.exec(mine.limit(NAMED_LOOKBACK)).all()
    for uid in sorted({j.uid for j in jobs if not j.name}):
        mine = done.where(Job.uid == uid).where(col(Job.name).is_(None))
        rows += session.exec(mine.limit(UNNAMED_LOOKBACK)).all()
    ran = _attempts(session, [r.id for r in rows])
    out: dict[tuple, list[Run]] = defaultdict(list)
    for row in rows:
        atts = ran.get(row.id, [])
        # a run under a power cap took longer than it would at full power
        seconds = sum(run_s(a) / full_power(a)[0] for a in atts)
        if seconds > 0:
            width = len(row.gpu_ids) or row.gpus_max
            out[_key(row)].append(Run(width, seconds, _model_of(atts, "")))
    return out


def _from_history(job: Job, history: dict, model: str) -> RunEstimate | None:
    """The median of its latest runs on its GPU model (else on any) at its width; else
    of those at other widths, each scaled to its width by the model's scaling. CPU-only
    runs (width 0) and GPU runs are apart: neither says how long the other takes."""
    cpu = job.gpus_max < 1
    runs = [r for r in (Run(*x) for x in history.get(_key(job), [])) if (r.width < 1) == cpu]
    pool = [r for r in runs if r.gpu_model == model] or runs
    width = job.gpus_max
    same = [r for r in pool if r.width == width][:HISTORY_RUNS]
    if same:
        n = len(same)
        on = _on(same, f"x{width}")
        return RunEstimate(
            statistics.median(r.seconds for r in same), "history", f"from {_runs(n)}{on}"
        )
    if not pool or cpu:
        return None
    used = pool[:HISTORY_RUNS]
    speedup = JobModel(1.0, 1, curve_for(model)).speedup
    scaled = [r.seconds * speedup(r.width) / speedup(width) for r in used]
    widths = ", ".join(f"x{w}" for w in sorted({r.width for r in used}))
    note = f"from {_runs(len(used))}{_on(used, widths)}, scaled to x{width}"
    return RunEstimate(statistics.median(scaled), "history", note)


def _on(runs: list[Run], widths: str) -> str:
    """`` on A100 x2`` (the GPU models of these runs, where known)."""
    models = sorted({r.gpu_model for r in runs if r.gpu_model})
    return f" on {' and '.join(models)} {widths}" if models else f" at {widths}"


def _runs(n: int) -> str:
    return f"{n} earlier run" + ("s" if n != 1 else "")


def _powers(session: Session, jobs: list[Job]) -> dict[tuple, float]:
    """The power per GPU each user's earlier runs of each name measured, by (uid, name,
    width, GPU model)."""
    names = sorted({j.name for j in jobs if j.name})
    uids = sorted({j.uid for j in jobs if j.name})
    if not names:
        return {}
    query = select(Calibration).where(col(Calibration.name).in_(names))
    rows = session.exec(query.where(col(Calibration.uid).in_(uids))).all()
    return {
        (r.uid, r.name, r.gpus, r.gpu_model): r.power_w_per_gpu for r in rows if r.power_w_per_gpu
    }


def _power_of(powers: dict[tuple, float], job: Job, model: str) -> float | None:
    """What its user's runs of its name drew per GPU on its GPU model: at its width, else
    at the nearest width; rows of an unknown model (learnt before models were recorded)
    after those. A CPU-only job draws no GPU power."""
    if not job.name or job.gpus_max < 1:
        return None
    mine = [(w, m) for u, n, w, m in powers if u == job.uid and n == job.name]
    for m in dict.fromkeys((model, "")):
        widths = sorted((abs(w - job.gpus_max), w) for w, mm in mine if mm == m)
        if widths:
            return powers[(job.uid, job.name, widths[0][1], m)]
    return None
