"""Resizing running elastic jobs (``orchestrator.planning.resize``): the pure decisions,
and the simulator carrying them out through the one pass (narrow start, shrink, grow)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from orchestrator.planning.onepass import Running
from orchestrator.planning.policies.base import Commitment, QueuedJob
from orchestrator.planning.resize import (
    narrow_width,
    peak_held,
    plan_grows,
    plan_shrinks,
    resizable,
    run_s,
    settle_s,
    wait_s,
)
from orchestrator.planning.resizestep import by_node, fits_after, node_wait_s, reserve_resized

H = 3600.0


def _job(i=1, gpus=4, lo=2, hi=8, duration=10 * H, ckpt=300.0, interruptible=True):
    return QueuedJob(i, gpus, 0.0, duration_s=duration, interruptible=interruptible,
                     min_gpus=lo, max_gpus=hi, checkpoint_s=ckpt)  # fmt: skip


def _run(job, width, left=None, end=None, key=None):
    return Running(key or ("job", job.id), job, left if left is not None else job.duration_s,
                   gpus=width, end_s=end, elastic=True)  # fmt: skip


def _any(_w, _moves=None):
    return True


def test_run_time_scales_by_the_models_default_speedup():
    job = _job(gpus=4)
    assert run_s(job, 10 * H, 4) == pytest.approx(10 * H)
    # 90 % per doubling: 8 GPUs are 1.8x as fast as 4
    assert run_s(job, 10 * H, 8) == pytest.approx(10 * H / 1.8)


def test_a_grow_is_planned_only_when_its_gain_exceeds_the_restart_cost():
    job = _job(gpus=4, hi=8)
    run = _run(job, 4, left=H)  # 1 h left at 4 GPUs: 8 GPUs save 26.7 min
    (grow,) = plan_grows([run], spare=4, fits=_any)
    assert (grow.from_gpus, grow.to_gpus) == (4, 8)
    assert grow.gain_s == pytest.approx(H - H / 1.8 - 300.0)
    costly = _run(_job(gpus=4, hi=8, ckpt=H), 4, left=H)  # a restart costs more than it saves
    assert plan_grows([costly], spare=4, fits=_any) == []
    # the plans that stand hold 3 of the 4 spare GPUs while it would run: it grows by 1
    (small,) = plan_grows([run], spare=4, fits=_any, held=lambda _until: 3)
    assert small.to_gpus == 5
    fixed = _run(_job(lo=4, hi=4), 4)  # no range: never resized
    planned = replace(run, elastic=False)  # running a piece of its plan: keeps it
    assert plan_grows([planned], spare=4, fits=_any) == []
    rigid = _run(_job(interruptible=False), 4)  # may not be suspended: never resized
    assert plan_grows([fixed, rigid], spare=4, fits=_any) == []


def test_a_shrink_makes_room_only_when_the_wait_it_saves_exceeds_what_it_costs():
    big = _run(_job(1, gpus=8, lo=2, hi=8), 8, left=5 * H)
    # a 4-GPU job would wait 5 h: shrinking the big one to 4 costs it 5 h * 0.8 + 5 min
    (shrink,) = plan_shrinks(4, 5 * H, 0, [big], fits=_any)
    assert (shrink.from_gpus, shrink.to_gpus) == (8, 4)
    lost = run_s(big.job, 5 * H, 4) - run_s(big.job, 5 * H, 8) + 300.0
    assert lost < 5 * H
    assert plan_shrinks(4, lost - 1.0, 0, [big], fits=_any) == [], "not worth it"
    assert plan_shrinks(4, 5 * H, 0, [big], fits=lambda *_: False) == [], "does not fit"
    assert plan_shrinks(4, 5 * H, 4, [big], fits=_any) == [], "it fits already"
    # two candidates: the cheaper per GPU gives them (the one with less left to run)
    short = _run(_job(2, gpus=8, lo=4, hi=8), 8, left=H, key=("job", 2))
    (pick,) = plan_shrinks(4, 5 * H, 0, [big, short], fits=_any)
    assert pick.job_id == 2 and pick.to_gpus == 4


def test_a_blocked_job_starts_narrower_when_it_finishes_sooner_that_way():
    job = _job(gpus=8, lo=2, hi=8, duration=4 * H)
    fits_4 = lambda n: n <= 4  # noqa: E731
    assert narrow_width(job, 8, 2 * H, fits_4) == 4  # starts now on 4, grows in 2 h
    assert narrow_width(job, 8, 60.0, fits_4) is None  # 8 GPUs free in a minute: waits
    assert narrow_width(job, 8, math.inf, fits_4) == 4  # nobody knows when: starts
    rigid = _job(gpus=8, lo=2, hi=8, duration=4 * H, interruptible=False)
    # on 4 GPUs without a grow it takes 7.2 h; waiting 2 h then 4 h is sooner
    assert narrow_width(rigid, 8, 2 * H, fits_4) is None
    assert narrow_width(rigid, 8, 4 * H, fits_4) == 4


def test_wait_counts_gpus_freed_by_running_jobs_in_order_of_their_ends():
    runs = [_run(_job(1), 2, end=3 * H), _run(_job(2), 4, end=H), _run(_job(3), 2, end=None)]
    assert wait_s(4, 0, runs, 0.0) == H
    assert wait_s(6, 0, runs, 0.0) == 3 * H
    assert wait_s(8, 0, runs, 0.0) == math.inf
    assert wait_s(2, 2, runs, 0.0) == 0.0


def test_peak_held_is_the_most_gpus_held_at_once_in_the_window():
    c = [Commitment(1, 2, 0.0, 0.0, 10.0), Commitment(2, 3, 0.0, 5.0, 20.0),
         Commitment(3, 4, 0.0, 30.0, 40.0)]  # fmt: skip
    assert peak_held(c, 0.0, 25.0) == 5
    assert peak_held(c, 12.0, 25.0) == 3
    assert peak_held(c, 0.0, 4.0) == 2


def test_fits_after_leaves_the_allocator_as_it_was():
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    alloc = ClusterAllocator(ClusterTopology((NodeTopology("a", tuple(range(8))),)))
    alloc.allocate(("job", 1), 4)
    alloc.allocate(("job", 2), 2)
    before = alloc.allocations()
    assert fits_after(alloc, 4, {("job", 1): 2})  # job 1 on 2, and 4 more
    assert not fits_after(alloc, 6, {("job", 1): 2})
    assert fits_after(alloc, 0, {("job", 2): 4})  # job 2 grows into the 2 free
    assert not fits_after(alloc, 0, {("job", 2): 6})
    assert alloc.allocations() == before and alloc.free_gpus == 2


# -- the simulator carries them out ----------------------------------------------------
T0 = "2023-03-01T00:00:00"


def _sim(tmp_path, rows, ranges, checkpoint="5m", policy="fifo", budget=None):
    """``policy`` (fifo) on one 8-GPU node; ``ranges``: per job (min, max) GPUs."""
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.sim.engine import SimDaemon
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.runner import make_forecaster
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scenario = Scenario.model_validate(
        {
            "policies": [policy],
            "jobs": {"source": str(trace), "checkpoint_cost": checkpoint},
            "grid": {"source": f"synthetic:days={4 if budget else 3}&start=2023-03-01"},
            "cluster": {"gpus": 16 if budget else 8, "gpus_per_node": 8},
            **({"budget": budget} if budget else {}),
        }
    )
    inputs = prepare(scenario, tmp_path)
    inputs.min_gpus = np.array([lo for lo, _ in ranges])
    inputs.max_gpus = np.array([hi for _, hi in ranges])
    sim = SimDaemon(inputs, resolve_policy(policy), make_forecaster("perfect", inputs, 0))
    widths: list[tuple[int, int]] = []  # (job, GPUs) of each start
    launch = sim.launch

    def launched(job, decision, allocation, now):
        launch(job, decision, allocation, now)
        widths.append((job.id, sim._running[sim._attempt_id].gpus))

    sim.launch = launched
    result = sim.run()
    t0 = float(inputs.jobs.submit_s[0])
    return sim, result, widths, (result.finish_s - t0) / H


def test_the_simulator_grows_a_job_into_gpus_that_freed_up(tmp_path):
    rows = [
        {"submit": T0, "duration": "1h", "gpus": 4},
        {"submit": T0, "duration": "10h", "gpus": 4, "interruptible": True},
    ]
    sim, result, widths, finish_h = _sim(tmp_path, rows, [(4, 4), (2, 8)])
    assert widths == [(0, 4), (1, 4), (1, 8)], "grew from 4 to 8 once job 0 ended"
    assert sim.onepass.resizer.grows == 1
    # 1 h on 4, then 9 h of work at 1.8x, plus the 5-minute restart
    assert finish_h[1] == pytest.approx(1 + 9 / 1.8 + 5 / 60 * 1.0, abs=0.01)
    # all its work was done: its GPU-hours sum its widths over time
    gpu_h = float(np.sum((result.seg_end_s - result.seg_start_s) * result.seg_gpus)) / H
    assert gpu_h == pytest.approx(4 * 1 + 4 * 1 + 8 * (9 / 1.8 + 5 / 60), abs=0.02)
    # a restart that costs more than the grow saves: it stays on 4
    # (it asks for 8: with a 6 h restart it waits the hour for them rather than start on 4)
    _, _, widths, finish_h = _sim(tmp_path, rows, [(4, 4), (2, 8)], checkpoint="6h")
    assert widths == [(0, 4), (1, 8)] and finish_h[1] == pytest.approx(1 + 10 / 1.8, abs=0.01)


def test_the_simulator_shrinks_a_running_job_to_start_a_blocked_one(tmp_path):
    rows = [
        {"submit": T0, "duration": "10h", "gpus": 8, "interruptible": True},
        {"submit": "2023-03-01T00:10:00", "duration": "1h", "gpus": 4},
    ]
    sim, result, widths, finish_h = _sim(tmp_path, rows, [(2, 8), (4, 4)])
    # job 1 starts first, on the GPUs job 0 left; job 0 again on the other 4
    assert widths[:3] == [(0, 8), (1, 4), (0, 4)], "job 0 gave 4 GPUs to job 1 at once"
    assert sim.onepass.resizer.shrinks == 1
    assert result.first_start_s[1] == pytest.approx(float(sim.inputs.jobs.submit_s[1]))
    assert widths[3:] == [(0, 8)], "and grew back once job 1 ended"
    assert finish_h[1] == pytest.approx(10 / 60 + 1, abs=0.01)


def test_the_simulator_starts_a_blocked_elastic_job_narrower(tmp_path):
    rows = [
        {"submit": T0, "duration": "5h", "gpus": 4},
        {"submit": "2023-03-01T00:10:00", "duration": "4h", "gpus": 8, "interruptible": True},
    ]
    sim, result, widths, _ = _sim(tmp_path, rows, [(4, 4), (2, 8)])
    assert widths == [(0, 4), (1, 4), (1, 8)], "on the 4 free GPUs, grown to 8 at 5 h"
    assert sim.onepass.resizer.narrow == 1 and sim.onepass.resizer.grows == 1
    assert result.first_start_s[1] == pytest.approx(float(sim.inputs.jobs.submit_s[1]))


def test_the_wait_is_per_node_for_a_job_that_fits_one():
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    nodes = (NodeTopology("a", tuple(range(4))), NodeTopology("b", tuple(range(4))))
    alloc = ClusterAllocator(ClusterTopology(nodes))
    alloc.hold(("job", 1), "a", [0, 1])  # ends in 3 h
    alloc.hold(("job", 2), "b", [0, 1])  # ends in 1 h
    runs = [_run(_job(1), 2, end=3 * H, key=("job", 1)), _run(_job(2), 2, end=H, key=("job", 2))]
    where = by_node(alloc, runs)
    assert {n: [r.key for r in rs] for n, rs in where.items()} == {
        "a": [("job", 1)],
        "b": [("job", 2)],
    }
    # a 4-GPU job: b is free in 1 h (a count of free GPUs, 2 + 2, says now)
    assert node_wait_s(4, alloc, where, 0.0) == H
    assert wait_s(4, alloc.free_gpus, runs, 0.0) == 0.0


def test_an_attempt_is_not_resized_before_it_has_settled():
    """A grow (or shrink) SIGTERMs the job: not before it has run its restart cost (and a
    few passes), else it dies before its handler is installed (review finding 1)."""
    job = _job(gpus=4, hi=8, ckpt=30.0)
    settled = _run(job, 4, left=H)
    assert settle_s(job) == 30.0 and resizable(settled)
    young = replace(settled, age_s=29.0)
    assert not resizable(young)
    assert plan_grows([young], spare=4, fits=_any) == []
    assert plan_shrinks(8, 10 * H, 4, [young], _any) == []
    assert not resizable(replace(settled, job=replace(job, checkpoint_s=0.0), age_s=0.5))


def test_the_simulator_starts_an_elastic_job_at_its_widest_and_does_not_grow_it_at_once(
    tmp_path,
):
    """It asks for the widest width of its range, as the daemon does (finding 7: it
    started on its traced 4 and grew to 8 at the same instant, at no cost)."""
    rows = [{"submit": T0, "duration": "10h", "gpus": 4, "interruptible": True}]
    _, result, widths, finish_h = _sim(tmp_path, rows, [(2, 8)])
    assert widths == [(0, 8)] and result.suspensions == 0
    assert finish_h[0] == pytest.approx(10 / 1.8, abs=0.01)


def test_the_simulator_keeps_a_shrunk_jobs_width_through_a_joint_replan(tmp_path):
    """A job shrunk for the head starts again at once on its new width, although a joint
    replan (budget-fifo) plans it again (finding 5: it was replanned on 8 and waited an
    hour with 4 GPUs free)."""
    rows = [
        {"submit": T0, "duration": "10h", "gpus": 8, "interruptible": True},
        {"submit": "2023-03-01T00:10:00", "duration": "1h", "gpus": 4},
    ]
    _, _, widths, _ = _sim(tmp_path, rows, [(2, 8), (4, 4)], policy="budget-fifo")
    assert widths[:3] == [(0, 8), (1, 4), (0, 4)], "job 0 again at once on the other 4"


def test_a_job_running_under_a_power_cap_its_plan_chose_is_not_resized():
    """``budget`` starts jobs on few GPUs under a cap to keep its budget: the resize step
    does not grow them uncapped (finding 1: grown to 8 GPUs at cap 1.0 as it launched)."""
    from types import SimpleNamespace

    from orchestrator.planning.policies.base import Decision
    from orchestrator.sim.elastic import may_resize

    def attempt(decision):
        return SimpleNamespace(suspend_event=None, decision=decision)

    assert may_resize(attempt(Decision(0.0)))
    assert not may_resize(attempt(Decision(0.0, gpus=4, cap=0.75)))


def test_the_gpus_a_pending_grow_waits_for_are_held_until_it_starts_again():
    """While a grow checkpoints, the GPUs it grows into are held (``("resize", job)``) so
    that a launch meanwhile does not take them; a shrink holds nothing, nor a job that
    has left (finding 4: a newcomer took them, the job restarted on 2 for no gain)."""
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    nodes = (NodeTopology("a", tuple(range(4))), NodeTopology("b", tuple(range(4))))
    alloc = ClusterAllocator(ClusterTopology(nodes))
    alloc.hold(("attempt", 7), "a", [0, 1])  # job 1, growing from 2 to 4
    alloc.hold(("attempt", 8), "b", [0, 1, 2, 3])  # job 2, shrinking from 4 to 2
    reserve_resized(alloc, {1: (("attempt", 7), 4), 2: (("attempt", 8), 2), 3: (("x", 9), 4)})
    assert alloc.allocation(("resize", 1)).parts == (("a", (2, 3)),)
    assert alloc.allocation(("resize", 2)) is None and alloc.allocation(("resize", 3)) is None
    assert alloc.free_gpus == 0 and alloc.allocate(("job", 5), 2) is None


def test_no_grow_is_planned_on_a_node_where_a_resize_is_under_way():
    """What is free on a node while a job there checkpoints may be promised to it; jobs
    on other nodes still grow (finding 8: one slow checkpoint held every grow back)."""
    from types import SimpleNamespace

    from orchestrator.planning.resizestep import Resizer
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    alloc = ClusterAllocator(ClusterTopology((NodeTopology("a", tuple(range(8))),)))
    alloc.hold(("job", 1), "a", [0, 1])
    alloc.hold(("job", 2), "a", [2, 3])
    one = _run(_job(1, gpus=2, lo=2, hi=4), 2, left=10 * H, key=("job", 1))
    two = replace(_run(_job(2, gpus=2, lo=2, hi=4), 2, left=10 * H, key=("job", 2)),
                  checkpointing=True)  # fmt: skip
    resized = []
    state = SimpleNamespace(
        alloc=alloc,
        running=lambda _now: [one, two],
        resize=lambda run, width, _now: resized.append((run.job.id, width)) or True,
        reap=lambda _now: None,
    )
    p = SimpleNamespace(state=state, scheduler=SimpleNamespace(planned=lambda: []),
                        plan=lambda _now: None, launch=lambda _now: None)  # fmt: skip
    Resizer()._grow(p, 0.0)
    assert resized == []
    Resizer()._grow(replace_state(p, [one]), 0.0)
    assert resized == [(1, 4)]
    elsewhere = ClusterAllocator(ClusterTopology(
        (NodeTopology("a", tuple(range(4))), NodeTopology("b", tuple(range(4))))
    ))  # fmt: skip
    elsewhere.hold(("job", 1), "a", [0, 1])
    elsewhere.hold(("job", 2), "b", [0, 1])
    resized.clear()
    p.state.alloc = elsewhere
    Resizer()._grow(p, 0.0)
    assert resized == [(1, 4)], "job 2 checkpoints on node b: job 1 grows on a"


def replace_state(p, runs):
    from types import SimpleNamespace

    return SimpleNamespace(**{**vars(p), "state": SimpleNamespace(**{**vars(p.state),
                           "running": lambda _now: runs})})  # fmt: skip


def test_a_grow_leaves_the_gpus_a_plan_without_an_end_holds_from_its_start():
    """``fifo`` and ``lowest-window`` plan no end: the plan holds its GPUs from its start
    for its run time (finding 2: a grow ignored it, then was shrunk back for it)."""
    from orchestrator.planning.policies.base import Decision
    from orchestrator.planning.resizestep import plans_held

    later = QueuedJob(2, 4, 0.0, duration_s=H)
    unknown = QueuedJob(3, 2, 0.0)
    (a, b) = plans_held([(later, Decision(5 * H)), (unknown, Decision(6 * H))])
    assert (a.gpus, a.start_s, a.end_s) == (4, 5 * H, 6 * H)
    assert (b.gpus, b.start_s, b.end_s) == (2, 6 * H, math.inf)
    # a 10-hour job on 4 of 8 GPUs may not grow into the 4 the plan at 5 h holds
    run = _run(_job(gpus=4, hi=8, duration=10 * H), 4)
    held = lambda until: peak_held([a], 0.0, until)  # noqa: E731
    assert plan_grows([run], spare=4, fits=_any, held=held) == []
