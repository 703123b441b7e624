"""What a what-if run's site power limit must at least be, by the model ``sim.sitelimit``
holds it to: each job's least limit is what the site draws when it runs alone at its
lowest cap, on its fewest GPUs, every other GPU idle and every server on (``alone_w``).

A limit under the least of these could start no job without going over it: refused up
front (``check_limit``, one line, the least limit that could run a job, said as ``plan``
says it: ``planning.limitfloor``). Under a limit
that some jobs' least limits exceed, those jobs still run, each only when nothing else
runs, over the limit (``sitelimit``'s rule: a run never deadlocks): a note says how many
and by how much. A limit below the idle draw alone is ``SimSiteLimit``'s to refuse.
"""

from __future__ import annotations

import numpy as np

from orchestrator.planning.limitfloor import gpus_text, refuse_below


def alone_w(inputs) -> tuple[float, np.ndarray, list[str | None]]:
    """The idle draw (every server on, × PUE); per job, the site's draw with it alone at
    its lowest cap (W, × PUE), and the GPU type that least draw is on. A job's GPUs stop
    counting their idle draw (the GPU's and the server's share): on the type where its
    lowest-cap draw less that share is the least (a node's, where that type's differ)."""
    from orchestrator.planning.devices.gputypes import curve, type_of
    from orchestrator.sim.hardware.power import node_settings

    cfg = inputs.cluster
    nodes = node_settings(inputs)
    floor_w = sum(n.idle_w for n in nodes) * cfg.pue
    types = {getattr(t, "gpu", None) for t in inputs.topology.nodes}
    mixed = types != {type_of(cfg.gpu)}  # as ``Devices``: a model moves to another type
    delta_w: dict[str | None, float] = {}  # per GPU: its lowest-cap draw less its idle share
    for topo, node in zip(inputs.topology.nodes, nodes, strict=True):
        gpu_type = getattr(topo, "gpu", None)
        c = curve(gpu_type) if mixed else inputs.curve
        busy_w = (c.power_w(c.min_fraction) + cfg.host_w_per_gpu) * cfg.pue
        delta = busy_w - node.idle_w / node.gpus * cfg.pue
        delta_w[gpu_type] = min(delta_w.get(gpu_type, np.inf), delta)
    any_type = min(delta_w, key=lambda t: (delta_w[t], str(t)))
    wants = inputs.gpu_types or [None] * len(inputs.jobs)
    chosen = [any_type if w is None else w for w in wants]
    per_gpu = np.array([delta_w.get(t, delta_w[any_type]) for t in chosen])
    gpus = np.asarray(inputs.min_gpus if inputs.min_gpus is not None else inputs.jobs.gpus)
    return floor_w, floor_w + gpus * per_gpu, chosen


def check_limit(inputs) -> None:
    """Refuse a limit under which no job could start (SpecError, one line); note the jobs
    that need more than the limit even alone (``inputs.notes``)."""
    limit_w = inputs.power_limit_w
    if limit_w is None:
        return
    floor_w, need_w, types = alone_w(inputs)
    if limit_w < floor_w:
        return  # below the idle draw: ``SimSiteLimit`` refuses it, saying so
    gpus = inputs.min_gpus if inputs.min_gpus is not None else inputs.jobs.gpus
    refuse_below(
        limit_w,
        need_w,
        lambda i: (
            f"{gpus_text(int(gpus[i]), types[i])} at its lowest cap, every other GPU "
            "idle and every server on"
        ),
        inputs.scenario.named("power_limit_w"),
    )
    over = int((need_w > limit_w + 1e-6).sum())
    if over:
        who = "1 job needs" if over == 1 else f"{over} jobs need"
        inputs.notes.append(
            f"{who} more than the {limit_w / 1000:g} kW power limit even alone at the lowest "
            f"cap (up to {need_w.max() / 1000:.2f} kW, every server on): each starts only "
            "when nothing else runs, over the limit"
        )
