"""A job's expected run time, in the issue's order: its --duration; its own progress
reports; earlier runs of its name (or labels and command), with the power they measured;
else the lab's default_duration. What submit says it will do, and --now / --within 0."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEFAULT_S = 4 * 3600.0


def _job(session, **fields):
    from orchestrator.queue.models import Job

    base = dict(
        state="queued", user="u", uid=1, command=["python", "train.py"], workdir="/",
        gpus_min=2, gpus_max=2, submitted_at=T0,
    )  # fmt: skip
    job = Job(**(base | fields))
    session.add(job)
    session.flush()
    return job


def _ran(session, job, seconds: float, gpus: int = 2, **fields):
    from orchestrator.queue.models import Attempt

    att = Attempt(
        job_id=job.id, number=job.attempts + 1, state="exited", node="n",
        gpu_ids=list(range(gpus)), run_dir="/x", started_at=T0,
        finished_at=T0 + timedelta(seconds=seconds), **fields,
    )  # fmt: skip
    job.attempts += 1
    job.gpu_ids = list(range(gpus))
    session.add(att)
    session.flush()
    return att


@pytest.fixture
def session(tmp_path):
    from orchestrator.queue.db import Database

    db = Database(f"sqlite:///{tmp_path / 'e.db'}")
    db.ensure_schema()
    with db.write() as s:
        yield s


def _estimate(session, job):
    from orchestrator.accounting.estimates import estimates

    return estimates(session, [job], DEFAULT_S, T0 + timedelta(hours=10))[job.id]


def test_the_estimate_comes_from_duration_then_progress_then_history_then_default(session):
    from orchestrator.queue.models import Calibration

    for seconds in (100.0, 200.0, 600.0, 7200.0):  # earlier completed runs of "bert"
        _ran(session, _job(session, name="bert", state="completed"), seconds)
    _ran(session, _job(session, name="bert", state="failed"), 9.0)  # not a completed run
    session.add(Calibration(name="bert", gpus=2, uid=1, throughput_per_s=1.0, power_w_per_gpu=210.0,
                            samples=4, updated_at=T0))  # fmt: skip

    given = _job(session, name="bert", duration_s=50.0)
    assert (_estimate(session, given).run_s, _estimate(session, given).source) == (50.0, "duration")

    learned = _estimate(session, _job(session, name="bert"))
    assert learned.source == "history" and learned.run_s == pytest.approx(400.0), "the median"
    assert learned.note == "from 4 earlier runs at x2" and learned.power_w_per_gpu == 210.0

    running = _job(session, name="bert", state="running")
    _ran(session, running, 300.0, progress_done=25.0, progress_total=100.0,
         progress_at=T0 + timedelta(seconds=300))  # fmt: skip
    own = _estimate(session, running)
    assert own.source == "progress" and own.run_s == pytest.approx(1200.0), "300 s for 25 %"

    wider = _estimate(session, _job(session, name="bert", gpus_min=4, gpus_max=4))
    # scaled by the model's scaling: speed-up(n) = n · 0.9^log2(n), so 400 s · 1.8 / 3.24
    assert wider.source == "history" and wider.run_s == pytest.approx(400.0 * 1.8 / 3.24)
    assert wider.note == "from 4 earlier runs at x2, scaled to x4"

    fresh = _estimate(session, _job(session, name="gpt"))
    assert (fresh.run_s, fresh.source) == (DEFAULT_S, "default")


def test_unnamed_jobs_learn_from_runs_with_the_same_labels_and_command(session):
    _ran(session, _job(session, state="completed", labels=["lr"]), 90.0)
    _ran(session, _job(session, state="completed", labels=["lr"], command=["other"]), 5.0)
    assert _estimate(session, _job(session, labels=["lr"])).run_s == pytest.approx(90.0)
    assert _estimate(session, _job(session, labels=["x"])).source == "default"


def test_the_planner_models_an_estimated_job_and_says_where_its_run_time_came_from():
    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.planning.perfmodel import JobModel, curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.snapshot import PlanInputs, RunEstimate, build_snapshot, plan_rows
    from orchestrator.queue.models import Job

    now_s = T0.timestamp()
    jobs = [
        Job(id=i, state="queued", user="u", uid=1, command=["x"], workdir="/", gpus_min=1,
            gpus_max=1, submitted_at=T0, deadline=T0 + timedelta(hours=12))
        for i in (1, 2)
    ]  # fmt: skip
    values = np.array([500.0] * 4 + [100.0] * 20)
    carbon = StepForecaster(StepSeries(now_s, 3600.0, values))
    known = {1: RunEstimate(3600.0, "history", "from 3 earlier runs", 150.0)}
    inputs = PlanInputs(now_s, jobs, [], 4, curve_for(None), carbon, slot_s=900.0,
                        estimates=known)  # fmt: skip
    snap = build_snapshot(inputs, 4)
    assert snap.jobs[0].duration_s == 3600.0 and snap.jobs[0].model is not None
    plain = JobModel(3600.0, 1, curve_for(None))
    assert snap.jobs[0].model.power_w(1) < plain.power_w(1), "the power earlier runs drew"
    assert snap.jobs[1].model is None, "no estimate handed in, no --duration: not modelled"
    rows = {r["id"]: r for r in plan_rows(resolve_policy("budget"), snap, inputs)}
    assert rows[1]["estimate_source"] == "history" and rows[1]["wait_h"] >= 4 - 0.25
    assert rows[1]["estimate_note"] == "from 3 earlier runs"
    assert rows[2]["estimate_source"] is None and rows[2]["wait_h"] == 0


def test_within_0_means_no_waiting_and_default_duration_is_range_checked():
    from orchestrator.errors import ConfigError
    from orchestrator.queue.spec import build_spec
    from orchestrator.settings import DaemonSettings

    for within in ("0", 0, "0s"):
        raw = {"command": ["x"], "within": within, "duration": "2h"}
        spec = build_spec(raw, now=T0, cwd="/", base_env={}, check_workdir=False)
        assert spec.deadline == T0, "its deadline is its submission: it starts now"
    assert DaemonSettings().seconds("default_duration") == 4 * 3600.0
    for bad in ("30s", "8d"):
        with pytest.raises((ValueError, ConfigError)):
            DaemonSettings(default_duration=bad)


@pytest.mark.backends("sqlite")
def test_submit_prints_the_id_on_stdout_and_what_it_will_do_on_stderr(cli):
    cli.env["GRIDSHIFT_GRID__SOURCE"] = '["uk"]'  # a daemon with a signal plans in time
    out = cli.run("submit", "--within", "24h", "--gpus", "2", "--", "python", "train.py")
    assert out.stdout == "1\n", "scripts read the id alone"
    assert out.stderr.startswith("job 1: may wait until ") and "for low carbon" in out.stderr
    assert "run time 4h by the lab default (default_duration)" in out.stderr
    now = cli.run("submit", "--now", "--duration", "1h", "--", "true")
    assert now.stdout == "2\n" and "job 2: starts now (--now); run time 1h from --duration" in (
        now.stderr
    )
    bad = cli.run("submit", "--now", "--within", "2h", "--", "true", check=False)
    assert bad.returncode == 2 and "--now is --within 0" in bad.stderr
    help_text = cli.run("submit", "--help").stdout
    assert "24 h" in help_text and "--now" in help_text and "--within 0" in help_text


@pytest.mark.backends("sqlite")  # the daemon's planning, not the store's backend
def test_the_live_daemon_defers_a_job_with_no_duration_by_its_earlier_runs(cli, tmp_path):
    import time

    from tests.test_daemon_live import HIGH, LOW, _intensity, _ts, _write_trace

    sweep = tmp_path / "seed.jsonl"  # three real earlier runs of "short", about 1 s each
    line = '{"name": "short", "within": 0, "command": ["sleep", "1"]}\n'
    sweep.write_text(line * 3)
    cli.run("submit", "--file", str(sweep))
    cli.run_until_idle()
    assert cli.db_rows("SELECT state FROM job") == [("completed",)] * 3
    made = cli.run("submit", "--within", "40s", "--name", "short", "--", "sleep", "1")
    job_id = int(made.stdout)
    assert cli.db_rows("SELECT DISTINCT gpu_model FROM attempt") == [("fake-gpu",)]
    assert "from 3 earlier runs on fake-gpu x1" in made.stderr, "its GPU model and width"
    assert "may wait until" not in made.stderr, (
        "no grid signal in the settings: said to start when GPUs are free"
    )
    shown = cli.json("show", str(job_id))
    assert shown["estimate_source"] == "history" and "from 3 earlier runs" in shown["estimate"]
    assert 0.5 < shown["estimate_s"] < 5
    t0 = int(time.time()) + 1  # high carbon now; the first low window is 4 s ahead
    trace = tmp_path / "trace.csv"
    _write_trace(trace, t0)
    at = _intensity(t0)
    assert at(time.time()) == HIGH
    cli.daemon("--grid", f"csv:{trace}", "--slot", "1s", "--interval", "0.2")  # killed after
    done = cli.wait_state(job_id, {"completed"}, timeout=30)
    (run,) = done["runs"]
    started = _ts(run["started_at"])
    assert started >= t0 + 3.5 and at(started + 0.5) == LOW, "deferred into the low window"


def test_the_daemon_keeps_earlier_runs_between_passes_until_a_job_completes(session):
    from orchestrator.accounting.estimates import History, estimates

    _ran(session, _job(session, name="bert", state="completed", finished_at=T0), 100.0)
    waiting, kept = _job(session, name="bert"), History()
    now = T0 + timedelta(hours=1)
    assert estimates(session, [waiting], DEFAULT_S, now, kept)[waiting.id].run_s == 100.0
    kept.runs[(1, "name", "bert")] = [(2, 55.0)]  # what it kept is what it answers from
    assert estimates(session, [waiting], DEFAULT_S, now, kept)[waiting.id].run_s == 55.0
    later = _job(session, name="bert", state="completed", finished_at=T0 + timedelta(1))
    _ran(session, later, 300.0)
    assert estimates(session, [waiting], DEFAULT_S, now, kept)[waiting.id].run_s == 200.0


def test_an_estimate_from_what_a_job_reports_is_at_most_a_year(session):
    """The progress file is the job's to write: 1 % done after 30 days would plan a
    3,000-day run, and the planner's horizon follows the jobs' ends."""
    from orchestrator.timeparse import MAX_DURATION_S

    slow = _job(session, name="slow", state="running")
    _ran(session, slow, 30 * 86400.0, progress_done=1.0, progress_total=100.0,
         progress_at=T0 + timedelta(days=30))  # fmt: skip
    est = _estimate(session, slow)
    assert est.source == "progress" and est.run_s == MAX_DURATION_S


def _lab(session, model: str, gpus: int = 4) -> None:
    """The inventory: one node of ``gpus`` GPUs of ``model``."""
    from orchestrator.queue.models import Gpu, Node

    session.add(Node(name="n", executor="local", gpus=gpus, gpu_model=model,
                     gpu_source="config", updated_at=T0))  # fmt: skip
    session.flush()
    for i in range(gpus):
        session.add(Gpu(node="n", index=i, uuid=f"g{i}", model=model))
    session.flush()


def test_earlier_runs_on_the_jobs_gpu_model_and_width_come_first(session):
    """The lab's GPUs are A100s: runs on V100s (slower) are used only when no A100 run is
    known; a run at another width is scaled by the model's scaling; a run under a power
    cap counts as the time it would have taken at full power."""
    from orchestrator.planning.perfmodel import curve_for

    _lab(session, "NVIDIA A100-SXM4-40GB")
    a100 = "NVIDIA A100-SXM4-40GB"
    for seconds in (900.0, 1000.0, 1100.0):  # V100 at its width: not its GPU model
        _ran(session, _job(session, name="bert", state="completed"), seconds, gpu_model="V100")
    _ran(session, _job(session, name="bert", state="completed"), 700.0, gpus=1, gpu_model=a100)
    est = _estimate(session, _job(session, name="bert"))
    assert est.note == f"from 1 earlier run on {a100} x1, scaled to x2"
    assert est.run_s == pytest.approx(700.0 / 1.8), "speed-up(2) = 2 · 0.9"

    capped = _job(session, name="bert", state="completed")
    _ran(session, capped, 500.0, gpu_model=a100, cap=0.5)
    _ran(session, _job(session, name="bert", state="completed"), 300.0, gpu_model=a100)
    est = _estimate(session, _job(session, name="bert"))
    at_full = 500.0 * curve_for(a100).throughput_fraction(0.5)
    assert est.note == f"from 2 earlier runs on {a100} x2"
    assert est.run_s == pytest.approx((at_full + 300.0) / 2) and at_full < 500.0

    other = _job(session, name="gpt")  # only V100 runs: used, and said so
    _ran(session, _job(session, name="gpt", state="completed"), 800.0, gpu_model="V100")
    assert _estimate(session, other).note == "from 1 earlier run on V100 x2"

    running = _job(session, name="bert", state="running")  # on a V100 node: V100 runs
    _ran(session, running, 10.0, gpu_model="V100")
    running.state = "running"
    assert _estimate(session, running).note == "from 3 earlier runs on V100 x2"


def test_calibration_is_learnt_per_gpu_model_at_full_power(session):
    """What a capped run measured is brought to full power by its GPU's curve; the power
    goes with the estimate of a job on that model, --duration or not."""
    from orchestrator.accounting.calibration import learn
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.queue.models import Calibration

    _lab(session, "V100")
    job = _job(session, name="bert", state="completed")
    att = _ran(session, job, 100.0, gpu_model="V100", cap=0.6, progress_done=50.0,
               energy_j=2 * 150.0 * 100.0)  # fmt: skip
    row = learn(session, job, att, T0)
    curve = curve_for("V100")
    assert (row.name, row.gpus, row.gpu_model, row.uid) == ("bert", 2, "V100", 1)
    assert row.throughput_per_s == pytest.approx(0.5 / curve.throughput_fraction(0.6))
    assert row.power_w_per_gpu == pytest.approx(150.0 * curve.power_w(1.0) / curve.power_w(0.6))
    session.add(Calibration(name="bert", gpus=2, gpu_model="A100", uid=1, throughput_per_s=1.0,
                            power_w_per_gpu=999.0, updated_at=T0))  # fmt: skip
    given = _estimate(session, _job(session, name="bert", duration_s=60.0))
    assert given.source == "duration" and given.power_w_per_gpu == row.power_w_per_gpu
    wide = _estimate(session, _job(session, name="bert", gpus_min=4, gpus_max=4))
    assert wide.power_w_per_gpu == row.power_w_per_gpu, "the nearest width on its model"


def test_the_planner_energy_follows_the_power_earlier_runs_measured(session):
    """Two jobs alike but for their names, both with --duration: the one whose earlier
    runs drew 40 % of the curve's full power is planned with that draw, and its energy
    and carbon follow it (the curve's for the other)."""
    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.accounting.estimates import estimates
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.snapshot import PlanInputs, build_snapshot, plan_rows
    from orchestrator.queue.models import Calibration

    _lab(session, "V100")
    curve = curve_for("V100")
    low_w = 0.4 * curve.power_w(1.0)
    session.add(Calibration(name="frugal", gpus=2, gpu_model="V100", uid=1, throughput_per_s=1.0,
                            power_w_per_gpu=low_w, samples=3, updated_at=T0))  # fmt: skip
    jobs = [_job(session, name=n, duration_s=3600.0) for n in ("frugal", "plain")]
    known = estimates(session, jobs, DEFAULT_S, T0)
    carbon = StepForecaster(StepSeries(T0.timestamp(), 3600.0, np.full(48, 200.0)))
    inputs = PlanInputs(T0.timestamp(), jobs, [], 4, curve, carbon, slot_s=900.0,
                        estimates=known)  # fmt: skip
    rows = plan_rows(resolve_policy("fifo"), build_snapshot(inputs, 4), inputs)
    frugal, plain = sorted(rows, key=lambda r: r["name"])
    host_w = 50.0  # JobModel's host share per GPU
    ratio = (low_w + host_w) / (curve.power_w(1.0) + host_w)
    assert frugal["energy_kwh"] == pytest.approx(plain["energy_kwh"] * ratio, rel=1e-3)
    assert frugal["carbon_kg"] == pytest.approx(plain["carbon_kg"] * ratio, rel=1e-3)
    assert plain["energy_kwh"] == pytest.approx(2 * (curve.power_w(1.0) + host_w) / 1000, 1e-3)
