"""Co-location in what-if runs: two jobs on one GPU when the interference model says it
pays, each slowed as predicted, the GPU's draw split between them, deadlines kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.planning.devices.interference import Interference, shared_power_w
from orchestrator.planning.policies import resolve_policy
from orchestrator.sim.engine import SimDaemon
from orchestrator.sim.hardware.colocation import SharingDaemon, daemon_class
from orchestrator.sim.inputs import prepare
from orchestrator.sim.runner import make_forecaster, simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
HOST, GUEST = "Recommendation (batch size 4096)", "LM (batch size 20)"  # V100: 0.89, 0.85
H = 3600.0


def _scenario(tmp_path, share=1.0, host_within=None, **jobs) -> Scenario:
    rows = [
        {"submit": "2023-05-01T10:00:00", "duration": "2h", "gpus": 1, "name": HOST},
        {"submit": "2023-05-01T10:30:00", "duration": "2h", "gpus": 1, "name": GUEST},
    ]
    if host_within:
        rows[0]["within"] = host_within
    trace = tmp_path / "jobs.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": str(trace), "deadline_rule": "none", "share": share, **jobs},
            "grid": {"source": "synthetic:days=14&start=2023-04-28"},
            "cluster": {"gpus": 1, "gpus_per_node": 1, "gpu": "v100"},
        }
    )


def _run(scenario: Scenario):
    inputs = prepare(scenario, ROOT)
    cls = daemon_class(inputs)
    daemon = cls(inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0))
    return inputs, daemon, daemon.run()


def test_two_jobs_share_one_gpu_each_slowed_as_predicted_and_the_draw_split(tmp_path):
    inputs, daemon, run = _run(_scenario(tmp_path))
    assert isinstance(daemon, SharingDaemon) and [p[:2] for p in daemon.pairs] == [(0, 1)]
    submit = inputs.jobs.submit_s
    assert run.first_start_s[1] == submit[1]  # no wait: it joined the busy GPU
    speed_guest, speed_host = Interference().speeds(GUEST, HOST, "v100")
    host_end = submit[1] + 1.5 * H / speed_host
    assert run.finish_s[0] == pytest.approx(host_end)
    guest_left = 2 * H - (host_end - submit[1]) * speed_guest  # then alone, at full speed
    assert run.finish_s[1] == pytest.approx(host_end + guest_left)
    # while both run, their segments' draws sum to the shared GPU's
    alone_w = daemon._model(0).power_w(1, 1.0)
    during = (run.seg_start_s >= submit[1]) & (run.seg_end_s <= host_end + 1e-6)
    assert during.sum() == 2
    assert run.seg_power_w[during].sum() == pytest.approx(shared_power_w(alone_w, alone_w))
    assert run.seg_gpus[during].sum() == pytest.approx(1.0)  # one physical GPU
    # less energy than one after the other, on the same work
    _, _, alone = _run(_scenario(tmp_path, share=0.0))
    assert alone.first_start_s[1] == pytest.approx(submit[0] + 2 * H)  # it waited
    energy = float(np.sum(run.seg_power_w * (run.seg_end_s - run.seg_start_s)))
    energy_alone = float(np.sum(alone.seg_power_w * (alone.seg_end_s - alone.seg_start_s)))
    assert energy < 0.8 * energy_alone


def test_no_pair_when_the_slowdown_would_break_a_deadline(tmp_path):
    # the running job must end by 12:05; next to the newcomer it would end about 12:10
    inputs, daemon, run = _run(_scenario(tmp_path, host_within="2h05m"))
    assert daemon.pairs == []
    assert run.first_start_s[1] == pytest.approx(run.finish_s[0])  # it waited its turn
    assert run.finish_s[0] <= inputs.deadline_s[0]
    _, daemon, _ = _run(_scenario(tmp_path, host_within="2h20m"))  # room enough: they pair
    assert len(daemon.pairs) == 1


def test_without_share_the_simulator_is_unchanged(tmp_path):
    inputs = prepare(_scenario(tmp_path, share=0.0), ROOT)
    assert daemon_class(inputs) is SimDaemon


def test_only_jobs_that_may_share_ever_share_and_no_gpu_holds_more_than_two():
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo", "lowest-window"],
            "jobs": {"source": "synthetic:count=200&days=4", "share": 0.5, "interruptible": 0.5},
            "grid": {"source": "synthetic:days=10"},
            "cluster": {"gpus": 16, "gpus_per_node": 8},
        }
    )
    inputs = prepare(scenario, ROOT)
    for name in scenario.policies:
        policy = resolve_policy(name)
        daemon = SharingDaemon(inputs, policy, make_forecaster("perfect", inputs, 0))
        run = daemon.run()
        assert daemon.pairs, name
        for host, guest, _ in daemon.pairs:
            assert daemon._may[host] and daemon._may[guest]
        assert not np.isnan(run.finish_s).any()
        times = np.concatenate((run.seg_start_s, run.seg_end_s))
        delta = np.concatenate((run.seg_gpus, -run.seg_gpus))
        order = np.lexsort((delta, times))
        assert np.cumsum(delta[order]).max() <= 16 + 1e-6  # physical GPUs, never more
    results = simulate(scenario, ROOT).results
    alone = simulate(scenario.model_copy(update={"jobs": scenario.jobs.model_copy(
        update={"share": 0.0})}), ROOT).results  # fmt: skip
    assert results["fifo"]["energy_kwh"] < alone["fifo"]["energy_kwh"]


@pytest.mark.parametrize("value", ["-0.1", "1.5", "lots", "nan"])
def test_bad_share_is_one_line_and_exit_2(cli, value):
    proc = cli.run("simulate", "--jobs", "synthetic:count=5&days=1", "--share", value, check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "share" in proc.stderr.lower()


def test_bad_share_in_a_scenario_file(cli, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[jobs]\nshare = "half"\n')
    proc = cli.run("simulate", str(path), check=False)
    assert proc.returncode == 2 and "jobs.share" in proc.stderr


@pytest.mark.parametrize("key", ["share", "interruptible", "elastic"])
def test_a_share_of_jobs_is_a_number_not_true(key):
    from orchestrator.errors import SpecError
    from orchestrator.sim.scenario import validate

    with pytest.raises(SpecError, match=f"jobs.{key}: .*a number"):
        validate({"jobs": {key: True}}, "s.toml")  # pydantic alone reads true as 1.0
    assert getattr(validate({"jobs": {key: 1}}, "s.toml").jobs, key) == 1.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "-inf"])
def test_a_share_of_jobs_is_a_finite_number(value):
    from orchestrator.errors import SpecError
    from orchestrator.sim.scenario import validate

    # the scenario's own check (allow_inf_nan=False), not a bound nan does not break
    with pytest.raises(SpecError, match=r"jobs.share: .*a finite number"):
        validate({"jobs": {"share": value}}, "s.toml")


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_pair_speeds_is_one_clear_error(value):
    from orchestrator.errors import SpecError
    from orchestrator.sim.scenario import validate

    # it was read as the scenario's own folder: "cannot read ...: Is a directory"
    with pytest.raises(SpecError, match=r'jobs.pair_speeds: .*"model", "measured" or a path'):
        validate({"jobs": {"share": 0.5, "pair_speeds": value}}, "s.toml")


def test_a_shared_gpu_never_draws_above_its_boards_limit(tmp_path):
    inputs = prepare(_scenario(tmp_path), ROOT)
    daemon = SharingDaemon(inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0))
    alone_w = daemon._model(0).power_w(1, 1.0)
    limit_w = alone_w * 1.05  # a board whose limit the pair's +10 % would pass
    daemon._limit_w = lambda job_id: limit_w
    run = daemon.run()
    assert daemon.pairs
    t = inputs.jobs.submit_s[1] + 60.0  # both running
    during = (run.seg_start_s <= t) & (run.seg_end_s > t)
    assert during.sum() == 2
    assert run.seg_power_w[during].sum() == pytest.approx(limit_w)


def test_the_benchmarks_runtime_increase_is_the_paired_jobs_own(tmp_path):
    import sys
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from energy_colocation import runtime_increase

    _, daemon, shared = _run(_scenario(tmp_path))
    assert shared.pairs == daemon.pairs  # the run keeps its pairs
    _, _, alone = _run(_scenario(tmp_path, share=0.0))
    ran = (shared.finish_s - shared.first_start_s).sum()
    ran_alone = (alone.finish_s - alone.first_start_s).sum()
    assert runtime_increase(alone, shared) == pytest.approx(ran / ran_alone - 1, abs=1e-4)
    assert runtime_increase(alone, SimpleNamespace(pairs=[])) is None


def _gavel(tmp_path, host_speed: float, guest_speed: float):
    """A throughputs file in Gavel's shape: HOST and GUEST alone and next to each other."""
    h, g = f"('{HOST}', 1)", f"('{GUEST}', 1)"
    table = {
        "v100": {h: {"null": 10.0, g: [10.0 * host_speed, 8.0 * guest_speed]},
                 g: {"null": 8.0, h: [8.0 * guest_speed, 10.0 * host_speed]}},
        "p100": {}, "k80": {},
    }  # fmt: skip
    path = tmp_path / "gavel.json"
    path.write_text(json.dumps(table))
    return path


def test_pairs_run_at_gavels_measured_speeds_and_the_model_learns_them(tmp_path):
    # the model predicts 0.89 / 0.85 and pairs them; Gavel (here) measured 0.7 / 0.6
    path = _gavel(tmp_path, 0.7, 0.6)
    inputs, daemon, run = _run(_scenario(tmp_path, pair_speeds=str(path)))
    assert [p[:2] for p in daemon.pairs] == [(0, 1)]
    submit = inputs.jobs.submit_s
    host_end = submit[1] + 1.5 * H / 0.7
    assert run.finish_s[0] == pytest.approx(host_end)
    assert run.finish_s[1] == pytest.approx(host_end + 2 * H - (host_end - submit[1]) * 0.6)
    assert daemon.interference.speeds(GUEST, HOST, "v100") == (0.6, 0.7)  # refined online
    assert any("measured speeds" in note for note in inputs.notes)
    _, model, _ = _run(_scenario(tmp_path))  # the default: as the model predicts
    assert model.interference.speeds(GUEST, HOST, "v100") == Interference().speeds(
        GUEST, HOST, "v100"
    )


@pytest.mark.parametrize(
    "text, why",
    [
        ("missing.json", "cannot read"),
        ("garbage", "is not Gavel's throughputs JSON"),
        ("list", "is not Gavel's throughputs JSON"),
        ("deep", "is not Gavel's throughputs JSON"),
        ("/dev/zero", "larger than"),
    ],
)
def test_bad_pair_speeds_are_one_clear_error(tmp_path, text, why):
    from orchestrator.errors import SpecError

    if text == "garbage":
        (tmp_path / "garbage").write_text("{not json")
    if text == "list":
        (tmp_path / "list").write_text("[1, 2]")
    if text == "deep":
        (tmp_path / "deep").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(SpecError, match=why):
        prepare(_scenario(tmp_path, pair_speeds=str(tmp_path / text)), ROOT)


def test_a_measured_speed_is_kept_within_0_01_and_1():
    from orchestrator.planning.devices.interfit import measured_speeds

    a, b = f"('{HOST}', 1)", f"('{GUEST}', 1)"
    table = {"v100": {a: {"null": 10.0, b: [1e-300, 1.0]}, b: {"null": 8.0, a: [80.0, 1.0]}},
             "p100": {}, "k80": {}}  # fmt: skip
    got = measured_speeds(table)
    assert got[("v100", HOST, GUEST)] == 0.01  # not a run 10^300 times slower
    assert ("v100", GUEST, HOST) not in got  # 10 times faster paired: no measurement
