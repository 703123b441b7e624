"""Whose runs make an estimate: a job's own user's runs of its name (or labels and
command), CPU-only runs apart from GPU runs; and one job's estimate that fails is that
job's fault, never the daemon's (issue 21's review: a CPU job named like a GPU job
stopped the daemon for everyone; another user's jobs set a job's estimate and power)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.test_estimates import DEFAULT_S, T0, _estimate, _job, _ran, session  # noqa: F401

ALICE, BOB = 1000, 1001


def test_cpu_runs_and_gpu_runs_of_one_name_are_apart(session):  # noqa: F811
    """A CPU-only run (width 0) says nothing of a GPU job of its name, and a GPU run
    nothing of a CPU-only job's; a CPU job's estimate from CPU runs is not scaled."""
    cpu = dict(name="train", gpus_min=0, gpus_max=0)
    _ran(session, _job(session, state="completed", **cpu), 30.0, gpus=0)
    gpu_job = _estimate(session, _job(session, name="train"))  # x2, no GPU run known
    assert (gpu_job.run_s, gpu_job.source) == (DEFAULT_S, "default")

    _ran(session, _job(session, name="train", state="completed"), 600.0, gpus=1)
    gpu_job = _estimate(session, _job(session, name="train"))
    assert gpu_job.note == "from 1 earlier run at x1, scaled to x2", "the GPU run only"
    assert gpu_job.run_s == pytest.approx(600.0 / 1.8)
    cpu_job = _estimate(session, _job(session, **cpu))
    assert (cpu_job.run_s, cpu_job.note) == (30.0, "from 1 earlier run at x0")
    assert cpu_job.power_w_per_gpu is None


def test_another_users_runs_and_calibration_set_nothing(session):  # noqa: F811
    """Bob's five `sleep 1` jobs named `train`, and the power they measured, neither
    shorten Alice's `train` nor set its power; her own runs and calibration do."""
    from orchestrator.accounting.calibration import learn, model_for
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.queue.models import Calibration

    for _ in range(5):
        bobs = _job(session, name="train", uid=BOB, user="bob", state="completed")
        att = _ran(session, bobs, 1.0, progress_done=10.0, energy_j=1e-3)
    assert learn(session, bobs, att, T0).uid == BOB
    alice = _job(session, name="train", uid=ALICE, user="alice", duration_s=None)
    est = _estimate(session, alice)
    assert (est.source, est.power_w_per_gpu) == ("default", None), "not Bob's"
    assert model_for(session, alice, curve_for("")) is None, "Bob's calibration is not hers"

    hers = _job(session, name="train", uid=ALICE, user="alice", state="completed")
    att = _ran(session, hers, 3600.0, progress_done=3600.0, energy_j=2 * 250.0 * 3600.0)
    learn(session, hers, att, T0)
    session.add(Calibration(name="train", gpus=2, gpu_model="", uid=-1, throughput_per_s=9.0,
                            power_w_per_gpu=1.0, updated_at=T0))  # fmt: skip  # no owner
    est = _estimate(session, alice)
    assert (est.source, est.run_s) == ("history", pytest.approx(3600.0))
    assert est.power_w_per_gpu == pytest.approx(250.0), "her own, not Bob's or no one's"
    assert model_for(session, alice, curve_for("")).throughput(2) == pytest.approx(1.0)


@pytest.mark.backends("sqlite")  # the daemon's containment, not the store's backend
def test_one_jobs_failing_estimate_does_not_end_the_pass(tmp_path, db_url, monkeypatch, caplog):
    from orchestrator.accounting import estimates
    from orchestrator.daemon.service import Daemon
    from orchestrator.queue.db import Database
    from orchestrator.settings import Settings

    settings = Settings(home=tmp_path / "home", fake_gpus=4,
                        daemon={"policy": "fifo", "grid": ["synthetic:days=2"]})  # fmt: skip
    db = Database(db_url)
    db.ensure_schema()
    with db.write() as s:
        bad, good = (_job(s, name=n, submitted_at=T0 - timedelta(hours=1)).id for n in "bg")
        _ran(s, _job(s, name="g", state="completed"), 120.0)
    real = estimates._from_history

    def broken(job, history, model):
        if job.id == bad:
            raise ValueError("a defect in one job's estimate")
        return real(job, history, model)

    monkeypatch.setattr(estimates, "_from_history", broken)
    queue = Daemon(settings=settings, db=db).queue
    queue.plan(T0.timestamp())  # does not raise
    assert queue.known[bad].source == "default"
    assert queue.known[good].source == "history" and queue.known[good].run_s == 120.0
    assert f"job {bad}: no run-time estimate from its records" in caplog.text
    with db.read() as s:  # what `plan`, `submit` and `show` call: contained there too
        from orchestrator.queue.models import Job

        jobs = [s.get(Job, bad), s.get(Job, good)]
        known = estimates.estimates(s, jobs, 4 * 3600.0, T0)
    assert known[bad].source == "default" and known[good].source == "history"


@pytest.mark.backends("sqlite")
def test_a_cpu_job_named_like_a_gpu_job_stops_nothing(cli):
    """The review's repro with the real CLI: a finished `--gpus 0` job, then a GPU job of
    its name with no --duration: submit, plan, show and the daemon all work."""
    cli.run("submit", "--now", "--gpus", "0", "--name", "train", "--", "true")
    cli.run_until_idle()
    assert cli.db_rows("SELECT state, gpus_max FROM job") == [("completed", 0)]
    made = cli.run("submit", "--gpus", "1", "--name", "train", "--", "true", check=False)
    assert made.returncode == 0 and "Traceback" not in made.stderr, made.stderr
    assert "lab default" in made.stderr, "no GPU run of its name: the lab default"
    job_id = int(made.stdout)
    grid = f"synthetic:start={datetime.now(UTC):%Y-%m-%d}&days=3"
    assert "train" in cli.run("plan", "--grid", grid).stdout
    assert cli.json("show", str(job_id))["estimate_source"] == "default"
    cli.run_until_idle()  # exits 0: the daemon planned and ran it
    assert cli.db_rows(f"SELECT state FROM job WHERE id = {job_id}") == [("completed",)]
