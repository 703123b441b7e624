"""Run a scenario under each policy and collect the JSON the CLI prints:
``{"scenario": ..., "policies": {name: {carbon_kg, energy_kwh, cost, ...}}}``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import SpecError
from orchestrator.planning.policies import resolve_policy
from orchestrator.sim.hardware.colocation import daemon_class
from orchestrator.sim.inputs import SimInputs, prepare
from orchestrator.sim.metrics import metrics
from orchestrator.sim.result import RunResult
from orchestrator.sim.scenario import Scenario

# ``optimal``/``oracle`` in a what-if run without ``time_limit``: HiGHS stops after this
# many branch-and-bound nodes (the same answer on every machine), with the wall clock only
# as a safety net (a solve it cuts short gives way to ``budget``'s plan).
NODE_LIMIT = 500
SAFETY_LIMIT_S = 600.0

Progress = Callable[[str, float], None]  # (policy, share of simulated time done)


@dataclass
class Outcome:
    inputs: SimInputs
    runs: dict[str, RunResult] = field(default_factory=dict)
    results: dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> dict:
        s, inp = self.inputs.scenario, self.inputs
        return {
            "scenario": {
                "name": s.name,
                "jobs": len(inp.jobs),
                "job_source": s.jobs.source,
                "grid": s.grid.source,
                "price": s.grid.price,
                "gpus": inp.total_gpus,
                "deadline_rule": s.jobs.deadline_rule,
                "interruptible": s.jobs.interruptible,
                "elastic": s.jobs.elastic,
                "share": s.jobs.share,  # co-location: its pair speeds and moves
                "pair_speeds": s.jobs.pair_speeds,
                "moves": s.jobs.moves,
                "skip_jobs": s.jobs.skip_jobs,
                "objective": inp.objective,
                "budget": str(inp.budget) if inp.budget is not None else None,
                "power_limit_w": inp.power_limit_w,
                "slot_s": inp.slot_s,
                "backfill": inp.backfill,
                "checkpoint_s": inp.checkpoint_s,
                "forecast": s.forecast,
                "seed": s.seed,
                "timezone": s.timezone,
                "start": _iso(float(inp.jobs.submit_s.min())),
                "price_unit": inp.price_unit,
                "notes": inp.notes,
            },
            "policies": self.results,
        }


def simulate(
    scenario: Scenario,
    base: Path,
    *,
    settings=None,
    progress: Progress | None = None,
    inputs: SimInputs | None = None,
) -> Outcome:
    policies = [resolve_policy(name) for name in scenario.policies]
    if len({p.name for p in policies}) != len(policies):
        raise SpecError("a policy is named twice")
    inputs = inputs or prepare(scenario, base, settings)
    forecaster = make_forecaster(scenario.forecast, inputs, scenario.seed)
    outcome = Outcome(inputs)
    span = max(1.0, float(inputs.jobs.submit_s[-1] - inputs.jobs.submit_s[0]))
    first = float(inputs.jobs.submit_s[0])
    for policy in policies:
        if hasattr(policy, "time_limit_s"):  # optimal, oracle
            clairvoyant = getattr(policy, "clairvoyant", False)
            if inputs.time_limit_s is None:
                policy.node_limit = NODE_LIMIT * (10 if clairvoyant else 1)
                policy.time_limit_s = SAFETY_LIMIT_S * (10 if clairvoyant else 1)
            else:  # as asked: the answer may depend on the machine's speed
                policy.time_limit_s = inputs.time_limit_s * (10 if clairvoyant else 1)
        report = None
        if progress is not None:
            name = policy.name

            def report(now: float, name=name) -> None:
                progress(name, min(1.0, (now - first) / span))

        run = daemon_class(inputs)(inputs, policy, forecaster, progress=report).run()
        if progress is not None:
            progress(policy.name, 1.0)
        outcome.runs[policy.name] = run
    common_window([outcome])
    return outcome


def common_window(outcomes: list[Outcome]) -> None:
    """Each run's metrics, its idle energy counted over one window for all runs of these
    outcomes (from the first arrival to the latest end of any: each run's last idle draw
    held to it), so that policies and settings compare on the same hours."""
    runs = [run for o in outcomes for run in o.runs.values() if run.idle is not None]
    end_s = max((float(r.idle.end_s[-1]) for r in runs), default=0.0)
    for o in outcomes:
        for name, run in o.runs.items():
            if run.idle is not None:
                run.idle = run.idle.padded(end_s)
            o.results[name] = metrics(o.inputs, run)


def make_forecaster(text: str, inputs: SimInputs, seed: int):
    from grid.errors import SourceSpecError
    from grid.forecasters import step_forecaster

    try:
        return step_forecaster(text, inputs.carbon, seed)
    except SourceSpecError as exc:
        raise SpecError(str(exc)) from None


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()
