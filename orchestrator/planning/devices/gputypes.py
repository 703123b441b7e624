"""GPU types: each type's power curve and its throughput relative to the V100 per model
family, and the choice among free types for a job that asked for none. Pure.

Curves: the Zeus fits (``planning/power_curves.json``: v100, a40, p100, rtx6000). The A100
and the K80 have no power data in the shared data: they get the generic shape (the mean of
the fitted curves) at their board limit, 400 W (A100 SXM4) and 150 W (one of a K80's two
GPUs). Speeds: ``gpu_speeds.json`` (``speedfit``, on Gavel's measurements: K80, P100 and
V100; A100, A40 and RTX 6000 by a stated memory-bandwidth prior).

A job's model (``JobModel``) describes its run on a *reference* type (a trace's cluster
default, or the type its estimate was made on); ``on_type`` moves it to another type: that
type's curve, its duration scaled by the family's speed ratio.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from pathlib import Path

from orchestrator.planning.devices.typenames import type_of as type_of  # canonical names
from orchestrator.planning.perfmodel import JobModel, PowerCurve, curve_for

SPEEDS = Path(__file__).with_name("gpu_speeds.json")
ANY = "any"  # the family of a job whose model is unknown


@cache
def _speeds() -> dict:
    return json.loads(SPEEDS.read_text())


def known_types() -> tuple[str, ...]:
    """Every type with a curve and a speed (``v100``, ``p100``, ``a100`` ...)."""
    return tuple(sorted(_speeds()["ratios"][ANY]))


def curve(gpu_type: str | None) -> PowerCurve:
    """The power curve of a type; the generic one for an unknown type (the planner's
    ``curve_for``: one curve per type, live and simulated)."""
    return curve_for(gpu_type)


def family_of(job_type: str | None) -> str:
    """A job's model family (``"ResNet-50 (batch size 32)"`` and ``"resnet50"`` ->
    ``"ResNet-50"``); ``any`` for a name that is none of Gavel's families."""
    if not job_type:
        return ANY
    name = _plain(job_type.split(" (batch size", 1)[0])
    return next((f for f in _speeds()["ratios"] if _plain(f) == name), ANY)


def _plain(name: str) -> str:
    """``"ResNet-50"``, ``"resnet50"`` and ``"resnet_50"`` alike."""
    return "".join(c for c in name.lower() if c.isalnum())


def speed(family: str | None, gpu_type: str | None) -> float:
    """Throughput of ``family`` on ``gpu_type`` over the V100's (1.0 for an unknown type:
    no better guess than the reference)."""
    ratios = _speeds()["ratios"]
    row = ratios.get(family or ANY, ratios[ANY])
    return float(row.get(gpu_type or "", 1.0))


def relative_speed(family: str | None, on: str | None, ref: str | None) -> float:
    """How much faster a job of ``family`` runs on ``on`` than on ``ref``."""
    return speed(family, on) / speed(family, ref)


def on_type(model: JobModel, family: str | None, gpu_type: str | None, ref: str | None) -> JobModel:
    """``model`` (its run on type ``ref``) moved to ``gpu_type``: that type's curve, the
    duration divided by the family's speed ratio. The same model when the types agree."""
    if gpu_type == ref:
        return model
    factor = relative_speed(family, gpu_type, ref)
    return replace(model, curve=curve(gpu_type), full_duration_s=model.full_duration_s / factor)


def model_mix(n: int, seed: int) -> list[str]:
    """``n`` job types drawn (with ``seed``, uniformly) from Gavel's 26 single-GPU job types
    (``"ResNet-50 (batch size 32)"``, ``"A3C"`` ...), as Gavel's own trace generator draws
    them: the model of each traced job that names none (Philly's)."""
    mix = _speeds()["mix"]
    import numpy as np  # the simulator's only: submit and show do not load numpy

    rng = np.random.default_rng([seed, 24])
    return [mix[k] for k in rng.integers(0, len(mix), n)]


def choose_type(
    model: JobModel,
    family: str | None,
    ref: str | None,
    free: Iterable[str | None],
    gpus: int,
    work: float,
    now_s: float,
    deadline_s: float | None = None,
    cap: float = 1.0,
) -> str | None:
    """Among the types with room now (``free``), the one to run ``work`` (the job's work
    left, in its model's units) on: the least energy among those that finish by its
    deadline (all of them when it has none; when none does, the soonest finish), ties to
    the soonest finish. None when nothing is free."""
    best: tuple | None = None
    for gpu_type in dict.fromkeys(free):
        m = on_type(model, family, gpu_type, ref)
        run_s = m.time_s(work, gpus, cap)
        energy_j = m.energy_j(work, gpus, cap)
        late = deadline_s is not None and now_s + run_s > deadline_s
        key = (late, run_s if late else energy_j, run_s, str(gpu_type))
        if best is None or key < best[0]:
            best = (key, gpu_type)
    return None if best is None else best[1]
