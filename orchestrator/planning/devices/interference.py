"""Co-location (EaCO): how much two jobs sharing one GPU slow each other, and what the
shared GPU draws.

The slowdown model is fitted on Gavel's measured pairs (``interfit.py`` writes
``interference.json``; median relative error of a job's paired speed: K80 2.8 %, P100
2.5 %, V100 8.0 % in sample, 3.5 / 2.9 / 10.7 % held out). ``speeds(a, b, gpu)`` gives
each job's speed when paired as a share of its speed alone. A job is named by its Gavel
job type (``"ResNet-18 (batch size 64)"``) or only its family (``"ResNet-18"``: the mean
of the family's coefficients); an unknown name gets the mean job. GPU types without Gavel
pairs (a40, rtx6000, a100) use V100's coefficients, the newest measured type.

``observe(a, b, gpu, speed_a)`` records a measured relative speed (clamped to
[``FLOOR``, 1]; never for a pair Gavel measured infeasible), which then replaces the
prediction for that pair. The daemon keeps the jobs' own measurements per attempt and
never observes them here: a job's reports are untrusted.

Power: a GPU running two jobs draws the larger of their draws alone plus
``SHARED_EXTRA`` (10 %) of it, capped at the board limit: one busy GPU draws a little more
than with one job (EaCO measured 5-15 % on V100s). The GPU's energy is split between the
two in proportion to each one's draw alone times its relative speed (``split``): the job
that does more of the work at more watts pays more; the parts always sum to the GPU's.

Moving a job to pair it (``move_gain_j``): a job that may share, can be checkpointed and
runs alone may be stopped and restarted next to another that runs alone, when what the
pair is predicted to save while both run is more than ``MOVE_MARGIN`` times what the
checkpoint costs (the run time lost, at the job's draw alone): twice, since the saving is
a prediction (the model's median error, above) and the cost is certain.

Pure: no clock, no I/O beyond reading the committed coefficients once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

COEFFICIENTS = Path(__file__).with_name("interference.json")
FALLBACK_GPU = "v100"
SHARED_EXTRA = 0.10  # a GPU with two jobs draws this much above the larger draw alone
MIN_SPEED = 0.5  # co-location: each job of a pair keeps at least this share of its speed
FLOOR = 0.01  # the least relative speed a measurement records
MOVE_MARGIN = 2.0  # a move must be predicted to save this many times what its checkpoint costs
MOVE_AFTER_S = 600.0  # a job moves no sooner than this plus twice its checkpoint after it started


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(COEFFICIENTS.read_text())["gpus"]


def family(name: str) -> str:
    """``"ResNet-18 (batch size 64)"`` -> ``"ResNet-18"``."""
    return name.split(" (", 1)[0].strip()


def job_types(gpu: str = FALLBACK_GPU) -> list[str]:
    """The Gavel job types with coefficients on ``gpu``."""
    return sorted(_table()[_gpu_key(gpu)]["jobs"])


def _gpu_key(gpu: str) -> str:
    gpu = (gpu or "").lower()
    return gpu if gpu in _table() else FALLBACK_GPU


@lru_cache(maxsize=4096)
def _coef(gpu: str, name: str) -> tuple[float, float, float, float]:
    jobs = _table()[gpu]["jobs"]
    if name in jobs:
        return tuple(jobs[name])
    members = [c for n, c in jobs.items() if family(n) == family(name)] or list(jobs.values())
    return tuple(sum(c[k] for c in members) / len(members) for k in range(4))


@dataclass
class Interference:
    """The fitted model with the pairs measured since (``observe``)."""

    measured: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def speed(self, a: str, b: str, gpu: str) -> float:
        """Job ``a``'s speed next to ``b`` on ``gpu``, as a share of its speed alone."""
        key = _gpu_key(gpu)
        if self.infeasible(a, b, gpu):
            return 0.0  # no measurement makes two jobs fit that Gavel saw not fit
        seen = self.measured.get((key, a, b))
        if seen is not None:
            return seen
        s, _, u, _ = _coef(key, a)
        _, p, _, v = _coef(key, b)
        return min(1.0, math.exp(-(s + p + u * v)))

    def speeds(self, a: str, b: str, gpu: str) -> tuple[float, float]:
        return self.speed(a, b, gpu), self.speed(b, a, gpu)

    def infeasible(self, a: str, b: str, gpu: str) -> bool:
        """The two do not fit in the GPU's memory together (Gavel measured zero)."""
        return _infeasible(_gpu_key(gpu), *sorted((a, b)))

    def observe(self, a: str, b: str, gpu: str, speed_a: float) -> None:
        """A measured relative speed of ``a`` next to ``b``, clamped to [``FLOOR``, 1];
        replaces the prediction (never an infeasible pair's zero). One below ``MIN_SPEED``
        stays below it: that pair no longer qualifies. The simulator's: the daemon never
        feeds a job's own reports into a shared model (``daemon.energy``)."""
        if not (0.0 < speed_a <= 1.5) or not math.isfinite(speed_a):
            raise ValueError(f"a relative speed must be in (0, 1.5], not {speed_a!r}")
        self.measured[(_gpu_key(gpu), a, b)] = min(1.0, max(FLOOR, float(speed_a)))


@lru_cache(maxsize=4096)
def _infeasible(gpu: str, a: str, b: str) -> bool:
    return [a, b] in _table()[gpu]["infeasible"]


def shared_power_w(power_a_w: float, power_b_w: float, max_w: float | None = None) -> float:
    """What one GPU draws running both jobs."""
    watts = max(power_a_w, power_b_w) * (1.0 + SHARED_EXTRA)
    return min(watts, max_w) if max_w is not None else watts


def split(
    total: float, power_a_w: float, power_b_w: float, speed_a: float, speed_b: float
) -> tuple[float, float]:
    """The shared GPU's ``total`` (watts or joules) split between the two jobs."""
    wa, wb = power_a_w * speed_a, power_b_w * speed_b
    if wa + wb <= 0:
        return total / 2, total / 2
    share = wa / (wa + wb)
    return total * share, total - total * share


def worth_sharing(
    speed_a: float, speed_b: float, power_a_w: float, power_b_w: float, min_speed: float
) -> bool:
    """Pairing pays: each keeps at least ``min_speed`` of its speed alone, and the energy per
    unit of work falls (the shared GPU's draw over the work both do, against each alone)."""
    if min(speed_a, speed_b) < min_speed or min(speed_a, speed_b) <= 0:
        return False  # too slow, or they do not fit together
    alone = power_a_w + power_b_w  # two GPUs, each a job at full speed: 2 units of work
    together = shared_power_w(power_a_w, power_b_w) * 2 / (speed_a + speed_b)
    return together < alone


def pair_saving_j(
    power_a_w: float, power_b_w: float, speed_a: float, speed_b: float, overlap_s: float
) -> float:
    """The energy two jobs sharing one GPU for ``overlap_s`` save against doing the same work
    each alone on its own GPU (negative: sharing costs more)."""
    alone_w = power_a_w * speed_a + power_b_w * speed_b
    return (alone_w - shared_power_w(power_a_w, power_b_w)) * max(0.0, overlap_s)


def may_move_again(ran_s: float, checkpoint_s: float, after_s: float = MOVE_AFTER_S) -> bool:
    """Whether a job that started ``ran_s`` ago may be moved: never twice in quick
    succession, nor before its checkpoint handler is up (the daemon's rule too)."""
    return ran_s >= 2.0 * checkpoint_s + after_s


def pair_ends_s(
    work_x_s: float, work_h_s: float, speed_x: float, speed_h: float
) -> tuple[float, float]:
    """When each of two jobs that start sharing now ends (from now): paired while both
    run, the one left alone at full speed after. ``work_*_s``: their work at full speed."""
    if work_x_s / speed_x <= work_h_s / speed_h:
        end_x = work_x_s / speed_x
        return end_x, end_x + (work_h_s - end_x * speed_h)
    end_h = work_h_s / speed_h
    return end_h + (work_x_s - end_h * speed_x), end_h


def move_gain_j(
    power_x_w: float,
    power_h_w: float,
    speed_x: float,
    speed_h: float,
    left_x_s: float,
    left_h_s: float,
    checkpoint_s: float,
) -> float:
    """The net energy of checkpointing job ``x`` (``left_x_s`` of work left at full speed,
    drawing ``power_x_w`` alone) and restarting it next to ``h`` (``left_h_s`` left): the
    pair's saving while both run, less ``MOVE_MARGIN`` times the checkpoint's cost (the
    run time it loses, at its draw alone). Positive: worth moving."""
    if min(speed_x, speed_h) <= 0:
        return -math.inf
    overlap_s = min((left_x_s + checkpoint_s) / speed_x, left_h_s / speed_h)
    saved = pair_saving_j(power_x_w, power_h_w, speed_x, speed_h, overlap_s)
    return saved - MOVE_MARGIN * checkpoint_s * power_x_w
