"""Mixed GPU types on the live daemon: each node's type (its configured ``gpu_model``, else
the model its GPUs report: ``Tesla V100-SXM2-32GB`` -> ``v100``), jobs that asked for a
type (``submit --gpu-type``) kept to nodes of it, and, for a job that asked for none, the
choice among the types with room now (``planning.devices.gputypes.choose_type``: the
least energy among those meeting its deadline, else the soonest finish).

A type no node has, or a job wider than its type's nodes together, is refused at
submission (one line); a job whose type disappeared from the config since (or whose
type's nodes shrank below it) fails with the reason when it is planned.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import SpecError
from orchestrator.planning.devices.gputypes import choose_type, curve, family_of, type_of
from orchestrator.planning.perfmodel import JobModel
from orchestrator.planning.pieces import piece_index
from orchestrator.queue.checks import spec_label
from placement.topology import ClusterTopology

DEFAULT_RUN_S = 3600.0  # a job with no estimate: only the ratio between types matters


def with_types(topology: ClusterTopology, nodes) -> ClusterTopology:
    """The topology with each node's GPU type (from the resolved nodes' models)."""
    types = {n.name: type_of(n.gpu_model) for n in nodes}
    return ClusterTopology(tuple(replace(t, gpu=types.get(t.name)) for t in topology.nodes))


def type_gpus(topology: ClusterTopology) -> dict[str | None, int]:
    """GPUs per type over the cluster."""
    out: dict[str | None, int] = {}
    for node in topology.nodes:
        out[node.gpu] = out.get(node.gpu, 0) + node.gpus
    return out


def planner_types(
    topology: ClusterTopology, held: dict[int, tuple[str | None, ...]]
) -> tuple[dict[str | None, int] | None, dict[int, str | None]]:
    """For the planner's capacity by type (``planning.policies.tiers``): GPUs per type, and
    per running job (``held``: the nodes its attempt holds) the type of its GPUs (None:
    several); (None, {}) on a cluster of one type."""
    per_type = type_gpus(topology)
    if len(per_type) < 2:
        return None, {}
    of = {node.name: node.gpu for node in topology.nodes}
    out: dict[int, str | None] = {}
    for job_id, nodes in held.items():
        types = {of.get(node) for node in nodes}
        out[job_id] = types.pop() if len(types) == 1 else None
    return per_type, out


def check_requested(specs, settings, db, labels: list[str] | None = None) -> None:
    """Refuse (one line) a submission whose jobs ask for a type no node has, or for more
    GPUs than that type's nodes hold together (``type_problem`` at submission): the nodes
    as configured, and as the daemon last found them (an SSH server's model, discovered).
    ``edit`` and ``restart`` check theirs the same way (``check_types``)."""
    _check_names(specs, labels)  # before the store is read (check_types repeats it: cheap)
    if any(type_of(spec.gpu_type) for spec in specs):
        check_types(specs, cluster_types(settings, db), labels)


def _check_names(specs, labels: list[str] | None) -> None:
    for i, spec in enumerate(specs):
        if spec.gpu_type and type_of(spec.gpu_type) is None:
            raise SpecError(f"{spec_label(specs, i, labels)}GPU type {spec.gpu_type!r} names "
                            "no GPU (such as v100 or a100)")  # fmt: skip


def cluster_types(settings, db) -> dict[tuple[str, str | None], int]:
    """GPUs per (node, type): the nodes as configured and as the daemon last found them,
    the most either says (read before a write transaction that checks against it)."""
    from sqlmodel import select

    from orchestrator.nodes.inventory import resolve_nodes
    from orchestrator.queue.models import Node

    found = [(n.name, n.gpu_model, n.gpu_count) for n in resolve_nodes(settings) if n.gpu_count]
    with db.read() as session:
        found += session.exec(select(Node.name, Node.gpu_model, Node.gpus).where(Node.gpus > 0))
    held: dict[tuple[str, str | None], int] = {}
    for name, model, gpus in found:
        held[name, type_of(model)] = max(held.get((name, type_of(model)), 0), gpus)
    return held


def check_types(specs, held: dict[tuple[str, str | None], int],
                labels: list[str] | None = None) -> None:  # fmt: skip
    """``check_requested`` against the cluster's GPUs per (node, type) (``cluster_types``);
    ``labels``: what a refusal calls each spec (``queue.checks.spec_label``)."""
    _check_names(specs, labels)
    have = {t for _, t in held}
    for i, spec in enumerate(specs):
        want = type_of(spec.gpu_type)
        if want is not None and want not in have:
            known = ", ".join(sorted(str(t) for t in have if t)) or "none known"
            raise SpecError(f"{spec_label(specs, i, labels)}no node has GPU type {want} "
                            f"(this cluster's: {known})")  # fmt: skip
    for i, spec in enumerate(specs):
        want = type_of(spec.gpu_type)
        total = sum(gpus for (_, t), gpus in held.items() if t == want)
        if want is not None and getattr(spec, "gpus_min", 0) > total:
            raise SpecError(f"{spec_label(specs, i, labels)}needs {spec.gpus_min} {want} "
                            f"GPUs; the cluster has {total}")  # fmt: skip


def type_problem(job, topology: ClusterTopology) -> str | None:
    """Why a stored job asking for a type cannot run here (None: it can)."""
    want = type_of(job.gpu_type)
    if want is None:
        return None
    have = type_gpus(topology).get(want, 0)
    if have < job.gpus_min:
        return f"it asks for {job.gpus_min} {want} GPUs; the cluster has {have}"
    return None


def allocate_typed(alloc, key, width: int, job, view, decision, now_s: float, place=None):
    """GPUs for a job: of its type when it asked for one; else of the type with room now
    that suits it best; on a cluster of one type, anywhere. ``place(key, width, gpu_type)``
    makes the allocation once the type is chosen (default: ``alloc.allocate``; a packing
    preference passes its own)."""
    if place is None:

        def place(key, width, gpu_type):
            return alloc.allocate(key, width, gpu_type=gpu_type)

    want = type_of(job.gpu_type) if job is not None else None
    types = alloc.types()
    if want is not None:  # an elastic job: at most that type's GPUs
        width = min(width, type_gpus(alloc.topology).get(want, 0))
    if want is not None or len(types) < 2:
        return place(key, width, want)
    free = [t for t in types if alloc.fits_now(width, t)]
    if not free:  # it waits, unless no one type could ever hold it
        per_type = type_gpus(alloc.topology)
        return place(key, width, None) if all(width > n for n in per_type.values()) else None
    model = view.model
    if model is None:
        model = JobModel(view.duration_s or DEFAULT_RUN_S, width, curve(types[0]))
    cap = decision.piece_config(piece_index(decision, now_s))[1]
    ref = type_of(model.curve.gpu)
    family = family_of(job.name if job is not None else None)
    chosen = choose_type(model, family, ref, free, width, model.total_work, now_s,
                         view.deadline_s, cap)  # fmt: skip
    return place(key, width, chosen)
