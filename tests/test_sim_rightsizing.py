"""Right-sizing in the simulator, the review's cases (orchestrator/sim/hardware/power.py):
GPU types, deadlines a wake-up rounded to the planner's slot would miss, starts a running
job frees GPUs for, one idle window for every run, the planner's idle cost only where a
deferral adds idle time, and bad settings or jobs no node takes as one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator.errors import PlacementError
from orchestrator.sim.runner import simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
T0 = pd.Timestamp("2023-01-03T00:00:00", tz="UTC").timestamp()
H = 3600.0
TYPED = [
    {"submit": "2023-01-03T00:00:00", "duration": "1h", "gpus": 1, "gpu_type": "v100"},
    {"submit": "2023-01-03T05:00:00", "duration": "1h", "gpus": 1, "gpu_type": "p100"},
]
TYPED_TOML = """[cluster]
idle_off_after = "30m"
[[nodes]]
name = "v"
gpus = 2
gpu = "v100"
[[nodes]]
name = "p"
gpus = 2
gpu = "p100"
"""
# a 10 h interruptible job, then one of 1 h at 2 h that must end within 1 h 10
GUARD = [
    {"submit": "2023-01-03T00:00:00", "duration": "10h", "gpus": 2, "interruptible": True},
    {"submit": "2023-01-03T02:00:00", "duration": "1h", "gpus": 2, "within": "1h10m"},
]


def _trace(tmp_path, rows) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _scenario(tmp_path, rows, policies=("fifo",), nodes=None, **cluster) -> Scenario:
    return Scenario.model_validate(
        {
            "policies": list(policies),
            "jobs": {"source": _trace(tmp_path, rows), "deadline_rule": "none"},
            "grid": {"source": "synthetic:days=14"},
            "cluster": {"nodes": nodes or [{"name": "a", "gpus": 2}, {"name": "b", "gpus": 2}],
                        **cluster},
        }
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["fifo", "budget"])
def test_a_job_asking_for_the_type_of_nodes_all_off_wakes_one(cli, tmp_path, policy):
    cluster = tmp_path / "typed.toml"
    cluster.write_text(TYPED_TOML)
    data = cli.json("simulate", "--jobs", _trace(tmp_path, TYPED), "--cluster", str(cluster),
                    "--policy", policy)  # fmt: skip
    m = data["policies"][policy]
    assert m["jobs"] == 2 and m["wakes"] >= 1


def test_jobs_no_node_ever_takes_get_one_line_not_a_traceback(tmp_path, monkeypatch):
    from orchestrator.sim.hardware.power import SimPower

    monkeypatch.setattr(SimPower, "_woken", lambda self, node: None)  # a node never answers
    rows = [{"submit": "2023-01-03T00:00:00", "duration": "1m", "gpus": 1},
            {"submit": "2023-01-03T03:00:00", "duration": "1h", "gpus": 2}]  # fmt: skip
    scenario = _scenario(tmp_path, rows, idle_off_after="1m", wake="5m")  # both off at 3 h
    with pytest.raises(
        PlacementError, match=r"^1 jobs never .* job 1 \(2 GPUs\) found no node"
    ) as err:
        simulate(scenario, ROOT)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("policy", ["budget", "optimal"])
@pytest.mark.parametrize("plan_idle", [False, True])
def test_right_sizing_meets_the_deadline_always_on_meets(tmp_path, policy, plan_idle):
    """Both nodes are off at 2 h; the wake-up (5 min) must not push the start to the next
    slot edge (2 h 15): the job must start by 2 h 10."""
    run = lambda **c: simulate(_scenario(tmp_path, GUARD, [policy], **c), ROOT)  # noqa: E731
    on = run()
    sized = run(idle_off_after="30m", wake="5m", plan_idle=plan_idle)
    assert on.results[policy]["deadline_misses"] == 0
    assert sized.results[policy]["deadline_misses"] == 0
    assert sized.results[policy]["wakes"] >= 1
    assert sized.runs[policy].first_start_s[1] <= T0 + 2 * H + 600


def test_no_node_is_woken_for_a_start_a_running_job_frees_gpus_for(tmp_path):
    rows = [
        {"submit": "2023-01-03T00:00:00", "duration": "2h", "gpus": 2},
        {"submit": "2023-01-03T01:58:00", "duration": "1h", "gpus": 2},
    ]
    out = simulate(_scenario(tmp_path, rows, idle_off_after="30m", wake="5m"), ROOT)
    assert out.results["fifo"]["wakes"] == 0  # a frees its GPUs at 2 h, before b could answer
    assert out.runs["fifo"].first_start_s[1] == pytest.approx(T0 + 2 * H)


def test_a_job_wider_than_a_node_wakes_only_the_nodes_it_lacks(tmp_path):
    rows = [
        {"submit": "2023-01-03T00:00:00", "duration": "2h", "gpus": 8},
        {"submit": "2023-01-03T02:06:00", "duration": "1h", "gpus": 16},
    ]
    nodes = [{"name": n, "gpus": 8} for n in "abcd"]
    out = simulate(_scenario(tmp_path, rows, nodes=nodes, idle_off_after="30m", wake="5m"), ROOT)
    assert out.results["fifo"]["wakes"] == 1  # a is on: b joins it


def test_every_policy_and_setting_counts_idle_energy_over_one_window(tmp_path):
    """fifo ends at 4 h, budget defers later: both accounts end at the later end, and
    always on, the idle energy is the idle draw per GPU × (the window's GPU time − the
    jobs')."""
    from orchestrator.sim.runner import common_window

    rows = [
        {"submit": "2023-01-03T00:00:00", "duration": "1h", "gpus": 1, "interruptible": True},
        {"submit": "2023-01-03T03:00:00", "duration": "1h", "gpus": 2},
    ]
    cluster = {"node_idle_w": 100.0, "gpu_idle_w": 30.0}
    on = simulate(_scenario(tmp_path, rows, ["fifo", "budget"], **cluster), ROOT)
    ends = {p: float(r.idle.end_s[-1]) for p, r in on.runs.items()}
    last = max(float(np.nanmax(r.finish_s)) for r in on.runs.values())
    assert ends["fifo"] == ends["budget"] == pytest.approx(last)
    for p, r in on.runs.items():
        busy_gpu_h = float(np.sum(r.seg_gpus * (r.seg_end_s - r.seg_start_s))) / H
        hand = (4 * (last - T0) / H - busy_gpu_h) * (100 + 2 * 30) / 2 / 1000
        assert on.results[p]["idle_energy_kwh"] == pytest.approx(hand, abs=2e-3), p
    sized = simulate(_scenario(tmp_path, rows, ["fifo", "budget"], idle_off_after="30m",
                               **cluster), ROOT)  # fmt: skip
    again = simulate(_scenario(tmp_path, rows, ["fifo", "budget"], **cluster), ROOT)
    common_window([again, sized])
    all_ends = {float(r.idle.end_s[-1]) for o in (again, sized) for r in o.runs.values()}
    assert len(all_ends) == 1


def test_the_idle_cost_is_off_by_default_and_counts_nothing_always_on(tmp_path):
    """Always on, a deferral adds no idle GPU-hours: plan_idle = true plans as false does;
    with right-sizing it is off unless asked for."""
    rows = [
        {"submit": "2023-01-03T00:00:00", "duration": "3h", "gpus": 1, "interruptible": True},
        {"submit": "2023-01-03T01:00:00", "duration": "2h", "gpus": 2, "within": "20h"},
    ]
    run = lambda **c: simulate(_scenario(tmp_path, rows, ["budget"], **c), ROOT)  # noqa: E731
    assert run(plan_idle=True).results == run().results
    assert run(idle_off_after="30m").results == run(idle_off_after="30m", plan_idle=False).results


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('wake = "never"', "wake: "),
        ('[[nodes]]\nname = "a"\ngpus = 16\nwake = "never"', "wake"),
    ],
)
def test_a_wake_up_of_never_gets_one_line_and_exit_2(cli, tmp_path, table, message):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'[cluster]\ngpus = 16\nidle_off_after = "never"\n{table}\n')
    proc = cli.run("simulate", "--jobs", "synthetic:count=5&days=1", "--cluster", str(cluster),
                   check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert message in proc.stderr


def test_the_deadline_guard_waits_for_a_wake_up_rather_than_suspend_a_job(tmp_path):
    """fifo: job 0 holds a, b is off; job 1 must start by 2 h 10. Waking b (5 min) meets
    it: the guard suspends nothing, as always on."""
    out = simulate(_scenario(tmp_path, GUARD, idle_off_after="30m", wake="5m"), ROOT)
    m, run = out.results["fifo"], out.runs["fifo"]
    assert m["suspensions"] == 0 and m["deadline_misses"] == 0 and m["wakes"] == 1
    assert run.finish_s[0] == pytest.approx(T0 + 10 * H)  # never suspended
    assert run.first_start_s[1] == pytest.approx(T0 + 2 * H + 300)  # once b answers
