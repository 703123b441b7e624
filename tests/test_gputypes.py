"""GPU types: curves, Gavel's throughput ratios and their fit, the per-job model mix, and
the choice among free types (orchestrator.planning.devices.gputypes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.planning.devices import gputypes
from orchestrator.planning.perfmodel import JobModel
from tests.conftest import shared_data

GAVEL = shared_data() / "perf" / "gavel_simulation_throughputs.json"


def test_type_names_and_curves():
    assert gputypes.type_of("Tesla V100-SXM2-32GB") == "v100"
    assert gputypes.type_of("NVIDIA A100-SXM4-40GB") == "a100"
    assert gputypes.type_of("Quadro RTX 6000") == "rtx6000"
    assert gputypes.type_of("  ") is None and gputypes.type_of("Lab-X1") == "labx1"
    assert gputypes.type_of("Quadro RTX 8000") == "rtx8000"
    assert gputypes.type_of("\x1b[31mevil\n" + "x" * 99) == "31mevil" + "x" * 57
    assert gputypes.type_of("\x00\n") is None
    assert gputypes.curve("v100").fitted and gputypes.curve("v100").max_limit_w == 250
    a100 = gputypes.curve("a100")  # generic shape at its 400 W board limit
    assert not a100.fitted and a100.max_limit_w == 400
    assert a100.power_w(1.0) > gputypes.curve("v100").power_w(1.0)
    assert set(gputypes.known_types()) >= {"v100", "p100", "k80", "a100", "a40", "rtx6000"}


def test_ratios_per_family():
    assert gputypes.speed("ResNet-50", "v100") == 1.0
    assert 0.6 < gputypes.speed("ResNet-50", "p100") < 0.7  # Gavel: 0.59-0.79
    assert gputypes.speed("Recommendation", "p100") > 2  # the P100 wins there (Gavel)
    assert gputypes.family_of("ResNet-50 (batch size 32)") == "ResNet-50"
    assert gputypes.family_of("resnet-18") == gputypes.family_of("resnet18") == "ResNet-18"
    assert gputypes.family_of("lm") == "LM" and gputypes.family_of("resnet") == "any"
    assert gputypes.family_of("bert") == gputypes.family_of(None) == "any"
    assert gputypes.speed("any", "unknown-type") == 1.0
    assert gputypes.relative_speed("LM", "v100", "p100") == pytest.approx(1 / 0.8398)


def test_on_type_moves_duration_and_curve():
    model = JobModel(full_duration_s=3600, ref_gpus=1, curve=gputypes.curve("v100"))
    on_p100 = gputypes.on_type(model, "ResNet-50", "p100", "v100")
    assert on_p100.curve.gpu == "p100"
    assert on_p100.time_s(1.0, 1) == pytest.approx(3600 / 0.659)
    assert gputypes.on_type(model, "ResNet-50", "v100", "v100") is model


def test_model_mix_is_seeded_and_from_gavel():
    a, b = gputypes.model_mix(200, 7), gputypes.model_mix(200, 7)
    assert a == b and a != gputypes.model_mix(200, 8)
    assert len(set(a)) > 15 and all(gputypes.family_of(t) != "any" for t in a)


def test_choose_type_by_energy_then_deadline():
    model = JobModel(full_duration_s=3600, ref_gpus=1, curve=gputypes.curve("v100"))
    # ResNet-50: the V100 is faster and (same board limit) spends less energy
    assert gputypes.choose_type(model, "ResNet-50", "v100", ["p100", "v100"], 1, 1.0, 0) == "v100"
    # Recommendation runs 2.2x faster on a P100: less energy there
    assert (
        gputypes.choose_type(model, "Recommendation", "v100", ["v100", "p100"], 1, 1.0, 0) == "p100"
    )
    # an A100 is fastest; without a deadline the least energy wins, with a tight one, time
    free = ["a100", "rtx6000"]
    fast = gputypes.choose_type(model, "any", "v100", free, 1, 1.0, 0, deadline_s=2500)
    assert fast == "a100"
    assert gputypes.choose_type(model, "any", "v100", [], 1, 1.0, 0) is None


@pytest.mark.skipif(not GAVEL.exists(), reason="no shared data (Gavel throughputs)")
def test_fit_reproduces_committed_coefficients_and_states_its_error():
    from orchestrator.planning.devices.speedfit import SPEEDS, fit

    fitted = fit(json.loads(GAVEL.read_text()))
    committed = json.loads(SPEEDS.read_text())
    assert fitted == committed
    # the per-family ratios predict Gavel's measured steps/s within the stated error,
    # far better than one ratio per type
    for gpu in ("k80", "p100"):
        err = committed["errors"][gpu]
        assert err["median_rel_err_family"] < 0.15 < err["median_rel_err_any"]


def test_allocation_by_type():
    from placement.cluster import ClusterAllocator
    from placement.errors import PlacementError
    from placement.topology import ClusterTopology, NodeTopology

    topo = ClusterTopology(
        (
            NodeTopology.plain("v1", 4, "r1", gpu="v100"),
            NodeTopology.plain("p1", 4, "r1", gpu="p100"),
            NodeTopology.plain("p2", 4, "r2", gpu="p100"),
        )
    )
    alloc = ClusterAllocator(topo)
    assert alloc.types() == ("v100", "p100")
    got = alloc.allocate("a", 2, gpu_type="p100")
    assert got.parts[0][0] in ("p1", "p2")
    # wider than a node: whole nodes of that type only
    assert alloc.fits_now(4, "v100") and not alloc.fits_now(8, "p100")
    alloc.free("a")
    wide = alloc.allocate("w", 8, gpu_type="p100")
    assert {node for node, _ in wide.parts} == {"p1", "p2"}
    assert not alloc.fits_now(1, "p100") and alloc.allocate("b", 1, gpu_type="p100") is None
    assert alloc.allocate("c", 1, gpu_type="v100").parts[0][0] == "v1"
    with pytest.raises(PlacementError, match="a100"):
        alloc.allocate("d", 1, gpu_type="a100")
    with pytest.raises(PlacementError, match="needs 5 v100"):
        alloc.allocate("e", 5, gpu_type="v100")
    assert alloc.type_of("p2") == "p100"


def _mixed_run(tmp_path, jobs: list[dict], nodes: list[dict], **jobs_cfg):
    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": str(trace), "deadline_rule": "none", **jobs_cfg},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpu": "v100", "nodes": nodes},
        }
    )
    outcome = simulate(scenario, tmp_path)
    return outcome.runs["fifo"], outcome.results["fifo"]


def test_sim_a_v100_job_runs_faster_than_on_a_p100(tmp_path):
    nodes = [{"name": "v", "gpus": 1, "gpu": "v100"}, {"name": "p", "gpus": 1, "gpu": "p100"}]
    job = {"submit": 0, "duration": 3600, "gpus": 1, "name": "ResNet-50"}
    run, result = _mixed_run(tmp_path, [job, job], nodes)
    jct = run.finish_s - run.first_start_s
    # both start at once: one on the V100 (its traced hour), one on the P100 (Gavel's
    # ResNet-50 ratio: 0.659 of the V100's speed), each drawing its own type's power
    assert sorted(jct) == pytest.approx([3600, 3600 / 0.659], rel=1e-6)
    assert run.first_start_s[0] == run.first_start_s[1]
    v100_w = gputypes.curve("v100").power_w(1.0) + 50
    p100_w = gputypes.curve("p100").power_w(1.0) + 50
    expected_kwh = (v100_w * 3600 + p100_w * 3600 / 0.659) / 3.6e6
    assert result["energy_kwh"] == pytest.approx(expected_kwh, abs=1e-3)  # rounded
    # the same jobs on two V100s: both end after their traced hour
    run, _ = _mixed_run(tmp_path, [job, job], [{"name": "a", "gpus": 2}])
    assert list(run.finish_s - run.first_start_s) == pytest.approx([3600, 3600])


@pytest.mark.backends("sqlite")  # simulate never opens the store
def test_simulate_takes_the_mixed_cluster_example(cli):
    from tests.conftest import ROOT

    data = cli.json(
        "simulate", "--jobs", "synthetic:count=60&days=2", "--cluster",
        str(ROOT / "examples" / "mixed_cluster.toml"), "--policy", "fifo",
    )  # fmt: skip
    assert data["scenario"]["gpus"] == 32 and data["policies"]["fifo"]["jobs"] == 60


@pytest.mark.backends("sqlite")  # simulate never opens the store
@pytest.mark.parametrize(
    "text, message",
    [
        ('[jobs]\nmodels = "bert"\n', "jobs.models"),
        ('[cluster]\ngpu = ""\n', "cluster.gpu"),
        (
            '[cluster]\ngpus = 4\nnodes = [{name = "a", gpus = 4, gpu = ""}]\n',
            "cluster.nodes.0.gpu",
        ),
    ],
)
def test_bad_gpu_types_and_models_in_a_scenario(cli, tmp_path, text, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc = cli.run("simulate", str(bad), check=False)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sim_jobs_that_ask_for_a_type_wait_for_it(tmp_path):
    nodes = [{"name": "v", "gpus": 1, "gpu": "v100"}, {"name": "p", "gpus": 1, "gpu": "p100"}]
    job = {"submit": 0, "duration": 3600, "gpus": 1, "name": "ResNet-50", "gpu_type": "P100"}
    other = dict(job, gpu_type="a100")  # no such node: left out, said in the notes
    run, result = _mixed_run(tmp_path, [job, job, other], nodes)
    assert result["jobs"] == 2 and len(run.finish_s) == 2
    # one P100: they run one after the other, each at the P100's speed; the V100 idles
    assert sorted(run.first_start_s - run.first_start_s.min()) == pytest.approx([0, 3600 / 0.659])
    assert list(run.finish_s - run.first_start_s) == pytest.approx([3600 / 0.659] * 2)


@pytest.mark.parametrize(
    "job, why",
    [
        ({"gpu_type": "a100"}, "1 job asking for a GPU type the cluster lacks was left out"),
        (  # the cluster has P100s, just not two (QA: it said it lacks the type)
            {"gpus": 2, "gpu_type": "p100"},
            r"1 job asking for more GPUs of their type than the cluster has \(1 p100\) "
            r"was left out",
        ),
        ({"gpus": 3}, "1 job wider than the cluster was left out"),
        ({"skip_jobs": 1}, "skip_jobs 1 leaves none of 1"),
    ],
)
def test_sim_with_every_job_left_out_says_why(tmp_path, job, why):
    """Not "no jobs ... in the signal's time range": the job is in it."""
    from orchestrator.errors import SpecError

    nodes = [{"name": "v", "gpus": 1, "gpu": "v100"}, {"name": "p", "gpus": 1, "gpu": "p100"}]
    cfg = {k: job.pop(k) for k in list(job) if k == "skip_jobs"}
    with pytest.raises(SpecError, match=f"^no jobs to simulate: {why}$"):
        _mixed_run(tmp_path, [{"submit": 0, "duration": 3600, **job}], nodes, **cfg)


def test_sim_notes_say_which_typed_jobs_were_left_out_and_why(tmp_path):
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.scenario import Scenario
    from tests.conftest import ROOT

    rows = [
        {"submit": 0, "duration": 60, "gpu_type": "a100"},
        {"submit": 0, "duration": 60, "gpu_type": "k80", "gpus": 2},
        {"submit": 0, "duration": 60, "gpu_type": "p100", "gpus": 17},
        {"submit": 0, "duration": 60, "after": 3},  # waits for the 17-P100 job
        {"submit": 0, "duration": 60, "gpu_type": "p100", "gpus": 16},  # fits
    ]
    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": str(trace), "deadline_rule": "none"},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpu": "v100", "nodes": [
                {"name": "v", "gpus": 8, "gpu": "v100"}, {"name": "p", "gpus": 16, "gpu": "p100"},
            ]},
        }
    )  # fmt: skip
    inputs = prepare(scenario, ROOT)
    assert len(inputs.jobs) == 1
    said = [n for n in inputs.notes if "left out" in n or "waiting for those" in n]
    assert said == [
        "2 jobs asking for a GPU type the cluster lacks were left out",
        "1 job asking for more GPUs of their type than the cluster has (16 p100) was left out",
        "1 job waiting for those too",
    ]


@pytest.mark.backends("sqlite")  # simulate never opens the store
@pytest.mark.parametrize("bad", ['"../p100"', "7", '"' + "a" * 65 + '"'])
def test_sim_bad_gpu_type_in_a_trace_is_one_line(cli, tmp_path, bad):
    trace = tmp_path / "jobs.jsonl"
    trace.write_text(
        '{"submit": 0, "duration": 60}\n{"submit": 0, "duration": 60, "gpu_type": ' + bad + "}\n"
    )
    proc = cli.run("simulate", "--jobs", str(trace), check=False)
    assert proc.returncode == 2 and "job 2: invalid GPU type" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sim_an_elastic_job_that_asks_for_a_type_grows_only_within_it(tmp_path):
    nodes = [{"name": "v", "gpus": 4, "gpu": "v100"}, {"name": "p", "gpus": 2, "gpu": "p100"}]
    job = {"submit": 0, "duration": 3600, "gpus": 2, "gpu_type": "p100"}  # elastic: 1-4
    run, result = _mixed_run(tmp_path, [job] * 3, nodes, elastic=1.0)
    assert result["jobs"] == 3 and not np.isnan(run.finish_s).any()
    assert run.seg_gpus.max() <= 2  # never wider than the P100s


def test_live_allocation_by_type_clamps_an_elastic_job_and_chooses_for_others():
    from types import SimpleNamespace

    from orchestrator.daemon.energy.gputypes import allocate_typed, type_problem, with_types
    from orchestrator.planning.policies.base import Decision
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    nodes = [
        SimpleNamespace(name="v", gpu_model="Tesla V100-SXM2-16GB"),
        SimpleNamespace(name="p", gpu_model="Tesla P100-PCIE-16GB"),
    ]
    topo = ClusterTopology((NodeTopology.plain("v", 4), NodeTopology.plain("p", 2)))
    alloc = ClusterAllocator(with_types(topo, nodes))
    view = SimpleNamespace(model=None, duration_s=3600.0, deadline_s=None)
    typed = SimpleNamespace(gpu_type="p100", name=None, gpus_min=1)
    got = allocate_typed(alloc, "a", 8, typed, view, Decision(0.0), 0.0)  # an elastic 1-8
    assert got.parts == (("p", (0, 1)),)
    assert type_problem(SimpleNamespace(gpu_type="p100", gpus_min=3), alloc.topology)
    assert type_problem(SimpleNamespace(gpu_type=None, gpus_min=3), alloc.topology) is None
    # no type asked: the free V100s (the P100s are taken)
    free = SimpleNamespace(gpu_type=None, name="resnet50", gpus_min=1)
    assert allocate_typed(alloc, "b", 1, free, view, Decision(0.0), 0.0).parts[0][0] == "v"
    assert allocate_typed(alloc, "c", 4, free, view, Decision(0.0), 0.0) is None  # waits
