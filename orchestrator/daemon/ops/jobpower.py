"""``job_power``: what ``gridshift show ID --plot`` draws, one job's power over its
attempts and the grid's carbon intensity over its run.

Power is measured where the attempt's power log has samples (``<t> <joules since
start>``: the mean power between samples); otherwise it is the attempt's energy spread
evenly over it, ``modelled`` (GPUs without energy counters, or no log). Carbon is the
history of the configured signal (``daemon.grid``, else ``grid.source``) over the run,
or None where no source is set or answers.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.daemon.ops.views import iso
from orchestrator.errors import PermissionDenied, SpecError

MAX_POINTS = 2000  # samples per attempt sent (evenly thinned)
MAX_LOG_BYTES = 64 << 20  # of a power log read


def job_power(ctx: OpContext, caller: Caller, args: Args) -> dict[str, Any]:
    from orchestrator.queue import store

    job_id = args.get("job_id", int)
    if job_id is None:
        raise SpecError("malformed request: give job_id")
    with ctx.db.read() as session:
        job = store.get_job(session, job_id)
        if not ctx.privileged(caller) and job.uid != caller.uid:
            raise PermissionDenied(
                f"job {job.id} belongs to {job.user}; only they or root may see its details"
            )
        attempts = [a for a in store.attempts(session, job_id) if a.started_at is not None]
        events = store.events(session, job_id)
    if not attempts:
        raise SpecError(f"job {job_id} has not run yet ({job.state}): nothing to plot")
    runs = [_run(a) for a in attempts]
    start_s = min(r["start_s"] for r in runs)
    end_s = max(r["end_s"] for r in runs)
    return {
        "job": job.id,
        "name": job.name,
        "state": job.state,
        "runs": runs,
        "events": [
            {"at": iso(e.at), "to": e.to_state, "reason": e.reason}
            for e in events
            if e.to_state in ("suspended", "stopped", "queued", "running")
        ],
        "carbon": _carbon(ctx, start_s, end_s),
    }


def _run(a) -> dict[str, Any]:
    from orchestrator.queue.attempts import width_of_attempt
    from orchestrator.timeparse import utc_now

    start_s = a.started_at.timestamp()
    end = a.finished_at or a.accounted_until or utc_now()
    end_s = max(start_s, end.timestamp())
    # a job across servers: its parts' logs are apart (part-<rank>): the mean over it
    samples = _measured(Path(a.run_dir), start_s, end_s) if a.run_dir and not a.parts else []
    watts = None
    if not samples and a.energy_j is not None and end_s > start_s:
        watts = a.energy_j / (end_s - start_s)
    return {
        "attempt": a.number,
        "state": a.state,
        "gpus": width_of_attempt(a),
        "cap": a.cap,
        "start_s": start_s,
        "end_s": end_s,
        "samples": samples,  # [[t_s, W], ...]: the mean power from t_s to the next sample
        "modelled_w": watts,  # when there are no samples: the mean over the attempt
        "energy_modelled": bool(a.energy_modelled),
    }


def _measured(run_dir: Path, start_s: float, end_s: float) -> list[list[float]]:
    """The mean power between the log's samples in the run's window, read a chunk at a
    time and thinned as it goes (memory bounded whatever the log's size)."""
    from executors import runfiles

    kept = Thinned(start_s - 1, end_s + 300)
    offset = 0
    while offset < MAX_LOG_BYTES:
        got, after = runfiles.read_power_log(run_dir / runfiles.POWER, offset)
        kept.add(got)
        if after == offset:
            break
        offset = after
    points = sorted(kept.points())
    out = []
    for (t0, e0), (t1, e1) in itertools.pairwise(points):
        if t1 > t0 and e1 >= e0:
            out.append([t0, (e1 - e0) / (t1 - t0)])
    if len(out) > MAX_POINTS:
        step = len(out) / MAX_POINTS
        out = [out[int(i * step)] for i in range(MAX_POINTS)]
    return out


class Thinned:
    """The ``(t_s, joules)`` samples inside ``[low_s, high_s]``, every ``stride``-th one
    kept (the stride doubles whenever more than ``2 * cap`` are held), and the last one.
    The energy is cumulative, so the mean power between kept samples stays exact."""

    def __init__(self, low_s: float, high_s: float, cap: int = MAX_POINTS) -> None:
        self.low_s, self.high_s, self.cap = low_s, high_s, cap
        self.kept: list[tuple[float, float]] = []
        self.stride, self.seen, self.peak = 1, 0, 0
        self.last: tuple[float, float] | None = None

    def add(self, samples: list[tuple[float, float]]) -> None:
        for point in samples:
            if not self.low_s <= point[0] <= self.high_s:
                continue
            if self.seen % self.stride == 0:
                self.kept.append(point)
                if len(self.kept) > 2 * self.cap:
                    self.kept = self.kept[::2]
                    self.stride *= 2
            self.seen += 1
            self.last = point
        self.peak = max(self.peak, len(self.kept))

    def points(self) -> list[tuple[float, float]]:
        if self.last is not None and (not self.kept or self.kept[-1] != self.last):
            return [*self.kept, self.last]
        return list(self.kept)


def _carbon(ctx: OpContext, start_s: float, end_s: float) -> dict[str, Any] | None:
    from datetime import UTC, datetime

    from grid.errors import GridDataError
    from grid.steps import StepSeries
    from orchestrator.errors import GridshiftError
    from orchestrator.signals.sources import open_chain

    settings = ctx.settings
    specs = settings.daemon.grid or settings.grid.source
    if not specs:
        return None
    margin = max(3600.0, 0.1 * (end_s - start_s))
    a = datetime.fromtimestamp(start_s - margin, UTC)
    b = datetime.fromtimestamp(end_s + margin, UTC)
    try:
        chain = open_chain(settings, specs)
        signal = chain.history(a - timedelta(hours=1), b + timedelta(hours=1))
        series, _ = StepSeries.from_signal(signal)
    except (GridDataError, GridshiftError, ValueError):
        return None
    if series.end_s <= a.timestamp() or series.start_s >= b.timestamp():
        return None  # the signal does not cover the run (a trace that ended before it)
    first, last = int(series.index(a.timestamp())), int(series.index(b.timestamp()))
    return {
        "source": chain.spec,
        "zone": signal.meta.zone,
        "unit": signal.meta.unit,
        "start_s": float(series.start_s + first * series.step_s),
        "step_s": float(series.step_s),
        "values": [float(v) for v in series.values[first : last + 1]],
    }
