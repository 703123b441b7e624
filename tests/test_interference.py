"""The co-location interference model against Gavel's measured pairs, and its rules."""

from __future__ import annotations

import json

import pytest

from orchestrator.planning.devices.interference import (
    COEFFICIENTS,
    Interference,
    shared_power_w,
    split,
    worth_sharing,
)
from tests.conftest import shared_data

GAVEL = shared_data() / "perf" / "gavel_simulation_throughputs.json"
needs_gavel = pytest.mark.skipif(not GAVEL.is_file(), reason="shared Gavel data is absent")
#: The README states these bounds (median relative error of a job's paired speed); the
#: measured values are in interference.json.
MAX_ERR = {"k80": 0.04, "p100": 0.04, "v100": 0.10}


@needs_gavel
@pytest.mark.parametrize("gpu", sorted(MAX_ERR))
def test_model_reproduces_gavels_pairs(gpu):
    from orchestrator.planning.devices.interfit import pairs

    rows, infeasible = pairs(json.loads(GAVEL.read_text())[gpu])
    model = Interference()
    errors = sorted(abs(model.speed(a, b, gpu) - r) / r for a, b, r in rows)
    assert errors[len(errors) // 2] <= MAX_ERR[gpu]
    assert all(model.infeasible(a, b, gpu) for a, b in infeasible)
    stated = json.loads(COEFFICIENTS.read_text())["gpus"][gpu]["median_rel_err"]
    assert stated <= MAX_ERR[gpu]


@needs_gavel
def test_committed_coefficients_are_what_the_fit_produces():
    from orchestrator.planning.devices.interfit import fit_gpu

    data = json.loads(GAVEL.read_text())
    committed = json.loads(COEFFICIENTS.read_text())["gpus"]["p100"]
    assert fit_gpu(data["p100"]) == committed


def test_family_names_unknown_names_and_other_gpu_types():
    model = Interference()
    a, b = "ResNet-18 (batch size 16)", "Transformer (batch size 64)"
    assert 0 < model.speed(a, b, "v100") <= 1
    assert 0 < model.speed("ResNet-18", "Transformer", "v100") <= 1  # family means
    assert 0 < model.speed("no-such-model", "?", "v100") <= 1  # the mean job
    assert model.speed(a, b, "a40") == model.speed(a, b, "v100")  # no pairs: V100's


def test_a_measured_speed_replaces_the_prediction_for_that_pair_only():
    model = Interference()
    a, b = "ResNet-50 (batch size 32)", "LM (batch size 20)"
    before = model.speeds(a, b, "p100")
    model.observe(a, b, "p100", 0.91)
    assert model.speed(a, b, "p100") == 0.91
    assert model.speed(b, a, "p100") == before[1]
    assert model.speed(a, b, "v100") != 0.91 or before[0] == 0.91
    for bad in (0.0, -1.0, float("nan"), float("inf"), 7.0):
        with pytest.raises(ValueError):
            model.observe(a, b, "p100", bad)


def test_shared_power_and_split():
    assert shared_power_w(200, 150) == pytest.approx(220)
    assert shared_power_w(290, 280, max_w=300) == 300
    ja, jb = split(1000.0, 200, 100, 0.9, 0.6)
    assert ja + jb == pytest.approx(1000.0) and ja > jb
    assert split(10.0, 0, 0, 0, 0) == (5.0, 5.0)


def test_worth_sharing_needs_speed_and_an_energy_saving():
    assert worth_sharing(0.95, 0.95, 200, 200, min_speed=0.9)
    assert not worth_sharing(0.85, 0.99, 200, 200, min_speed=0.9)  # too slow
    assert not worth_sharing(0.5, 0.55, 200, 200, min_speed=0.0)  # 220 W for 1.05 units


#: The README states these for a job the model does not know (it gets the mean job):
#: median and 90th percentile of the relative error of its paired speed.
UNKNOWN_ERR = {"k80": (0.12, 0.30), "p100": (0.14, 0.34), "v100": (0.24, 0.80)}


@needs_gavel
@pytest.mark.parametrize("gpu", sorted(UNKNOWN_ERR))
def test_the_error_for_a_job_the_model_does_not_know(gpu):
    from orchestrator.planning.devices.interfit import pairs, unknown_job_error

    rows, _ = pairs(json.loads(GAVEL.read_text())[gpu])
    coef = json.loads(COEFFICIENTS.read_text())["gpus"][gpu]["jobs"]
    median, p90 = unknown_job_error(coef, rows)
    assert median <= UNKNOWN_ERR[gpu][0] and p90 <= UNKNOWN_ERR[gpu][1]
    in_sample = json.loads(COEFFICIENTS.read_text())["gpus"][gpu]["median_rel_err"]
    assert median > 2 * in_sample  # far worse than in sample: the README says so
