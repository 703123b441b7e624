"""Idle power and right-sizing in the simulator (orchestrator/sim/hardware/power.py): idle GPUs and
powered-on idle servers counted, nodes powered off after idle_off_after and woken for a
job with the wake-up delay, and never a job on a node that is off."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.sim.engine import SimDaemon
from orchestrator.sim.runner import simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
T0 = pd.Timestamp("2023-01-03T00:00:00", tz="UTC").timestamp()
H = 3600.0


def _trace(tmp_path, rows) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _two_nodes(tmp_path, rows, policies=("fifo",), **cluster) -> Scenario:
    return Scenario.model_validate(
        {
            "policies": list(policies),
            "jobs": {"source": _trace(tmp_path, rows), "deadline_rule": "none"},
            "grid": {"source": "synthetic:days=14"},
            "cluster": {
                "nodes": [{"name": "a", "gpus": 2}, {"name": "b", "gpus": 2}],
                "node_idle_w": 100.0,
                "gpu_idle_w": 30.0,
                "pue": 1.5,
                **cluster,
            },
        }
    )


ROWS = [
    {"submit": "2023-01-03T00:00:00", "duration": "1h", "gpus": 1},
    {"submit": "2023-01-03T03:00:00", "duration": "1h", "gpus": 2},
]


def test_idle_gpus_and_idle_servers_are_counted_by_hand(tmp_path):
    """Two nodes of 2 GPUs; a node on and idle draws 100 W + 2 × 30 W, × PUE 1.5 = 240 W,
    and half of that with one GPU busy. 0-1 h: 120 + 240; 1-3 h: 480; 3-4 h: 240 W."""
    outcome = simulate(_two_nodes(tmp_path, ROWS), ROOT)
    m, run = outcome.results["fifo"], outcome.runs["fifo"]
    assert m["idle_energy_kwh"] == pytest.approx((360 + 2 * 480 + 240) / 1000, abs=1e-3)
    assert m["power_offs"] == 0 and m["wakes"] == 0
    carbon = outcome.inputs.carbon
    hand_g = sum(
        w * float(carbon.integral(np.array([T0 + a * H]), np.array([T0 + b * H]))[0])
        for w, a, b in ((360, 0, 1), (480, 1, 3), (240, 3, 4))
    )
    assert m["idle_carbon_kg"] == pytest.approx(hand_g / J_PER_KWH / 1000, abs=1e-3)
    assert run.idle.end_s[-1] == pytest.approx(T0 + 4 * H)
    assert m["energy_kwh"] > 0  # the jobs' own energy is apart, unchanged


def test_idle_nodes_are_powered_off_and_a_job_waits_for_the_wake_up(tmp_path):
    scenario = _two_nodes(tmp_path, ROWS, idle_off_after="30m", wake="10m")
    outcome = simulate(scenario, ROOT)
    m, run = outcome.results["fifo"], outcome.runs["fifo"]
    assert m["power_offs"] == 2 and m["wakes"] == 1  # b at 0.5 h, a at 1.5 h; one woken at 3 h
    assert run.first_start_s[1] == pytest.approx(T0 + 3 * H + 600)  # after the wake-up
    assert run.finish_s[1] == pytest.approx(T0 + 4 * H + 600)
    # 0-0.5 h: 360 W (b idle since the start, off at 0.5 h); 0.5-1 h: a's idle GPU, 120;
    # 1-1.5 h: a idle, 240; 1.5-3 h: nothing on; 3 h-3 h 10: one node waking, 240; then
    # its two GPUs are busy and the other node is off
    hand_kwh = (0.5 * 360 + 0.5 * 120 + 0.5 * 240 + 240 / 6) / 1000
    assert m["idle_energy_kwh"] == pytest.approx(hand_kwh, abs=1e-3)
    never = simulate(_two_nodes(tmp_path, ROWS, idle_off_after="never"), ROOT)
    assert never.results["fifo"]["power_offs"] == 0
    assert never.results["fifo"]["idle_energy_kwh"] > m["idle_energy_kwh"]


def test_a_job_arriving_while_every_node_is_off_waits_for_one_wake_up(tmp_path):
    """Node b is off from 0.5 h, a from 1.5 h; the second job arrives at 1 h 35 and starts
    after a 10-minute wake-up, at 1 h 45."""
    rows = [ROWS[0], {"submit": "2023-01-03T01:35:00", "duration": "1h", "gpus": 1}]
    outcome = simulate(_two_nodes(tmp_path, rows, idle_off_after="30m", wake="10m"), ROOT)
    run, m = outcome.runs["fifo"], outcome.results["fifo"]
    assert run.first_start_s[1] == pytest.approx(T0 + 1 * H + 45 * 60)
    assert m["power_offs"] == 2 and m["wakes"] == 1


@pytest.mark.parametrize("policy", ["fifo", "lowest-window", "budget"])
def test_jobs_never_run_on_a_node_that_is_off(policy, monkeypatch):
    seen = {"launches": 0}
    launch = SimDaemon.launch

    def checked(self, job, decision, allocation, now):
        for node, _ in allocation.parts:
            assert self.power.is_on(node), f"job {job.id} placed on {node}, which is not on"
        seen["launches"] += 1
        return launch(self, job, decision, allocation, now)

    monkeypatch.setattr(SimDaemon, "launch", checked)
    scenario = Scenario.model_validate(
        {
            "policies": [policy],
            "jobs": {"source": "synthetic:count=120&days=3", "interruptible": 0.5},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpus": 32, "idle_off_after": "15m", "wake": "10m"},
        }
    )
    outcome = simulate(scenario, ROOT)
    m = outcome.results[policy]
    assert seen["launches"] >= 120 and m["jobs"] == 120
    assert m["power_offs"] > 0 and m["wakes"] > 0
    assert not np.isnan(outcome.runs[policy].finish_s).any()


@settings(max_examples=8, deadline=None)
@given(
    st.integers(0, 1000),
    st.sampled_from(["5m", "15m", "1h"]),
    st.sampled_from(["1m", "10m", "40m"]),
    st.sampled_from([2, 4, 8]),
    st.sampled_from(["fifo", "budget"]),
)
def test_property_no_job_on_a_node_off_and_every_job_ends(seed, after, wake, per_node, policy):
    launches = []

    class Checked(SimDaemon):
        def launch(self, job, decision, allocation, now):
            launches.append(all(self.power.is_on(node) for node, _ in allocation.parts))
            return super().launch(job, decision, allocation, now)

    scenario = Scenario.model_validate(
        {
            "policies": [policy],
            "seed": seed,
            "jobs": {"source": "synthetic:count=40&days=2", "interruptible": 0.5},
            "grid": {"source": "synthetic:days=5"},
            "cluster": {"gpus": 16, "gpus_per_node": per_node, "idle_off_after": after,
                        "wake": wake},
        }
    )  # fmt: skip
    import orchestrator.sim.runner as runner

    original = runner.daemon_class
    runner.daemon_class = lambda _inputs: Checked
    try:
        outcome = simulate(scenario, ROOT)
    finally:
        runner.daemon_class = original
    assert launches and all(launches)
    assert not np.isnan(outcome.runs[policy].finish_s).any()


def test_simulate_json_and_table_show_idle_energy(cli, tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\ngpus = 16\nidle_off_after = "30m"\nwake = "5m"\n')
    args = ("simulate", "--jobs", "synthetic:count=40&days=2", "--cluster", str(cluster))
    data = cli.json(*args)
    for m in data["policies"].values():
        assert {"idle_energy_kwh", "idle_carbon_kg", "power_offs", "wakes"} <= set(m)
        assert m["idle_energy_kwh"] > 0
    assert "idle kWh" in cli.run(*args).stdout


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('idle_off_after = "soon"', "cluster: idle_off_after"),
        ('wake = "-5m"', "cluster: wake"),
        ('wake = "0s"', "cluster: wake"),
        ("node_idle_w = -1", "cluster: node_idle_w"),
        ('gpu_idle_w = "lots"', "cluster: gpu_idle_w"),
        ("idle_off_after = 30", "cluster: idle_off_after"),
    ],
)
def test_bad_idle_settings_get_one_line_and_exit_2(cli, tmp_path, table, message):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f"[cluster]\ngpus = 16\n{table}\n")
    proc = cli.run("simulate", "--jobs", "synthetic:count=5&days=1", "--cluster", str(cluster),
                   check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert message.split(": ")[1] in proc.stderr


def test_the_carbon_plot_stacks_the_idle_carbon_on_the_jobs(tmp_path):
    from orchestrator.sim.plots import figures

    outcome = simulate(_two_nodes(tmp_path, ROWS), ROOT)
    carbon_ax = figures(outcome)["carbon_vs_jct"].axes[0]
    _jobs, idle = carbon_ax.containers  # two bar series: the jobs', the idle on top
    m = outcome.results["fifo"]
    assert idle.patches[0].get_y() == pytest.approx(m["carbon_kg"])
    assert idle.patches[0].get_height() == pytest.approx(m["idle_carbon_kg"])
    assert "idle" in carbon_ax.get_ylabel()


def test_a_node_of_its_own_settings_overrides_the_cluster(tmp_path):
    """Node a says never (and draws 200 W idle): only b is powered off, at 0.5 h."""
    scenario = _two_nodes(tmp_path, ROWS, idle_off_after="30m", wake="10m")
    scenario.cluster.nodes[0].idle_off_after = "never"
    scenario.cluster.nodes[0].node_idle_w = 200.0
    outcome = simulate(scenario, ROOT)
    m, run = outcome.results["fifo"], outcome.runs["fifo"]
    assert m["power_offs"] == 1 and m["wakes"] == 0
    assert run.first_start_s[1] == pytest.approx(T0 + 3 * H)  # a is on: no wake-up
    # a on throughout: 260 W idle (200 + 2 × 30), half of it 0-1 h; b 160 W to 0.5 h; PUE 1.5
    hand_kwh = 1.5 * (130 * 1 + 260 * 2 + 0 * 1 + 160 * 0.5) / 1000
    assert m["idle_energy_kwh"] == pytest.approx(hand_kwh, abs=1e-3)


def test_the_planner_sees_an_off_nodes_gpus_taken_until_it_could_answer(tmp_path):
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.runner import make_forecaster

    scenario = _two_nodes(tmp_path, ROWS, idle_off_after="30m", wake="10m", plan_idle=True)
    inputs = prepare(scenario, ROOT)
    daemon = SimDaemon(inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0))
    daemon.run()  # a went off 30 min after the last job; b since 0.5 h
    now = daemon.loop.now
    context = daemon.power.context(now, [])
    offs = [(c.gpus, c.power_w, c.start_s, c.end_s) for c in context["committed"]]
    assert offs == [(2, 0.0, now, now + 600)] * 2
    # asked for, with right-sizing: a waiting job's idle GPUs cost at most idle_off_after +
    # a wake-up
    assert context["idle_wait_s"] == 1800 + 600
    assert context["idle_w_per_gpu"] == pytest.approx((100 + 2 * 30) / 2 * 1.5)


def test_an_idle_gpu_draws_a_fifth_of_its_own_types_limit_where_nodes_have_types():
    from types import SimpleNamespace

    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.sim.hardware.power import node_settings
    from orchestrator.sim.scenario import ClusterConfig

    topology = SimpleNamespace(
        nodes=[SimpleNamespace(name="a", gpus=2, gpu="p100"), SimpleNamespace(name="b", gpus=2)]
    )
    inputs = SimpleNamespace(
        cluster=ClusterConfig(gpu="a40", node_idle_w=100.0), topology=topology,
        curve=curve_for("a40"),
    )  # fmt: skip
    a, b = node_settings(inputs)
    assert a.idle_w == pytest.approx(100 + 2 * 0.2 * curve_for("p100").max_limit_w)
    assert b.idle_w == pytest.approx(100 + 2 * 0.2 * curve_for("a40").max_limit_w)
    assert (a.wake_s, a.off_after_s) == (300.0, None)
