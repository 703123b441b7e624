"""Elastic jobs in what-if runs: which traced jobs may be resized, and how they scale.

``--elastic FRACTION`` lets that share of the jobs (drawn with the scenario's seed) run on
anything from half to double their traced GPU count. How a job speeds up with GPUs comes
from the ElasticFlow A100 throughput tables (``perf/elasticflow-a100/MODEL.csv`` in the
shared data: iterations per second by global batch size and GPU count) when the trace
names its model (the Tiresias trace does: ``resnet50``, ``vgg19``, ...): a model maps to
the table of its family, read at its largest batch size. Other jobs scale by the model's
default (90 % efficiency per doubling).

While they run, the pass's ``resize`` step (``orchestrator.planning.resize``) may start
one narrower, shrink it or grow it; ``Resizing`` is the simulator's side of it: the
checkpoint, and the restart at once on the new width.
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

import numpy as np

from orchestrator.planning.onepass import Running
from orchestrator.planning.perfmodel import JobModel
from orchestrator.planning.policies.base import Decision

# model-name prefix -> ElasticFlow table (the closest family that was measured)
FAMILIES = (
    ("resnet50_cifar", "resnet50_cifar10"),
    ("resnet", "resnet50"),
    ("vgg", "vgg16"),
    ("alexnet", "vgg16"),
    ("inception", "inception3"),
    ("googlenet", "inception3"),
    ("bert", "bert"),
    ("gpt", "gpt2"),
    ("deepspeech", "deepspeech2"),
)


def table_name(model_name: str) -> str | None:
    name = model_name.strip().lower()
    return next((table for prefix, table in FAMILIES if name.startswith(prefix)), None)


@cache
def read_table(path: Path) -> dict[int, float] | None:
    """GPU count -> iterations/s at the table's largest global batch size."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError:
        return None
    header, body = rows[0], [r for r in rows[1:] if r]
    if not body:
        return None
    row = max(body, key=lambda r: float(r[0]))
    return {int(n): float(v) for n, v in zip(header[1:], row[1:], strict=True) if v}


def scaling_tables(names: tuple[str, ...] | None, folder: Path | None) -> list:
    """Per job, its throughput table or None."""
    if names is None or folder is None:
        return [None] * (len(names) if names else 0)
    out = []
    for name in names:
        table = table_name(name)
        out.append(read_table(folder / f"{table}.csv") if table else None)
    return out


def elastic_ranges(gpus: np.ndarray, fraction: float, seed: int, total: int):
    """(min, max) GPU counts: half to double the traced count for the drawn share."""
    rng = np.random.default_rng([seed, 2])
    chosen = rng.uniform(0, 1, len(gpus)) < fraction
    lo = np.where(chosen, np.maximum(1, gpus // 2), gpus)
    hi = np.where(chosen, np.minimum(gpus * 2, total), gpus)
    return lo.astype(np.int64), np.maximum(hi, gpus).astype(np.int64)


def resizes(inputs) -> bool:
    """Whether any job of the run accepts a range (the resize step runs)."""
    lo, hi = inputs.min_gpus, inputs.max_gpus
    return lo is not None and hi is not None and bool(np.any(np.asarray(lo) < np.asarray(hi)))


def may_resize(attempt) -> bool:
    """Whether the resize step may resize a running attempt: not while it runs one piece
    of a plan of several (it keeps its plan), nor under a power cap its plan chose (a
    resize would drop the cap the policy chose for the carbon or the budget)."""
    d = attempt.decision
    return attempt.suspend_event is None and len(d.intervals or ()) <= 1 and d.cap >= 1.0


def job_model(inputs, duration_s: float, gpus: int, table: dict | None) -> JobModel:
    """A traced job's model: its run on its traced width, scaled by its table (or the
    model's default efficiency)."""
    cfg = inputs.cluster
    return JobModel(
        full_duration_s=duration_s,
        ref_gpus=gpus,
        curve=inputs.curve,
        throughput_table=table,
        host_w_per_gpu=cfg.host_w_per_gpu,
        pue=cfg.pue,
    )


class Resizing:
    """The simulator's side of the resize step (``SimDaemon`` mixes it in)."""

    _resize_to: dict[int, int]

    def running(self, now: float) -> list[Running]:
        """The running attempts as the pass sees them (``SimDaemon``'s): the run left of
        one that may be suspended, at its widest; its width, expected end, age, and
        whether the resize step may resize it."""
        out = []
        for a in self._running.values():
            left = None
            if a.job.interruptible:  # only these may move: their run left, at now
                i = a.job.id
                left = self._at_width(i, self._duration[i] * (1 - self.executor.done_now(a.handle)))
            out.append(Running(a.key, a.job, left, ref=a, gpus=a.gpus, end_s=a.end_s,
                               elastic=may_resize(a), age_s=now - a.start_s))  # fmt: skip
        return out

    def _at_width(self, i: int, run_s: float) -> float:
        """A run time at job ``i``'s traced width, at its widest (an elastic job asks for
        the widest width of its range, as the daemon's ``--gpus 2-8`` asks for 8; the
        resize step starts it narrower where that ends sooner than waiting)."""
        hi, traced = self._max_gpus[i], self._gpus[i]
        if hi == traced:
            return run_s
        model = self._model(i)
        return run_s * model.speedup(traced) / model.speedup(hi)

    def resize(self, run, width: int, now: float) -> bool:
        """Checkpoint a running elastic job (at once, in the simulator); it starts again
        on ``width`` GPUs when it is requeued."""
        if sent := self.checkpoint(run, now):
            self._resize_to[run.job.id] = width
        return sent

    def _restart_resized(self, job, now: float) -> bool:
        """Requeue a resized job to start now on its new width; False: not resized. The
        width holds until it starts (``pin_resized`` after every plan, as the daemon)."""
        width = self._resize_to.get(job.id)
        if width is not None:
            self.scheduler.add_planned(job, Decision(now, gpus=width))
        return width is not None
