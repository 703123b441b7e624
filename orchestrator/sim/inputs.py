"""From a scenario to what every policy's run shares: the carbon (and price) signal as step
series, the jobs on the signal's time line with their deadlines and interruptibility, the
cluster topology and the power curve. Anything left out is said in ``notes``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator.errors import GridDataError, SpecError
from orchestrator.planning.backfill import DEFAULT_BACKFILL
from orchestrator.planning.devices.gputypes import type_of
from orchestrator.planning.policies.base import DEFAULT_CHECKPOINT_S
from orchestrator.sim.deadlines import DeadlineRule
from orchestrator.sim.elastic import elastic_ranges, scaling_tables
from orchestrator.sim.limitfloor import check_limit
from orchestrator.sim.scenario import ClusterConfig, Scenario, resolve_path
from orchestrator.sim.traces import TraceJobs, read_trace, shift_onto
from orchestrator.timeparse import parse_checkpoint_s, parse_duration_s, zone_info
from placement.topology import ClusterTopology, NodeTopology

MARGIN_S = 30 * 86400  # the signal is continued this far past the last deadline


@dataclass
class SimInputs:
    scenario: Scenario
    carbon: object  # grid.steps.StepSeries (continued past its end, see ``carbon_end_s``)
    carbon_end_s: float  # end of the real data
    price: object | None
    price_unit: str | None
    signal_label: str
    jobs: TraceJobs
    deadline_s: np.ndarray  # NaN: none
    interruptible: np.ndarray  # bool
    topology: ClusterTopology
    curve: object  # orchestrator.planning.perfmodel.PowerCurve
    cluster: ClusterConfig
    max_defer_s: float
    min_gpus: np.ndarray = None  # elastic range per job (equal to gpus: not elastic)
    max_gpus: np.ndarray = None
    tables: list = field(default_factory=list)  # per job: GPU count -> throughput, or None
    budget: object | None = None  # orchestrator.planning.budgets.Budget
    objective: str = "carbon"
    power_limit_w: float | None = None
    slot_s: float = 900.0
    checkpoint_s: float = DEFAULT_CHECKPOINT_S  # run time a suspension costs an interruptible job
    time_limit_s: float | None = None  # None: optimal stops on a node limit (deterministic)
    backfill: str = DEFAULT_BACKFILL  # conservative | easy | strict (planning.backfill)
    families: list[str] | None = None  # per job: its model's Gavel job type or family
    gpu_types: list[str | None] | None = None  # per job: the GPU type it asked for
    pair_speeds: dict | None = None  # (GPU type, job, partner) -> measured relative speed
    notes: list[str] = field(default_factory=list)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.topology.nodes)


def prepare(scenario: Scenario, base: Path, settings=None) -> SimInputs:
    from grid.steps import StepSeries
    from orchestrator.planning.devices.gputypes import curve
    from orchestrator.sim.hardware.devices import (
        job_families,
        keep_typed,
        leave_out,
        note_unknown_types,
        requested_types,
        typed_widest,
    )

    notes: list[str] = []
    signal = _load_signal(resolve_path(scenario.grid.source, base), scenario, settings)
    carbon, filled = StepSeries.from_signal(signal)
    if filled:
        notes.append(f"{filled} unknown carbon values were interpolated")
    price, price_unit = None, None
    if scenario.grid.price:
        price_signal = _load_signal(resolve_path(scenario.grid.price, base), scenario, settings)
        if price_signal.meta.quantity != "price_per_mwh":
            raise SpecError(f"{scenario.grid.price}: not a price signal")
        price, _ = StepSeries.from_signal(price_signal)
        price_unit = price_signal.meta.currency or price_signal.meta.unit
    topology = build_topology(scenario.cluster)
    total = sum(n.gpus for n in topology.nodes)
    jobs = _load_jobs(scenario, base, carbon.start_s, total)
    jobs = shift_onto(jobs, carbon.start_s, carbon.end_s)
    if jobs.shift_s and not jobs.relative:
        weeks = jobs.shift_s / (7 * 86400)
        if abs(weeks) >= 1:
            notes.append(f"the trace was moved by {weeks:+.0f} weeks onto the signal's year")
    inside = (jobs.submit_s >= carbon.start_s) & (jobs.submit_s < carbon.end_s)
    jobs = leave_out(jobs, inside, "submitted outside the signal", notes)
    jobs = leave_out(jobs, jobs.gpus <= total, "wider than the cluster", notes)
    jobs = keep_typed(jobs, topology, notes)
    note_unknown_types(topology, notes)
    before_skip = len(jobs)
    if scenario.jobs.skip_jobs:
        jobs = jobs.take(np.arange(min(scenario.jobs.skip_jobs, len(jobs)), len(jobs)))
    if scenario.jobs.max_jobs:
        jobs = jobs.head(scenario.jobs.max_jobs)
    if not len(jobs):  # say why, where jobs were left out (a type, a width, the signal)
        why = [n for n in notes if "left out" in n or "waiting for those" in n]
        if before_skip:
            why.append(f"skip_jobs {scenario.jobs.skip_jobs} leaves none of {before_skip}")
        raise SpecError(f"no jobs to simulate: {'; '.join(why)}" if why else
                        "no jobs to simulate in the signal's time range")  # fmt: skip
    rule = DeadlineRule(scenario.jobs.deadline_rule)
    zone_info(scenario.timezone)
    ruled = rule.deadlines(jobs.submit_s, jobs.duration_s, scenario.timezone)
    deadline = np.where(np.isnan(jobs.deadline_s), ruled, jobs.deadline_s)
    rng = np.random.default_rng([scenario.seed, 1])
    drawn = rng.uniform(0, 1, len(jobs)) < scenario.jobs.interruptible
    interruptible = np.where(jobs.interruptible >= 0, jobs.interruptible == 1, drawn)
    max_defer_s = parse_duration_s(scenario.max_defer)
    horizon = np.nanmax(np.concatenate((deadline, jobs.submit_s + jobs.duration_s)))
    horizon = max(horizon, float(jobs.submit_s[-1]) + max_defer_s) + MARGIN_S
    end_s = carbon.end_s
    carbon = carbon.extended(horizon)
    if price is not None:
        price = price.extended(horizon)
    cfg = scenario.cluster
    planning = _planning(scenario, price is not None)
    families = job_families(jobs.names, len(jobs), scenario.jobs.models, scenario.seed)
    min_gpus, max_gpus = elastic_ranges(jobs.gpus, scenario.jobs.elastic, scenario.seed, total)
    max_gpus = typed_widest(max_gpus, requested_types(jobs), topology)
    tables: list = []
    if scenario.jobs.elastic > 0 and jobs.names:
        folder = _scaling_folder(scenario.jobs.scaling, base)
        tables = scaling_tables(jobs.names, folder)
        known = sum(t is not None for t in tables)
        notes.append(f"{known} of {len(jobs)} jobs scale by the ElasticFlow tables")
    pair_speeds = None
    if scenario.jobs.share > 0 and scenario.jobs.pair_speeds != "model":
        pair_speeds = _pair_speeds(scenario.jobs.pair_speeds, base)
        notes.append(f"pairs run at Gavel's measured speeds ({len(pair_speeds)} measured)")
    inputs = SimInputs(
        scenario=scenario,
        carbon=carbon,
        carbon_end_s=end_s,
        price=price,
        price_unit=price_unit,
        signal_label=f"{signal.meta.zone} ({signal.meta.unit})",
        jobs=jobs,
        deadline_s=deadline,
        interruptible=interruptible.astype(bool),
        topology=topology,
        curve=curve(type_of(cfg.gpu)),
        cluster=cfg,
        max_defer_s=max_defer_s,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        tables=tables,
        families=families,
        pair_speeds=pair_speeds,
        gpu_types=requested_types(jobs),
        notes=notes,
        **planning,
    )
    check_limit(inputs)  # a limit no job could start under: refused; jobs it cannot hold
    return inputs


def _planning(scenario: Scenario, has_price: bool) -> dict:
    from orchestrator.planning.budgets import Budget
    from orchestrator.planning.policies.base import check_objective

    objective = check_objective(scenario.objective, has_price)
    return {
        "budget": Budget.parse(scenario.budget) if scenario.budget else None,
        "objective": objective,
        "power_limit_w": scenario.power_limit_w,
        "slot_s": parse_duration_s(scenario.slot),
        "backfill": scenario.backfill,
        "checkpoint_s": parse_checkpoint_s(scenario.jobs.checkpoint_cost),
        "time_limit_s": (
            parse_duration_s(scenario.time_limit) if scenario.time_limit is not None else None
        ),
    }


def _pair_speeds(text: str, base: Path) -> dict:
    """``[jobs] pair_speeds``: Gavel's measured pairs, from its throughputs JSON."""
    import os

    from orchestrator.planning.devices.interfit import measured_speeds

    if text == "measured":
        root = Path(os.environ.get("GRIDSHIFT_SHARED_DATA", "../shared/data"))
        path = root / "perf" / "gavel_simulation_throughputs.json"
    else:
        path = Path(os.path.expandvars(os.path.expanduser(text)))
        path = path if path.is_absolute() else base / path
    from orchestrator.queue.spec import loads_strict, read_text_file

    try:
        text = read_text_file(path, "Gavel's throughputs file")
    except SpecError as exc:
        raise SpecError(f"jobs.pair_speeds: {exc}") from None
    try:
        return measured_speeds(loads_strict(text))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, SyntaxError,
            RecursionError, MemoryError) as exc:  # fmt: skip
        raise SpecError(
            f"jobs.pair_speeds: {path} is not Gavel's throughputs JSON "
            f"(model | measured | a path to one): {type(exc).__name__}"
        ) from None


def _scaling_folder(text: str | None, base: Path) -> Path | None:
    import os

    if text:
        folder = Path(os.path.expandvars(os.path.expanduser(text)))
        folder = folder if folder.is_absolute() else base / folder
        if not folder.is_dir():
            raise SpecError(f"no such folder of scaling tables: {folder}")
        return folder
    root = Path(os.environ.get("GRIDSHIFT_SHARED_DATA", "../shared/data"))
    folder = root / "perf" / "elasticflow-a100"
    return folder if folder.is_dir() else None


def build_topology(cfg: ClusterConfig) -> ClusterTopology:
    from orchestrator.sim.hardware.devices import node_types

    if cfg.nodes:
        nodes = []
        try:
            for node, gpu in zip(cfg.nodes, node_types(cfg), strict=True):
                if node.nvlink_islands:
                    nodes.append(
                        NodeTopology.from_islands(node.name, node.nvlink_islands, node.rack, gpu)
                    )
                else:
                    nodes.append(NodeTopology.plain(node.name, node.gpu_count, node.rack, gpu))
            if not any(n.gpus for n in nodes):  # e.g. nvlink_islands = [[]]
                raise ValueError("no node has a GPU")
            return ClusterTopology(tuple(n for n in nodes if n.gpus))
        except ValueError as exc:
            raise SpecError(f"cluster: {exc}") from None
    nodes, left, i = [], cfg.gpus, 0
    while left > 0:
        size = min(cfg.gpus_per_node, left)
        rack = f"rack{i // cfg.nodes_per_rack:03d}"
        nodes.append(NodeTopology.plain(f"node{i:04d}", size, rack, type_of(cfg.gpu)))
        left -= size
        i += 1
    return ClusterTopology(tuple(nodes))


def _load_signal(spec: str, scenario: Scenario, settings):
    import httpx

    from grid.registry import build_source
    from grid.spec import parse_source
    from orchestrator.errors import boundary

    with boundary():
        if parse_source(spec).name in ("csv", "synthetic"):  # whole files: read once
            signal = build_source(spec, {}, httpx.Client()).load()
            if scenario.grid.start or scenario.grid.end:
                start, end = _utc(scenario.grid.start, scenario), _utc(scenario.grid.end, scenario)
                signal = signal.between(start, end)
        else:
            if not (scenario.grid.start and scenario.grid.end):
                raise SpecError(f"{spec}: a web source needs grid.start and grid.end")
            from orchestrator.settings import load_settings
            from orchestrator.signals.sources import open_chain

            chain = open_chain(settings or load_settings(), [spec])
            signal = chain.history(
                _utc(scenario.grid.start, scenario), _utc(scenario.grid.end, scenario)
            )
    if not len(signal.frame):
        raise GridDataError(f"{spec}: no data in the requested range")
    return signal


def _utc(value, scenario: Scenario):
    """grid.start or grid.end in UTC: a naive time is the scenario's local time (its
    ``timezone``, UTC by default: a what-if reads the same on every machine)."""
    from datetime import UTC

    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone_info(scenario.timezone))
    return value.astimezone(UTC)


def _load_jobs(scenario: Scenario, base: Path, start_s: float, total_gpus: int) -> TraceJobs:
    source = scenario.jobs.source.strip()
    if source == "synthetic" or source.startswith("synthetic:"):
        from orchestrator.sim.synthetic import synthetic_jobs

        return synthetic_jobs(source, start_s, scenario.seed, max_gpus=total_gpus)
    return read_trace(resolve_path(source, base))
