"""The least site power limit under which some job can start, refused one way for every
model that counts a job's least draw its own way: ``plan --power-limit`` (the jobs'
modelled draw: each job's most frugal option in watts, of those the planners choose from,
``problem.job_configs``; ``check_plan_limit``) and ``simulate`` (``sim.limitfloor``: the
site's draw, idle GPUs and servers with it). A limit under every job's least could start
none of them: one line, naming the least limit that could run a job (``refuse_below``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from orchestrator.errors import SpecError


def gpus_text(gpus: int, kind: str | None = None) -> str:
    """``2 GPUs``, ``1 v100 GPU``."""
    return f"{gpus}{f' {kind}' if kind else ''} GPU{'' if gpus == 1 else 's'}"


def refuse_below(limit_w: float, need_w, what: Callable[[int], str], name: str) -> None:
    """SpecError (one line, starting ``name:``) when ``limit_w`` is under each job's least
    limit ``need_w`` (W, per job): it names the smallest job's (``what(i)``: how it runs
    there) and asks for at least that, in whole watts."""
    need_w = np.asarray(need_w, dtype=float)
    if not need_w.size:
        return
    least = int(np.argmin(need_w))
    if limit_w + 1e-6 >= need_w[least]:
        return
    least_w = np.ceil(need_w[least] - 1e-6)
    raise SpecError(
        f"{name}: {limit_w:.10g} W is less than the {least_w:.0f} W the smallest job needs "
        f"({what(least)}), so no job could start within it; give at least {least_w:.0f} W"
    )


def check_plan_limit(snapshot, name: str) -> None:
    """Refuse (``refuse_below``) the snapshot's power limit where none of its queued jobs
    could start under it: each needs its most frugal option (GPUs at a cap, the host's share
    and PUE with them; 350 W a GPU for a job without a model, as planned); a job that uses
    no GPU draws nothing the limit counts, so it always can."""
    from orchestrator.planning.policies.problem import job_configs

    limit_w = snapshot.power_limit_w
    if limit_w is None or not snapshot.jobs:
        return
    least = [min(job_configs(j), key=lambda c: c.power_w) for j in snapshot.jobs]
    refuse_below(
        float(limit_w),
        [c.power_w for c in least],
        lambda i: (
            f"{gpus_text(least[i].gpus)} at a {least[i].cap:.0%} cap, the host's "
            "share and PUE with them"
        ),
        name,
    )
