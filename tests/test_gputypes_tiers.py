"""Mixed GPU types in the planner's capacity (``planning.policies.tiers``): a job wider
than a small type's GPUs is planned on the GPUs of the types that can hold it, not on the
pool of every type's."""

from __future__ import annotations

import json

import numpy as np

from grid.forecasters import StepForecaster
from grid.steps import StepSeries
from orchestrator.planning.policies.base import Commitment, QueuedJob, Snapshot
from orchestrator.planning.policies.budget import BudgetPlanner
from orchestrator.planning.policies.tiers import Tiers, type_tiers

H = 3600.0


def test_type_tiers_nest_the_larger_types():
    assert type_tiers(None) == [] and type_tiers({}) == []
    assert type_tiers({"v100": 8}) == []
    assert type_tiers({"v100": 16, "p100": 16}) == []  # as wide as each other: the pool
    assert type_tiers({"v100": 8, "k80": 4}) == [(4, frozenset({"v100"}), 8)]
    three = type_tiers({"a100": 8, "v100": 16, "k80": 4})
    assert three == [(8, frozenset({"v100"}), 16), (4, frozenset({"v100", "a100"}), 24)]
    # a type with no GPUs (a CPU-only node's) holds nobody: the pool is the one type's
    assert type_tiers({"v100": 8, None: 0}) == []
    assert type_tiers({"v100": 8, "k80": 4, None: 0}) == [(4, frozenset({"v100"}), 8)]


def test_tiers_take_by_width_or_by_type():
    tiers = Tiers({"a100": 8, "v100": 16, "k80": 4}, 3)
    assert tiers.need(2) == [0.0, 0.0]  # any type holds it: the pool's only
    assert tiers.need(6) == [0.0, 6.0]  # an A100 or a V100
    assert tiers.need(12) == [12.0, 12.0]  # V100s only
    assert tiers.need(40) == [16.0, 24.0]  # across types: whole nodes, the largest first
    assert tiers.need(1, "k80") == [0.0, 0.0] and tiers.need(1, "a100") == [0.0, 1.0]
    free = tiers.free.copy()
    tiers.take(free, 12, 1, 3)
    tiers.take(free, -12, 2, 3)  # given back
    assert free.tolist() == [[16, 4, 16], [24, 12, 24]]


def _plan(type_gpus):
    """An 8-GPU job due now on 8 V100s + 4 K80s, with 3 V100s busy for a day, and six
    one-GPU jobs: the budget planner's plan."""
    now = 0.0
    flat = StepForecaster(StepSeries(now, 900.0, np.full(400, 300.0)))
    wide = QueuedJob(1, 8, now, duration_s=H, deadline_s=now + 2 * H)
    narrow = [QueuedJob(i, 1, now, duration_s=H, deadline_s=now + 6 * H) for i in range(2, 8)]
    snap = Snapshot(now, [wide, *narrow], flat)
    snap.total_gpus = 12
    snap.type_gpus = type_gpus
    snap.committed = [Commitment(100 + k, 1, 300.0, now, now + 24 * H, "v100") for k in range(3)]
    return BudgetPlanner().plan(snap)


def test_a_wide_job_is_not_planned_on_gpus_its_type_lacks():
    plan = _plan({"v100": 8, "k80": 4})
    # 5 V100s free: the 8-GPU job waits for the running jobs (its deadline missed, it is
    # forced; at the horizon's end, 6 h: none in it frees the V100s), and the narrow ones
    # are planned now; on the pool (9 free) the 8-GPU job would be planned now, and four
    # narrow jobs after it, on GPUs nobody can give them
    assert plan[1].start_s >= 6 * H and plan[1].forced
    assert all(plan[i].start_s < H for i in range(2, 8))
    pooled = _plan(None)
    assert pooled[1].start_s == 0.0 and max(pooled[i].start_s for i in range(2, 8)) >= H


def _run(tmp_path, jobs: list[dict], nodes: list[dict]):
    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    scenario = Scenario.model_validate(
        {
            "policies": ["budget"],
            "jobs": {"source": str(trace), "deadline_rule": "none", "models": "none",
                     "interruptible": 0.0},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpu": "v100", "nodes": nodes},
        }
    )  # fmt: skip
    outcome = simulate(scenario, tmp_path)
    return outcome.runs["budget"], outcome.inputs


def test_sim_a_few_slow_gpus_do_not_hold_up_the_queue(tmp_path):
    nodes = [{"name": "v", "gpus": 8, "gpu": "v100"}, {"name": "k", "gpus": 4, "gpu": "k80"}]
    jobs = [
        {"submit": 0, "duration": 40 * H, "gpus": 1, "within": "3d"},  # on a V100
        {"submit": 60, "duration": H, "gpus": 8, "within": "3h"},  # waits for it: late
        *({"submit": 120 + i, "duration": H, "gpus": 1, "within": "6h"} for i in range(8)),
    ]
    run, inputs = _run(tmp_path, jobs, nodes)
    late = run.finish_s > inputs.deadline_s + 1.0
    # only the 8-GPU job, which no plan can start before the first job leaves a V100;
    # before, the planner put it on 8 of the 11 free GPUs of both types at every replan
    # and the one-GPU jobs after it: three of them waited past their deadlines
    assert np.flatnonzero(late).tolist() == [1]
    assert run.first_start_s[1] >= run.finish_s[0]


def test_planner_types_from_the_daemons_topology():
    from orchestrator.daemon.energy.gputypes import planner_types
    from placement.topology import ClusterTopology, NodeTopology

    nodes = [("v", 8, "v100"), ("k", 4, "k80"), ("k2", 4, "k80")]
    topo = ClusterTopology(tuple(NodeTopology.plain(n, g, "r", gpu=t) for n, g, t in nodes))
    held = {1: ("v",), 2: ("k", "k2"), 3: ("v", "k"), 4: ("gone",)}
    per_type, on = planner_types(topo, held)
    assert per_type == {"v100": 8, "k80": 8}
    assert on == {1: "v100", 2: "k80", 3: None, 4: None}  # several types, or no node known
    one = ClusterTopology((NodeTopology.plain("v", 8, "r", gpu="v100"),))
    assert planner_types(one, {1: ("v",)}) == (None, {})


def test_the_daemons_planner_plans_a_wide_job_on_its_types_gpus():
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.queue.models import Job

    t0 = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)
    series = StepSeries(t0.timestamp() - 6 * H, 900.0, np.full(400, 300.0))
    feed = SimpleNamespace(series=lambda: series, age_s=lambda now: 0.0, version=1, last_error=None)

    def job(i: int, gpus: int, within_h: float, run_s: float = H) -> Job:
        return Job(
            id=i, state="queued", user="alice", uid=1000, command=["true"], workdir="/",
            gpus_min=gpus, gpus_max=gpus, submitted_at=t0, duration_s=run_s,
            deadline=t0 + timedelta(hours=within_h),
        )  # fmt: skip

    queued = [job(1, 8, 2), *(job(i, 1, 6) for i in range(2, 8))]
    running = [(job(100 + k, 1, 48, 24 * H), 1, t0) for k in range(3)]
    types = ({"v100": 8, "k80": 4}, {100: "v100", 101: "v100", 102: "v100"})

    def plan(types):
        planner = LivePlanner(resolve_policy("budget"), 900.0, curve_for("v100"), feed=feed)
        planner.schedule(t0, queued, {}, running, 12, 8, 0.0, types=types)
        return {j.id: planner._plan[j.id].start_s - t0.timestamp() for j in queued}

    typed, pooled = plan(types), plan((None, {}))
    # 5 V100s free for a day: the 8-GPU job is not planned now, the narrow ones are
    assert typed[1] >= 6 * H and all(typed[i] < H for i in range(2, 8))
    assert pooled[1] == 0.0 and max(pooled[i] for i in range(2, 8)) >= H  # the pool's plan
