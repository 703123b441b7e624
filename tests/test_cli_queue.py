"""The queue end to end: real CLI processes, a real daemon, real jobs, a real SQLite file."""

from __future__ import annotations

import sys
import time

import pytest

from orchestrator.cli.render import JOB_KEYS

PY = sys.executable


def test_done_when_scenario(cli):
    first = cli.json(
        "submit",
        "--gpus",
        "2",
        "--",
        PY,
        "-c",
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    assert {k: first[k] for k in ("id", "state")} == {"id": 1, "state": "queued"}
    assert first["estimate_source"] == "default" and "run time 4h" in first["outlook"]
    assert cli.submit("--gpus", "4", "--", PY, "-c", "print('wide')") == 2
    cli.run_until_idle()
    job = cli.json("show", "1")
    assert job["state"] == "completed" and job["exit_code"] == 0
    for key in (
        "id",
        "name",
        "state",
        "gpus",
        "command",
        "submitted_at",
        "started_at",
        "finished_at",
        "exit_code",
        "energy_kwh",
        "carbon_g",
    ):
        assert key in job
    gpu_ids = cli.run("logs", "1").stdout.strip().split(",")
    assert len(gpu_ids) == 2 and all(g.isdigit() for g in gpu_ids)
    assert cli.run("logs", "2").stdout == "wide\n"
    wide = cli.json("show", "2")
    assert wide["gpu_ids"] == [0, 1, 2, 3]
    assert wide["started_at"] >= job["finished_at"], "the 4-GPU job waited for the 2-GPU one"
    # fake GPUs without a power draw have no energy counter: the model's energy, marked so
    assert job["energy_kwh"] > 0 and job["energy_modelled"] is True
    assert "* includes modelled energy" in cli.run("report").stdout


@pytest.mark.backends("sqlite")
def test_a_report_with_nothing_modelled_has_no_footnote_for_it(cli):
    """QA: the footnote of the '*' was printed with no star above it (no jobs at all)."""
    out = cli.run("report").stdout
    assert "total" in out and "modelled" not in out


@pytest.mark.backends("sqlite")  # rendering: the keys are the CLI's, not the store's
def test_json_keys_are_stable(cli):
    cli.submit("--name", "a", "--label", "exp1", "--", "true")
    listed = cli.json("ls")
    assert [tuple(j) for j in listed] == [JOB_KEYS]
    shown = cli.json("show", "1")
    assert tuple(shown)[:-7] == JOB_KEYS
    assert list(shown)[-7:] == [
        "estimate_s", "estimate_source", "estimate", "forced_g", "forced_kwh", "runs", "events"
    ]  # fmt: skip
    assert "env" not in shown, "the environment may hold secrets"
    nodes = cli.json("nodes")
    assert nodes[0]["gpus"] == 4 and nodes[0]["gpu_source"] == "fake"
    assert set(nodes[0]) == {
        "name",
        "executor",
        "gpus",
        "gpus_busy",
        "gpus_free",
        "gpu_model",
        "gpu_source",
        "rack",
        "host",
        "reachable",
        "last_seen",
        "error",
        "shared_account",  # one remote account for every submitter: one trust domain
        "power",  # right-sizing: on, off, waking, powering off, wake failed
        "power_since",
        "power_error",
        "gpu_list",
    }
    assert set(nodes[0]["gpu_list"][0]) == {
        "index",
        "uuid",
        "model",
        "memory_mb",
        "memory_used_mb",
        "utilization_pct",
        "power_draw_w",
        "power_limit_w",
        "power_default_w",
        "power_min_w",
        "power_max_w",
        "job_id",  # the job on it (the first to hold it where two share it)
        "job_ids",  # every job on it: two where jobs share it
    }


def test_job_environment_workdir_and_exit_code(cli, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "import os, sys; print(os.environ['GRIDSHIFT_JOB_ID'], os.environ['FOO'], "
        "os.getcwd()); sys.exit(3)"
    )
    cli.submit(
        "--gpus", "0", "--env", "FOO=bar baz", "--workdir", str(work), "--", PY, "-c", script
    )
    cli.run_until_idle()
    job = cli.json("show", "1")
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["reason"] == "exit code 3"
    assert cli.run("logs", "1").stdout.strip() == f"1 bar baz {work}"


def test_command_is_never_run_through_a_shell(cli, tmp_path):
    marker = tmp_path / "pwned"
    cli.submit("--gpus", "0", "--", "echo", f"$(touch {marker})", ";", "rm", "-rf", "/")
    cli.run_until_idle()
    assert cli.run("logs", "1").stdout == f"$(touch {marker}) ; rm -rf /\n"
    assert not marker.exists()


def test_unknown_command_fails_with_127(cli):
    cli.submit("--gpus", "0", "--", "no-such-program-xyz")
    cli.run_until_idle()
    job = cli.json("show", "1")
    assert job["state"] == "failed" and job["exit_code"] == 127
    assert "no-such-program-xyz" in cli.run("logs", "1").stdout


def test_priority_then_submission_order(cli, tmp_path):
    order = tmp_path / "order"
    ids = {}
    for name, prio in (("low", "0"), ("high", "5"), ("low2", "0"), ("mid", "1")):
        ids[name] = cli.submit(
            "--gpus",
            "4",
            "--name",
            name,
            "--priority",
            prio,
            "--",
            "sh",
            "-c",
            f"echo {name} >> {order}",
        )
    cli.run_until_idle()
    assert order.read_text().split() == ["high", "mid", "low", "low2"]


def test_failed_dependency_fails_dependants(cli, tmp_path):
    a = cli.submit("--gpus", "0", "--", "false")
    b = cli.submit("--gpus", "0", "--after", str(a), "--", "true")
    c = cli.submit("--gpus", "0", "--after", str(b), "--", "true")
    ok = cli.submit("--gpus", "0", "--", "true")
    after_ok = cli.submit("--gpus", "0", "--after", f"{ok}", "--", "true")
    cli.run_until_idle()
    assert cli.json("show", str(a))["state"] == "failed"
    job_b = cli.json("show", str(b))
    assert job_b["state"] == "failed" and job_b["reason"] == f"dependency {a} failed"
    assert job_b["started_at"] is None
    assert cli.json("show", str(c))["reason"] == f"dependency {b} failed"
    done = cli.json("show", str(after_ok))
    assert done["state"] == "completed"
    assert done["started_at"] >= cli.json("show", str(ok))["finished_at"]


def test_cancel_queued_and_running(cli):
    running = cli.submit("--gpus", "4", "--", "sleep", "60")
    queued = cli.submit("--gpus", "4", "--", "true")
    daemon = cli.daemon("--interval", "0.1")
    cli.wait_state(running, {"running"})
    out = cli.run("cancel", str(queued), str(running)).stdout
    assert f"job {queued}: cancelled" in out and f"job {running}: stopping" in out
    job = cli.wait_state(running, {"cancelled"}, timeout=15)
    assert job["exit_code"] == 128 + 15  # SIGTERM
    assert cli.json("show", str(queued))["started_at"] is None
    assert "already cancelled" in cli.run("cancel", str(queued)).stdout
    daemon.terminate()
    assert daemon.wait(timeout=10) == 0


def test_cancel_escalates_to_sigkill(cli, tmp_path):
    cli.home.joinpath("gridshift.toml").write_text("cancel_grace_s = 0.5\n")
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    job_id = cli.submit("--gpus", "1", "--", PY, "-c", stubborn)
    cli.daemon("--interval", "0.1")
    cli.wait_state(job_id, {"running"})
    while "up" not in cli.run("logs", str(job_id)).stdout:
        time.sleep(0.05)
    cli.run("cancel", str(job_id))
    job = cli.wait_state(job_id, {"cancelled"}, timeout=15)
    assert job["exit_code"] == 128 + 9


def test_sweep_file_all_or_nothing(cli, tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"name": "lr1", "gpus": 1, "command": ["true"], "labels": ["sweep"]}\n'
        "# comment lines and blank lines are skipped\n\n"
        '{"name": "lr2", "gpus": "1-2", "duration": "1h", "command": "echo hi there", '
        '"env": {"LR": "0.2"}}\n'
    )
    out = cli.json("submit", "--file", str(good))
    assert [(j["id"], j["state"]) for j in out] == [(1, "queued"), (2, "queued")]
    assert cli.json("show", "2")["command"] == ["echo", "hi", "there"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "ok", "command": ["true"]}\n{"name": "broken", "gpus": "x"}\n')
    proc = cli.run("submit", "--file", str(bad), check=False)
    assert proc.returncode == 2 and f"{bad}:2:" in proc.stderr
    assert cli.job_count() == 2


def test_gpu_range_runs_at_the_maximum_that_fits(cli):
    cli.submit("--gpus", "2-8", "--", "true")
    cli.run_until_idle()
    job = cli.json("show", "1")
    assert job["gpu_ids"] == [0, 1, 2, 3] and job["gpus_min"] == 2 and job["gpus_max"] == 8


def test_logs_follow_streams_until_the_job_ends(cli):
    job_id = cli.submit(
        "--", PY, "-c", "import time\nfor i in range(3):\n print(i, flush=True)\n time.sleep(0.3)"
    )
    cli.daemon("--interval", "0.1")
    proc = cli.run("logs", str(job_id), "--follow", timeout=30)
    assert proc.stdout.split() == ["0", "1", "2"]


@pytest.mark.backends("sqlite")  # one host, one file: a second daemon is a mistake
def test_second_daemon_refuses_to_start(cli):
    cli.submit("--", "sleep", "30")
    first = cli.daemon("--interval", "0.1")
    cli.wait_state(1, {"running"})
    second = cli.run("daemon", check=False, timeout=30)
    assert second.returncode == 1 and "another gridshift daemon" in second.stderr
    assert first.poll() is None


def test_files_are_private_by_default(cli):
    cli.submit("--", "true")
    cli.run_until_idle()
    files = [cli.home / "logs" / "1.log"]
    if cli.backend == "sqlite":
        files.append(cli.home / "gridshift.db")
    for path in files:
        assert path.stat().st_mode & 0o077 == 0, path
    assert (cli.home / "logs").stat().st_mode & 0o077 == 0


def test_energy_is_recorded_when_the_gpus_can_measure_it(cli):
    cli.env["GRIDSHIFT_FAKE_GPU_POWER_W"] = "300"
    cli.submit("--gpus", "2", "--", "sleep", "1")
    cli.run_until_idle()
    job = cli.json("show", "1")
    expected_kwh = 2 * 300 * 1.0 / 3.6e6  # two GPUs at 300 W for about a second
    assert job["energy_kwh"] == pytest.approx(expected_kwh, rel=0.3)


def test_progress_reports_and_calibration(cli):
    # the two-line helper from the README, in a job that reports 40 of 100 steps, then all
    script = (
        "import os, time\n"
        "def report(done, total):\n"
        "    open(os.environ['GRIDSHIFT_PROGRESS_FILE'], 'w').write(f'{done} {total}')\n"
        "report(40, 100); time.sleep(1.5); report(100, 100)"
    )
    job_id = cli.submit(
        "--name", "resnet", "--gpus", "2", "--duration", "10s", "--", PY, "-c", script
    )
    cli.daemon("--interval", "0.1")
    deadline = time.monotonic() + 20
    while (job := cli.json("show", str(job_id)))["progress_source"] != "reported":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["progress"] == 0.4 and job["state"] == "running"
    done = cli.wait_state(job_id, {"completed"})
    assert done["progress"] == 1.0
    (row,) = cli.db_rows("SELECT name, gpus, throughput_per_s, samples FROM calibration")
    assert row[:2] == ("resnet", 2) and row[3] == 1
    assert 100 / 3.0 < row[2] < 100 / 1.4, "about 100 steps over the ~1.6 s run"


def test_progress_is_estimated_without_reports(cli):
    job_id = cli.submit("--duration", "20s", "--", "sleep", "30")
    cli.daemon("--interval", "0.1")
    cli.wait_state(job_id, {"running"})
    time.sleep(1.0)
    job = cli.json("show", str(job_id))
    assert job["progress_source"] == "estimated" and 0 < job["progress"] < 0.5
