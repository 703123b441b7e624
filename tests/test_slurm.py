"""gridshift on a real single-node Slurm cluster (munged, slurmctld, slurmd, slurmdbd):
the daemon hands due jobs to Slurm and reads their end from sacct; jobs submitted by hand
are capacity gridshift does not use; and a what-if plan handed over with
``plan --submit`` runs each job at its planned start."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from executors.slurm import parse_exit, parse_gres_gpus, parse_sacct
from tests.conftest import E2E
from tests.helpers.waiting import wait_for

# the Slurm executor's tests: the store's part is the daemon's own, which test_cli_queue,
# test_crash_recovery and test_daemon_live run on both backends
pytestmark = [E2E, pytest.mark.backends("sqlite")]

HIGH, LOW = 500.0, 100.0


@pytest.fixture
def slurm_cli(cli, slurm_cluster):
    cli.home.joinpath("gridshift.toml").write_text(
        '[[nodes]]\nname = "cluster"\nexecutor = "slurm"\ngpus = 4\n'
    )
    cli.env["SLURM_CONF"] = str(slurm_cluster.conf)
    cli.cluster = slurm_cluster
    return cli


def _sacct(cluster, job_id: str, fields: str) -> list[str]:
    """sacct's record of a job, once slurmdbd has stored it (it lags the controller)."""
    argv = ("sacct", "-X", "-n", "--parsable2", "-j", job_id, "-o", fields)
    return wait_for(lambda: cluster.cmd(*argv).stdout.strip(), 15, f"sacct {job_id}").split("|")


def test_daemon_runs_jobs_on_slurm_and_show_reports_sacct(slurm_cli):
    cli = slurm_cli
    failing = cli.submit("--gpus", "2", "--", "sh", "-c", 'echo "slurm job $SLURM_JOB_ID"; exit 3')
    fine = cli.submit("--gpus", "1", "--duration", "1m", "--", "sh", "-c", "echo done")
    cli.run_until_idle(timeout=120)
    bad, good = cli.json("show", str(failing)), cli.json("show", str(fine))
    assert bad["state"] == "failed" and bad["exit_code"] == 3
    assert good["state"] == "completed" and good["exit_code"] == 0
    run = bad["runs"][0]
    assert run["slurm"]["state"] == "FAILED" and run["slurm"]["exit_code"] == 3
    slurm_id = run["slurm"]["job_id"]
    assert cli.run("logs", str(failing)).stdout.strip() == f"slurm job {slurm_id}"
    assert "gres/gpu=2" in _sacct(cli.cluster, slurm_id, "AllocTRES")[0].split(",")
    ok = good["runs"][0]
    assert ok["slurm"]["state"] == "COMPLETED" and ok["slurm"]["exit_code"] == 0
    assert ok["energy_modelled"], "no energy counter in this cluster: modelled, and marked so"
    # --time: 1 min estimate + 25 % + 5 min = 6.25 min, rounded up
    assert _sacct(cli.cluster, ok["slurm"]["job_id"], "Timelimit") == ["00:07:00"]
    text = cli.run("show", str(failing)).stdout
    assert f"Slurm job {slurm_id}: FAILED, exit code 3" in text


def test_jobs_submitted_by_hand_are_capacity_gridshift_does_not_use(slurm_cli, tmp_path):
    cli = slurm_cli
    theirs = cli.cluster.cmd("sbatch", "--parsable", "--gres=gpu:3", "-o", "/dev/null",
                             "--wrap", "sleep 60").stdout.strip()  # fmt: skip
    wait_for(lambda: _sacct(cli.cluster, theirs, "State") == ["RUNNING"], 30, "the hand job")
    mine = cli.submit("--gpus", "2", "--", "true")
    daemon = cli.daemon("--interval", "0.2")
    time.sleep(3)  # several passes while 1 GPU of 4 is free
    job = cli.json("show", str(mine))
    assert job["state"] == "queued" and job["runs"] == [], "gridshift waits for room"
    cli.cluster.cmd("scancel", theirs)
    done = cli.wait_state(mine, {"completed", "failed"}, timeout=60)
    assert done["state"] == "completed"
    daemon.terminate()
    their_end = datetime.fromisoformat(_sacct(cli.cluster, theirs, "End")[0])
    my_start = datetime.fromisoformat(_sacct(cli.cluster, done["runs"][0]["slurm"]["job_id"],
                                             "Start")[0])  # fmt: skip
    assert my_start >= their_end


def _trace(path: Path, t0: int, low_from_s: int, low_to_s: int) -> None:
    lines = ["time,carbon_g_per_kwh"]
    for i in range(-600, 3600, 5):
        low = low_from_s <= i < low_to_s
        lines.append(f"{datetime.fromtimestamp(t0 + i, UTC).isoformat()},{LOW if low else HIGH}")
    path.write_text("\n".join(lines) + "\n")


def test_a_what_if_plan_handed_to_slurm_runs_at_the_planned_times(slurm_cli, tmp_path):
    cli = slurm_cli
    t0 = int(time.time()) // 5 * 5
    trace = tmp_path / "trace.csv"
    # low carbon from t0+20 s to t0+50 s: 15-20 s from now, twice what submitting, planning
    # and seeing both jobs pend on their begin time take here (about 7 s) on a loaded machine
    _trace(trace, t0, 20, 50)
    for _ in range(2):
        cli.submit("--gpus", "2", "--duration", "10s", "--within", "3m", "--", "sleep", "3")
    plan = cli.json("plan", "--grid", f"csv:{trace}", "--slot", "5s", "--submit")
    starts = {r["id"]: datetime.fromisoformat(r["start"]) for r in plan["jobs"]}
    assert all(t0 + 15 <= s.timestamp() <= t0 + 50 for s in starts.values()), plan["jobs"]
    assert [s["action"] for s in plan["submitted"]] == ["submitted", "submitted"]
    for row in plan["submitted"]:
        squeue = ("squeue", "-h", "-j", row["slurm_job_id"], "-o", "%T %r")
        # held, released once recorded, then pending on its begin time (Slurm's scheduler
        # sets the reason on its next pass)
        wait_for(lambda q=squeue: cli.cluster.cmd(*q).stdout.split() == ["PENDING", "BeginTime"],
                 what="the job pending on its begin time")  # fmt: skip
        assert cli.json("show", str(row["id"]))["state"] == "planned"
    cli.daemon("--interval", "0.2")
    for job_id, planned in starts.items():
        job = cli.wait_state(job_id, {"completed", "failed"}, timeout=120)
        assert job["state"] == "completed" and job["exit_code"] == 0
        started = datetime.fromisoformat(job["runs"][0]["slurm"]["started_at"])
        # within Slurm's granularity: whole seconds, and its scheduler's 1 s pass
        assert -1.0 <= (started - planned).total_seconds() <= 6.0, (started, planned)
        assert datetime.fromisoformat(job["runs"][0]["started_at"]) == started


def test_a_plan_that_moved_moves_the_slurm_job(slurm_cli, tmp_path):
    cli = slurm_cli
    t0 = int(time.time()) // 5 * 5
    trace = tmp_path / "trace.csv"
    _trace(trace, t0, 600, 900)
    job_id = cli.submit("--gpus", "1", "--duration", "10s", "--within", "30m", "--", "true")
    first = cli.json("plan", "--grid", f"csv:{trace}", "--slot", "5s", "--submit")
    (row,) = first["submitted"]
    _trace(trace, t0, 300, 600)  # a new forecast: the low window came earlier
    again = cli.json("plan", "--grid", f"csv:{trace}", "--slot", "5s", "--submit")
    (moved,) = again["submitted"]
    assert moved["action"] == "moved" and moved["slurm_job_id"] == row["slurm_job_id"]
    line = cli.cluster.cmd("scontrol", "show", "job", row["slurm_job_id"], "-o").stdout
    begin = next(w.split("=", 1)[1] for w in line.split() if w.startswith("StartTime="))
    assert abs(datetime.fromisoformat(begin).timestamp() - (t0 + 300)) <= 5, begin
    assert cli.json("show", str(job_id))["state"] == "planned"
    cli.run("cancel", str(job_id))
    cli.daemon("--interval", "0.2")
    assert cli.wait_state(job_id, {"cancelled"}, timeout=60)["state"] == "cancelled"
    assert _sacct(cli.cluster, row["slurm_job_id"], "State")[0].startswith("CANCELLED")


def test_sacct_and_squeue_fields_parse():
    text = (
        "7|gs-a1|FAILED|3:0|2026-01-01T10:00:00|2026-01-01T10:00:05|\n"
        "7.batch|batch|FAILED|3:0|2026-01-01T10:00:00|2026-01-01T10:00:05|1500\n"
        "7.0|step|COMPLETED|0:0|2026-01-01T10:00:00|2026-01-01T10:00:05|500\n"
        "8|gs-a2|CANCELLED by 0|0:9|Unknown|2026-01-01T10:00:00|2000\n"
    )
    jobs = parse_sacct(text)
    assert jobs["7"].exit_code == 3 and jobs["7"].energy_j == 2000.0, "steps' energy summed"
    assert jobs["8"].state == "CANCELLED" and jobs["8"].exit_code == 137
    assert jobs["8"].started_at is None and jobs["8"].energy_j == 2000.0
    assert parse_exit("0:15") == (143, 15) and parse_exit("x") == (None, None)
    assert parse_gres_gpus("gres/gpu:2") == 2 and parse_gres_gpus("gpu:a100:4") == 4
    assert parse_gres_gpus("gres:gpu:1,gres:nic:2") == 1 and parse_gres_gpus("N/A") == 0


def test_a_silent_slurm_controller_makes_the_node_unreachable_not_the_daemon_fail(
    tmp_path,
):
    from executors.base import Handle, RunStatus
    from executors.slurm import SlurmExecutor

    ex = SlurmExecutor(node="cluster", bin_dir=str(tmp_path))  # no squeue there
    handle = Handle(1, str(tmp_path), {"node": "cluster", "slurm_job_id": "5"})
    ex.refresh([handle])  # does not raise: the daemon's pass goes on
    assert ex.poll(handle).status is RunStatus.UNREACHABLE
    assert "squeue not found" in ex.poll(handle).detail
    assert set(ex.unreachable_nodes()) == {"cluster"} and ex.foreign_gpus() == {}
