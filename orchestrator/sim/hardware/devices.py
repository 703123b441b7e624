"""Mixed GPU types in what-if runs: which type each node has, each job's model family and
the type it asked for, and where a job runs and how fast (``SimDaemon`` mixes in
``Devices``).

A job's traced duration is its run on the cluster's default type (``[cluster] gpu``, the
*reference*). Placed on a node of another type, it runs with that type's power curve and
at its family's speed ratio (``planning.devices.gputypes``: Gavel's measurements). A job
that asked for a type (a trace spec's ``gpu_type``) waits for nodes of it; one that asked
for none goes to the type, among those with room now, that ``choose_type`` picks: the
least energy among those meeting its deadline, else the soonest finish. A job wider than
every type's nodes together runs across types, at the pace of the slowest.

Model families: a traced name of one of Gavel's families (``resnet50``) is kept; with
``[jobs] models = "gavel"`` (the default) every other job gets a job type drawn with the
scenario's seed from Gavel's mix (``model_mix``); ``"none"``: no family (the mean ratio).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from orchestrator.errors import PlacementError, SpecError
from orchestrator.planning.devices.gputypes import (
    ANY,
    choose_type,
    family_of,
    known_types,
    model_mix,
    on_type,
    relative_speed,
    type_of,
)
from orchestrator.planning.perfmodel import JobModel
from orchestrator.planning.pieces import piece_index, width_of
from orchestrator.planning.policies.base import Commitment
from orchestrator.sim.elastic import job_model

MODEL_SOURCES = ("gavel", "none")


def node_types(cluster) -> list[str | None]:
    """Each configured node's type (its ``gpu``, else the cluster's)."""
    return [type_of(node.gpu or cluster.gpu) for node in cluster.nodes or ()]


def job_families(names: tuple[str, ...] | None, n: int, source: str, seed: int) -> list[str]:
    """Per job, its model's Gavel job type or family (``any``: unknown)."""
    if source not in MODEL_SOURCES:
        raise SpecError(f"jobs.models: {source!r} is not one of {', '.join(MODEL_SOURCES)}")
    drawn = model_mix(n, seed) if source == "gavel" else [ANY] * n
    named = [family_of(name) for name in names] if names else [ANY] * n
    return [own if own != ANY else mix for own, mix in zip(named, drawn, strict=True)]


def requested_types(jobs) -> list[str | None] | None:
    """Per job, the GPU type it asked for (a trace spec's ``gpu_type``); None: no job did."""
    if not jobs.gpu_types or not any(jobs.gpu_types):
        return None
    out = [type_of(t) for t in jobs.gpu_types]
    for i, (raw, canonical) in enumerate(zip(jobs.gpu_types, out, strict=True)):
        if raw and canonical is None:
            raise SpecError(f"{jobs.source} job {i + 1}: GPU type {raw!r} names no GPU")
    return out


def _type_gpus(topology) -> dict[str | None, int]:
    have: dict[str | None, int] = {}
    for node in topology.nodes:
        have[node.gpu] = have.get(node.gpu, 0) + node.gpus
    return have


def typed_widest(max_gpus: np.ndarray, wants: list[str | None] | None, topology) -> np.ndarray:
    """An elastic job's widest width, at most the GPUs of the type it asked for."""
    if wants is None:
        return max_gpus
    have = _type_gpus(topology)
    widest = zip(wants, max_gpus.tolist(), strict=True)
    limit = [have.get(w, 0) if w is not None else hi for w, hi in widest]
    return np.minimum(max_gpus, np.asarray(limit, dtype=max_gpus.dtype))


def note_unknown_types(topology, notes: list[str]) -> None:
    """Say which nodes' types have no measured speed or curve (they run as a V100 would,
    at the generic curve)."""
    known = set(known_types())
    unknown = sorted({str(n.gpu) for n in topology.nodes if n.gpu not in known})
    if unknown:
        notes.append(
            f"GPU type(s) {', '.join(unknown)}: no measured speed or power curve; they run "
            "at the V100's speed with the generic power curve"
        )


def counted(n: int, what: str) -> str:
    """``1 job <what> was``, ``2 jobs <what> were``."""
    return f"1 job {what} was" if n == 1 else f"{n} jobs {what} were"


def leave_out(jobs, keep, what: str, notes: list[str]):
    """``jobs`` (``TraceJobs``) less those ``keep`` leaves out (``what``: why, e.g. "wider
    than the cluster"; a GPU type the cluster lacks or has too few of: ``keep_typed``)
    and those that wait for them, each said in ``notes``."""
    keep = np.asarray(keep, dtype=bool)
    if keep.all():
        return jobs
    notes.append(f"{counted(int((~keep).sum()), what)} left out")
    kept = jobs.without_dependants(keep)
    waiting = int((kept != keep).sum())
    if waiting:
        notes.append(f"{waiting} job{'' if waiting == 1 else 's'} waiting for those too")
    return jobs.take(np.flatnonzero(kept))


def keep_typed(jobs, topology, notes: list[str]):
    """The jobs less those that asked for a type the cluster lacks, or for more GPUs of
    their type than it has (and those waiting for them), each said in ``notes``."""
    wants = requested_types(jobs)
    if wants is None:
        return jobs
    have = _type_gpus(topology)
    jobs = leave_out(jobs, [w is None or w in have for w in wants],
                     "asking for a GPU type the cluster lacks", notes)  # fmt: skip
    wants = requested_types(jobs) or [None] * len(jobs)
    pairs = list(zip(wants, jobs.gpus.tolist(), strict=True))
    short = sorted({w for w, g in pairs if w is not None and have[w] < g})
    why = "asking for more GPUs of their type than the cluster has"
    has = ", ".join(f"{have[w]} {w}" for w in short)
    return leave_out(jobs, [w is None or have[w] >= g for w, g in pairs], f"{why} ({has})", notes)


class Devices:
    """The simulator's side of GPU types: each job's model, on the type it runs on."""

    def _init_devices(self, inputs) -> None:
        self._models: dict[int, JobModel] = {}  # on the reference type
        self._placed: dict[int, JobModel] = {}  # on the type it runs on now
        self._ref = type_of(inputs.cluster.gpu)
        self._families = inputs.families or [ANY] * self.n
        self._wants = inputs.gpu_types or [None] * self.n
        # a job's run is on the reference type: on a cluster of one other type it is moved
        self._mixed = set(self.alloc.types()) != {self._ref}
        self._per_type = {t: 0 for t in self.alloc.types()}
        for node in inputs.topology.nodes:
            self._per_type[node.gpu] += node.gpus

    def _never_started(self, unfinished: np.ndarray) -> PlacementError:
        """The one-line error for jobs a run ended without (no node ever took them)."""
        i = int(np.flatnonzero(unfinished)[0])
        want = f" of type {self._wants[i]}" if self._wants[i] is not None else ""
        return PlacementError(
            f"{int(unfinished.sum())} jobs never finished under {self.policy.name}: job {i} "
            f"({self._max_gpus[i]} GPUs{want}) found no node to run on"
        )

    def _model(self, i: int) -> JobModel:
        model = self._models.get(i)
        if model is None:
            model = job_model(self.inputs, self._duration[i], self._gpus[i], self._tables[i])
            self._models[i] = model
        return model

    def _running_model(self, i: int) -> JobModel:
        return self._placed.get(i) or self._model(i)

    def allocate(self, job, decision, now: float):
        i, width, key = job.id, width_of(job, decision, now), ("job", job.id)
        want = self._wants[i]
        if want is not None or not self._mixed:
            return self._place(key, width, want)
        free = [t for t in self._per_type if self.alloc.fits_now(width, t)]
        if not free:  # it waits, unless no one type could ever hold it
            wider = all(width > n for n in self._per_type.values())
            return self._place(key, width, None) if wider else None
        cap = decision.piece_config(piece_index(decision, now))[1]
        work = max(1.0 - float(self.done[i]), 1e-9)
        chosen = choose_type(self._model(i), self._families[i], self._ref, free, width, work,
                             now, self._deadline[i], cap)  # fmt: skip
        return self._place(key, width, chosen)

    def _typed(self, held: list[Commitment]) -> list[Commitment]:
        """A running attempt's commitments (``held_pieces``), the piece it runs now said to
        be on the type of its GPUs (on a mixed cluster, when they are of one type)."""
        if not self._mixed or not held:
            return held
        allocation = self.alloc.allocation(("job", held[0].id))
        types = {self.alloc.type_of(node) for node, _ in allocation.parts} if allocation else ()
        if len(types) != 1:
            return held
        return [replace(held[0], gpu_type=types.pop()), *held[1:]]

    def _place(self, key, width: int, gpu_type: str | None):
        """The allocator's call, once the type is chosen (a packing preference hooks here)."""
        return self.alloc.allocate(key, width, gpu_type=gpu_type)

    def _placed_model(self, i: int, allocation) -> JobModel:
        """Job ``i``'s model on the type of the GPUs it was given (the slowest of them)."""
        model = self._model(i)
        if not self._mixed:
            return model
        types = {self.alloc.type_of(node) for node, _ in allocation.parts}
        family = self._families[i]
        slowest = min(types, key=lambda t: (relative_speed(family, t, self._ref), str(t)))
        self._placed[i] = placed = on_type(model, family, slowest, self._ref)
        return placed
