"""Co-location moves in what-if runs: while a job waits for GPUs, a job alone that may
share and be interrupted is checkpointed and restarted next to another job alone when the
pair saves more than twice what the checkpoint costs; never a job that may not be
interrupted, never past a deadline, never for a pair that ends too soon to pay, never
while nothing waits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.planning.devices.interference import (
    MOVE_MARGIN,
    move_gain_j,
    pair_saving_j,
    shared_power_w,
)
from orchestrator.planning.policies import resolve_policy
from orchestrator.sim.hardware.colocation import daemon_class
from orchestrator.sim.inputs import prepare
from orchestrator.sim.runner import make_forecaster
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
A, B = "Recommendation (batch size 4096)", "LM (batch size 20)"  # V100: 0.89, 0.85 paired
OTHER = "A3C"
H = 3600.0


def _scenario(tmp_path, rows, interruptible=1.0, checkpoint="5m", moves=True) -> Scenario:
    trace = tmp_path / "jobs.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {
                "source": str(trace), "deadline_rule": "none", "share": 1.0,
                "interruptible": interruptible, "checkpoint_cost": checkpoint, "elastic": 0.0,
                "moves": moves,
            },
            "grid": {"source": "synthetic:days=14&start=2023-04-28"},
            "cluster": {"gpus": 3, "gpus_per_node": 3, "gpu": "v100"},
        }
    )  # fmt: skip


def _rows(duration="4h", a_within=None, waiting=True):
    """A and B start at once on two of the three GPUs, each alone (a pair forms only with
    a job already running). A job needing two GPUs arrives at 10:25 and waits: a move
    (due in that pass: both have run 20 min, twice the checkpoint plus 10 min) lets it
    start. One more arrives at 10:40."""
    rows = [
        {"submit": "2023-05-01T10:00:00", "duration": duration, "gpus": 1, "name": A},
        {"submit": "2023-05-01T10:00:00", "duration": duration, "gpus": 1, "name": B},
        {"submit": "2023-05-01T10:25:00", "duration": "10m", "gpus": 2, "name": OTHER},
        {"submit": "2023-05-01T10:40:00", "duration": "10m", "gpus": 1, "name": OTHER},
    ]
    if not waiting:
        del rows[2]
    if a_within:
        rows[0]["within"] = a_within
        rows[1]["within"] = a_within
    return rows


def _run(scenario: Scenario):
    inputs = prepare(scenario, ROOT)
    daemon = daemon_class(inputs)(
        inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0)
    )
    return inputs, daemon, daemon.run()


def _energy_j(run) -> float:
    return float(np.sum(run.seg_power_w * (run.seg_end_s - run.seg_start_s)))


def test_move_gain_is_the_pairs_saving_less_twice_the_checkpoint():
    # equal draws, speeds 0.8 each: the pair draws 1.1 x 300 W for 1.6 units of work
    saving = pair_saving_j(300.0, 300.0, 0.8, 0.8, 3600.0)
    assert saving == pytest.approx((480.0 - shared_power_w(300.0, 300.0)) * 3600.0)
    gain = move_gain_j(300.0, 300.0, 0.8, 0.8, 4 * H, 2 * H, 300.0)
    overlap = min((4 * H + 300.0) / 0.8, 2 * H / 0.8)
    assert gain == pytest.approx(
        pair_saving_j(300.0, 300.0, 0.8, 0.8, overlap) - MOVE_MARGIN * 300 * 300
    )
    assert move_gain_j(300.0, 300.0, 0.8, 0.8, 4 * H, 60.0, 300.0) < 0  # the host ends soon
    assert move_gain_j(300.0, 300.0, 0.5, 0.55, 4 * H, 4 * H, 300.0) < 0  # sharing costs more
    assert move_gain_j(300.0, 300.0, 0.0, 0.9, 4 * H, 4 * H, 300.0) == -np.inf  # do not fit


def test_a_job_alone_moves_next_to_another_and_the_pair_saves_energy(tmp_path):
    inputs, daemon, run = _run(_scenario(tmp_path, _rows()))
    assert daemon.moves == 1 and run.moves == 1
    assert run.suspensions == 1  # a move is a checkpoint and a restart
    waits = inputs.jobs.submit_s[2]
    assert sorted(daemon.pairs[0][:2]) == [0, 1]
    assert daemon.pairs[0][2] == pytest.approx(waits)  # at once, as the job waits
    assert run.first_start_s[2] == pytest.approx(waits)  # the waiting job started
    _, off, _ = _run(_scenario(tmp_path, _rows(), moves=False))
    assert off.moves == 0  # moves are off by default ([jobs] moves)
    _, still, alone = _run(_scenario(tmp_path, _rows(), interruptible=0.0))
    assert still.moves == 0  # neither may be interrupted: no move
    assert all(sorted(p[:2]) != [0, 1] for p in still.pairs)
    assert _energy_j(run) < 0.85 * _energy_j(alone)  # the checkpoint included


def test_no_move_for_a_pair_that_ends_too_soon_to_pay(tmp_path):
    # 35 min each: at 10:25, when a job starts waiting, ten minutes are left: the pair
    # would save less than twice the checkpoint's worth
    _, daemon, run = _run(_scenario(tmp_path, _rows(duration="35m")))
    assert daemon.moves == 0 and run.suspensions == 0
    assert all(sorted(p[:2]) != [0, 1] for p in daemon.pairs)  # the third may join one


def test_no_move_that_would_break_a_deadline(tmp_path):
    # due by 14:20: alone they end at 14:00; paired from 10:25 at 0.85-0.89, well after
    inputs, daemon, run = _run(_scenario(tmp_path, _rows(a_within="4h20m")))
    assert daemon.moves == 0
    assert all(sorted(p[:2]) != [0, 1] for p in daemon.pairs)
    assert (run.finish_s[:2] <= inputs.deadline_s[:2]).all()


def test_a_job_moves_only_once_it_has_run_long_enough(tmp_path):
    # the job waiting arrives at 10:15: A and B have run 15 min, less than twice the
    # five-minute checkpoint plus daemon.move_after's 10 min (the daemon's rule): no move
    # then; at 10:20 the first of them may move, and the waiting job starts then
    rows = _rows()
    rows[2]["submit"] = "2023-05-01T10:15:00"
    inputs, daemon, run = _run(_scenario(tmp_path, rows))
    assert run.moves == 1
    assert daemon.pairs[0][2] == pytest.approx(inputs.jobs.submit_s[0] + 20 * 60)
    assert run.first_start_s[2] == pytest.approx(inputs.jobs.submit_s[0] + 20 * 60)


def test_no_move_while_no_job_waits_for_gpus(tmp_path):
    # the same two jobs alone, but nothing waits: a move would only slow both down
    _, daemon, run = _run(_scenario(tmp_path, _rows(waiting=False)))
    assert daemon.moves == 0 and run.suspensions == 0
    assert all(sorted(p[:2]) != [0, 1] for p in daemon.pairs)


def test_a_move_is_only_for_gpus_that_let_the_waiting_job_start():
    from types import SimpleNamespace as NS

    from orchestrator.sim.hardware.colocation import frees_room

    alloc = NS(type_of=lambda node: {"a": "v100", "b": "p100"}[node])
    head = NS(gpus=2, min_gpus=2, gpu_type=None)
    assert frees_room(head, "a", 2, alloc) and not frees_room(head, "a", 1, alloc)
    typed = NS(gpus=1, min_gpus=1, gpu_type="p100")
    assert frees_room(typed, "b", 1, alloc) and not frees_room(typed, "a", 4, alloc)


def test_asking_whether_a_move_lets_the_waiting_job_start_changes_no_placement(tmp_path):
    """Review: the probe freed and held again on the real allocator, which reordered its
    nodes: a run with moves on placed jobs differently even when it moved none."""
    from types import SimpleNamespace as NS

    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    _, daemon, _ = _run(_scenario(tmp_path, _rows(waiting=False)))

    def three() -> ClusterAllocator:
        alloc = ClusterAllocator(
            ClusterTopology([NodeTopology.plain(f"n{i}", 4) for i in range(3)])
        )
        for i in range(3):
            alloc.hold(("job", i), f"n{i}", [0])
        return alloc

    daemon.alloc, control = three(), three()
    start = daemon._lets_start
    assert start(NS(gpus=2, min_gpus=2, gpu_type=None), ("job", 0)) is False  # fits already
    assert start(NS(gpus=4, min_gpus=4, gpu_type=None), ("job", 0)) is True  # n0 freed
    assert daemon.alloc.held_masks() == control.held_masks()
    assert daemon.alloc.allocate("next", 2).parts == control.allocate("next", 2).parts


def test_a_moved_job_restarts_at_its_planned_cap_not_the_site_limits(tmp_path):
    """Review: a move under a site power limit kept the cap the limit had lowered it to as
    its planned cap, so it never rose again once power freed up."""
    rows = _rows(duration="6h")
    rows.insert(2, {"submit": "2023-05-01T10:00:00", "duration": "6h", "gpus": 1, "name": OTHER})
    scenario = _scenario(tmp_path, rows)
    scenario = Scenario.model_validate(
        scenario.model_dump() | {"power_limit_w": 500.0, "cluster": {"gpus": 4, "gpus_per_node": 4}}
    )
    inputs = prepare(scenario, ROOT)
    daemon = daemon_class(inputs)(
        inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0)
    )
    seen = []
    move = daemon._move

    def recorded(x, host):
        seen.append(daemon.executor.cap_of(daemon._running[daemon._att_of[x]].handle)[0])
        move(x, host)
        seen.append(daemon._moving[x][3])

    daemon._move = recorded
    assert daemon.run().moves >= 1
    assert seen[0] < 1.0 and seen[1] == 1.0  # ran limited; restarts at fifo's cap, 1.0


def test_a_moved_job_restarts_at_the_cap_its_plan_gave_it(tmp_path):
    """A plan that caps (a budget's, here every job at 0.6): the job moved restarts at
    0.6, not at full power (the simulator's ``_requeue``, checked here through the cap
    its restarted attempt runs at)."""
    from dataclasses import replace

    from orchestrator.planning.policies.baselines import Fifo

    class Capped(Fifo):
        def plan(self, snapshot):
            return {i: replace(d, cap=0.6) for i, d in super().plan(snapshot).items()}

    inputs = prepare(_scenario(tmp_path, _rows(duration="6h")), ROOT)
    daemon = daemon_class(inputs)(inputs, Capped(), make_forecaster("perfect", inputs, 0))
    moved, caps = set(), {}
    move, launch = daemon._move, daemon.launch

    def recorded_move(x, host):
        moved.add(x)
        move(x, host)

    def recorded_launch(job, decision, allocation, now):
        launch(job, decision, allocation, now)
        att = daemon._running[daemon._att_of[job.id]]
        caps.setdefault(job.id, []).append(daemon.executor.cap_of(att.handle)[0])

    daemon._move, daemon.launch = recorded_move, recorded_launch
    assert daemon.run().moves >= 1
    for x in moved:
        assert caps[x] == [0.6, 0.6]  # ran capped, restarted capped
