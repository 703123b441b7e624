"""How long a job will run, in this order: its ``--duration``; its own progress reports
once it runs (``GRIDSHIFT_PROGRESS_FILE``: the time it ran over the share it reported
done); earlier completed runs of its name (or, unnamed, of its labels and command), at
its width where there are some, with the power per GPU they measured (``calibration``);
else the lab's ``default_duration``. The daemon and ``plan`` look these up and hand them
to the planner (``planning.snapshot.RunEstimate``), which never reads the database."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, func, select

from orchestrator.planning.snapshot import RunEstimate
from orchestrator.queue.models import Attempt, Calibration, Job
from orchestrator.timeparse import MAX_DURATION_S, format_duration

HISTORY_RUNS = 5  # the latest completed runs an estimate is the median of
MIN_SHARE = 0.01  # a progress report under 1 % done says too little to extrapolate
NAMED_LOOKBACK = 50  # the latest completed runs of a name searched for its width
UNNAMED_LOOKBACK = 500  # completed unnamed jobs searched for the same labels and command


@dataclass
class History:
    """Earlier runs, looked up once per job key and kept until a job completes (or a
    completed one is cleaned): the daemon asks at every pass."""

    stamp: tuple | None = None
    runs: dict[tuple, list[tuple[int, float]]] = field(default_factory=dict)

    def lookup(self, session: Session, jobs: list[Job]) -> dict[tuple, list[tuple[int, float]]]:
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
    unknown = []
    for job in jobs:
        if job.duration_s:
            out[job.id] = RunEstimate(job.duration_s, "duration", "from --duration")
        else:
            unknown.append(job)
    if not unknown:
        return out
    ran = _attempts(session, [j.id for j in unknown if j.attempts])
    history = (history or History()).lookup(session, unknown)
    powers = _powers(session, unknown)
    for job in unknown:
        est = _from_progress(ran.get(job.id, []), now) or _from_history(job, history)
        if est is None:
            est = RunEstimate(default_s, "default", "by the lab default (default_duration)")
        power = powers.get((job.name, job.gpus_max))
        # what a job reports is untrusted: 1 % done after a month must not make a
        # 100-month plan (the planner's horizon follows the jobs' ends)
        power_w = power if power is not None else est.power_w_per_gpu
        est = RunEstimate(min(est.run_s, MAX_DURATION_S), est.source, est.note, power_w)
        out[job.id] = est
    return out


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


def _from_progress(atts: list[Attempt], now: datetime) -> RunEstimate | None:
    """Its whole run time from its latest report: the time it ran until the report over
    the share done. The planner takes what is left from the same report."""
    last = atts[-1] if atts else None
    if last is None or not last.progress_total or not last.progress_done:
        return None
    share = min(1.0, last.progress_done / last.progress_total)
    ran = sum(run_s(a, now) for a in atts[:-1]) + run_s(last, last.progress_at or now)
    if share < MIN_SHARE or ran <= 0:
        return None
    return RunEstimate(ran / share, "progress", f"from its progress ({share:.0%} done)")


def _key(job: Job) -> tuple:
    """Runs of one job: its name, or (unnamed) its labels and command."""
    return ("name", job.name) if job.name else ("same", tuple(job.labels), tuple(job.command))


def _history(session: Session, jobs: list[Job]) -> dict[tuple, list[tuple[int, float]]]:
    """(width, run time) of the latest completed runs of each job's key, newest first."""
    names = sorted({j.name for j in jobs if j.name})
    done = select(Job).where(Job.state == "completed").order_by(col(Job.id).desc())
    rows: list[Job] = []
    for name in names:  # one query a name: a queue holds few names, a history many runs
        rows += session.exec(done.where(Job.name == name).limit(NAMED_LOOKBACK)).all()
    if any(not j.name for j in jobs):
        rows += session.exec(done.where(col(Job.name).is_(None)).limit(UNNAMED_LOOKBACK)).all()
    ran = _attempts(session, [r.id for r in rows])
    out: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        seconds = sum(run_s(a) for a in ran.get(row.id, []))
        if seconds > 0:
            out[_key(row)].append((len(row.gpu_ids) or row.gpus_max, seconds))
    return out


def _from_history(job: Job, history: dict) -> RunEstimate | None:
    """The median of its latest runs at its width; else of its latest runs at any width,
    scaled to its width as if the work divided evenly."""
    runs = history.get(_key(job), [])
    same = [s for width, s in runs if width == job.gpus_max][:HISTORY_RUNS]
    if same:
        n = len(same)
        return RunEstimate(statistics.median(same), "history", f"from {_runs(n)}")
    scaled = [s * width / job.gpus_max for width, s in runs if job.gpus_max][:HISTORY_RUNS]
    if not scaled:
        return None
    note = f"from {_runs(len(scaled))} at other widths"
    return RunEstimate(statistics.median(scaled), "history", note)


def _runs(n: int) -> str:
    return f"{n} earlier run" + ("s" if n != 1 else "")


def _powers(session: Session, jobs: list[Job]) -> dict[tuple, float]:
    """The power per GPU earlier runs of each name measured at a width (calibration)."""
    names = sorted({j.name for j in jobs if j.name})
    if not names:
        return {}
    rows = session.exec(select(Calibration).where(col(Calibration.name).in_(names))).all()
    return {(r.name, r.gpus): r.power_w_per_gpu for r in rows if r.power_w_per_gpu}
