"""The power-cap curves against the Zeus measurements, and the job model's invariants."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.planning.perfmodel import CURVES, JobModel, curve_for
from tests.conftest import shared_data

ZEUS = shared_data() / "perf" / "zeus"
needs_zeus = pytest.mark.skipif(not ZEUS.is_dir(), reason="shared Zeus data is absent")
GPUS = ("a40", "p100", "rtx6000", "v100")
#: Median absolute error of the fit, normalised to each workload's full-power run. The
#: README states the same bounds; the measured values are in power_curves.json.
MAX_ERR_TPUT, MAX_ERR_ENERGY = 0.05, 0.06


@needs_zeus
def test_committed_coefficients_are_what_the_fit_produces():
    from orchestrator.planning.perffit import fit_all

    committed = json.loads(CURVES.read_text())
    assert fit_all(ZEUS) == committed


@needs_zeus
@pytest.mark.parametrize("gpu", GPUS)
def test_curves_reproduce_the_measurements(gpu):
    from orchestrator.planning.perffit import errors, normalised

    data, _, _ = normalised(ZEUS / f"summary_power_{gpu}.csv")
    fitted = json.loads(CURVES.read_text())["gpus"][gpu]
    err = errors(fitted, data)
    assert err["median_abs_err_tput"] <= MAX_ERR_TPUT
    assert err["median_abs_err_energy"] <= MAX_ERR_ENERGY


@needs_zeus
@pytest.mark.parametrize("gpu", GPUS)
def test_energy_per_unit_of_work_is_lowest_below_full_power(gpu):
    from orchestrator.planning.perffit import normalised

    data, _, _ = normalised(ZEUS / f"summary_power_{gpu}.csv")
    measured = data.groupby("f")["energy"].median()
    assert measured.idxmin() < 1.0 and measured.min() < 1.0, "the data says so"
    curve = curve_for(gpu)
    grid = np.linspace(curve.min_fraction, 1.0, 200)
    energy = [curve.power_w(f) / curve.throughput_fraction(f) for f in grid]
    best = grid[int(np.argmin(energy))]
    assert best < 0.95, f"{gpu}: model optimum at {best:.2f}"
    assert abs(best - measured.idxmin()) <= 0.25, "near where the data has it"


def test_known_and_unknown_gpu_names():
    assert curve_for("Tesla V100-SXM2-32GB").gpu == "v100"
    assert curve_for("Quadro RTX 6000").gpu == "rtx6000"
    generic = curve_for("NVIDIA H100 80GB HBM3", max_limit_w=700)
    assert not generic.fitted and generic.max_limit_w == 700
    assert generic.power_w(1.0) <= 700


@given(st.floats(min_value=0.05, max_value=1.0))
def test_curve_shape(f):
    for gpu in GPUS:
        c = curve_for(gpu)
        assert 0 < c.throughput_fraction(f) <= 1.0 + 1e-9
        assert c.power_w(f) <= max(f, c.min_fraction) * c.max_limit_w + 1e-9
    c = curve_for("v100")
    assert c.throughput_fraction(1.0) == pytest.approx(1.0)


def test_job_model_time_energy_and_scaling():
    m = JobModel(full_duration_s=3600, ref_gpus=4, curve=curve_for("v100"), efficiency=0.9)
    assert m.time_s(1.0, 4) == pytest.approx(3600)
    assert m.time_s(0.5, 4) == pytest.approx(1800), "half the work left, half the time"
    assert m.time_s(1.0, 8) == pytest.approx(3600 / (2 * 0.9))
    assert m.time_s(1.0, 4, 0.6) > m.time_s(1.0, 4)
    assert m.energy_j(1.0, 4, 0.6) < m.energy_j(1.0, 4), "a cap saves energy on a V100"
    assert m.energy_j(1.0, 4) == pytest.approx(m.power_w(4) * 3600)
    linear = JobModel(100, 1, curve_for("a40"), efficiency=1.0)
    assert linear.speedup(8) == pytest.approx(8)
    with pytest.raises(ValueError):
        m.throughput(4, 1.5)
    assert m.throughput(4, 0.01) == m.throughput(4, curve_for("v100").min_fraction)


def test_throughput_table_and_calibration():
    table = {1: 6.8, 2: 11.8, 4: 18.3, 8: 21.3}  # ElasticFlow's ResNet-50 at batch 64
    m = JobModel(
        full_duration_s=1000,
        ref_gpus=4,
        curve=curve_for("a40"),
        total_work=18.3 * 1000,
        throughput_table=table,
    )
    assert m.throughput(4) == pytest.approx(18.3)
    assert m.throughput(8) == pytest.approx(21.3)
    assert m.throughput(6) == pytest.approx((18.3 + 21.3) / 2)
    tuned = m.calibrated(measured_throughput=15.0, n=4, f=1.0)
    assert tuned.throughput(4) == pytest.approx(15.0)
    assert tuned.throughput(8) / tuned.throughput(4) == pytest.approx(21.3 / 18.3)


def test_calibration_refines_later_runs_of_the_same_name(db_url):
    from datetime import UTC, datetime, timedelta

    from orchestrator.accounting.calibration import learn, model_for
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job

    db = Database(db_url)
    db.ensure_schema()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    curve = curve_for("v100")
    with db.write() as session:
        job = Job(
            name="bert",
            state="completed",
            user="u",
            uid=1,
            command=["x"],
            workdir="/",
            gpus_min=2,
            gpus_max=2,
            duration_s=100.0,
            submitted_at=t0,
        )
        session.add(job)
        session.flush()
        declared = model_for(session, job, curve)
        assert declared.time_s(1.0, 2) == pytest.approx(100)
        for seconds, energy_j in ((50.0, 2 * 200 * 50.0), (25.0, None)):
            att = Attempt(
                job_id=job.id,
                number=1,
                state="exited",
                node="n",
                gpu_ids=[0, 1],
                run_dir="/x",
                started_at=t0,
                finished_at=t0 + timedelta(seconds=seconds),
                progress_done=1000.0,
                energy_j=energy_j,
            )
            row = learn(session, job, att, t0)
        assert row.samples == 2 and row.throughput_per_s == pytest.approx(0.5 * 40 + 0.5 * 20)
        assert row.power_w_per_gpu == pytest.approx(200)
        tuned = model_for(session, job, curve)
        assert tuned.throughput(2) == pytest.approx(30.0), "steps per second, as measured"
        assert tuned.power_w(2) == pytest.approx(2 * (200 + 50)), "NVML's draw, not the curve's"


def test_cluster_idle_power_and_right_sizing():
    from orchestrator.planning.perfmodel import ClusterPower

    power = ClusterPower(node_idle_w=150, gpu_idle_w=50, pue=1.5)
    assert power.idle_power_w(nodes_on=2, idle_gpus_on=3) == pytest.approx((300 + 150) * 1.5)
    assert power.idle_power_w(1, 0) < power.idle_power_w(2, 0), "a powered-down node saves"
