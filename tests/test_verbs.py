"""pueue's verbs through the real CLI, with real processes: hold and release against a
live daemon, edit's bad values, logs -n, wait's exit codes, restart's output, and cancel
stopping a running job at once when no daemon runs (and within a pass when one does)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import E2E
from tests.helpers import forkcli

pytestmark = [E2E, pytest.mark.backends("sqlite")]
PY = sys.executable


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    forkcli.warm_up()


def gs(cli, *argv: str, timeout: float = 30) -> forkcli.Outcome:
    """``gridshift ARGV`` in a forked child (about 0.05 s, not a new interpreter's 1 s)."""
    env = {k: v for k, v in cli.env.items() if k.startswith("GRIDSHIFT_")}
    return forkcli.run(list(argv), cli.home, env, timeout_s=timeout)


def submit(cli, *argv: str) -> int:
    return int(gs(cli, "submit", *argv).stdout)


def reach(cli, job_id: int, *states: str, timeout: float = 30) -> None:
    """Until the job's row is in one of ``states`` (read here: no CLI run per look)."""
    deadline = time.monotonic() + timeout
    while cli.job_state(job_id) not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {cli.job_state(job_id)}"
        time.sleep(0.05)


def ls(cli) -> dict[int, dict]:
    return {j["id"]: j for j in json.loads(gs(cli, "ls", "--json").stdout)}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_held_job_waits_with_a_free_gpu_and_starts_once_released(cli):
    held = submit(cli, "--now", "--", "true")
    after = submit(cli, "--now", "--after", str(held), "--", "true")
    assert gs(cli, "hold", str(held)).stdout == f"job {held}: held\n"
    cli.daemon("--interval", "0.1")
    marker = submit(cli, "--now", "--", "true")  # passes went by, GPUs were free
    reach(cli, marker, "completed")
    time.sleep(0.5)
    jobs = ls(cli)
    assert jobs[held]["state"] == "held" and jobs[held]["started_at"] is None
    assert jobs[after]["state"] == "queued" and jobs[after]["planned_start"] is None
    assert f"after job {held}, which is held" in jobs[after]["plan_note"]
    proc = gs(cli, "release", str(held), str(after))  # after is not held
    assert proc.code == 2 and proc.stderr.count("\n") == 1 and "not held" in proc.stderr
    assert cli.job_state(held) == "held"  # all or none
    assert gs(cli, "release", str(held)).stdout == f"job {held}: released\n"
    wait = gs(cli, "wait", str(held), str(after), timeout=30)
    assert wait.code == 0
    assert wait.stdout.splitlines() == [f"job {held}: completed (exit 0)",
                                        f"job {after}: completed (exit 0)"]  # fmt: skip


def test_edit_refuses_bad_values_in_one_line_and_restart_says_what_it_copies(cli):
    job = submit(cli, "--duration", "1h", "--", "true")
    for args, message in [
        (["--duration", "-3h"], "invalid duration"),
        (["--gpus", "2-1"], "below the minimum"),
        (["--within", "30m"], "could never meet it"),
        (["--deadline", "yesterday"], "invalid deadline"),
    ]:
        proc = gs(cli, "edit", str(job), *args)
        assert proc.code == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert message in proc.stderr and proc.stdout == ""
    out = gs(cli, "edit", str(job), "--priority", "7", "--gpus", "2", "--name", "n").stdout
    assert out.startswith(f"job {job} (queued): priority 7, gpus 2, duration 1h")
    shown = json.loads(gs(cli, "show", "--json", str(job)).stdout)
    assert (shown["priority"], shown["gpus_min"], shown["name"]) == (7, 2, "n")
    proc = gs(cli, "restart", str(job))
    assert proc.code == 2 and "only a finished job" in proc.stderr
    gs(cli, "cancel", str(job))
    assert gs(cli, "restart", str(job)).stdout == f"job {job + 1}: restart of job {job}\n"
    proc = gs(cli, "edit", "99999999999999999999", "--priority", "1")
    assert proc.code == 2 and "out of range" in proc.stderr
    first = submit(cli, "--", "true")
    chain = [first, submit(cli, "--after", str(first), "--", "true")]
    chain.append(submit(cli, "--after", str(chain[1]), "--", "true"))
    gs(cli, "hold", str(first))
    cli.run_until_idle(timeout=30)  # a held job, and those that wait on it, keep none busy
    assert [cli.job_state(i) for i in chain] == ["held", "queued", "queued"]


def test_logs_tail_and_wait_exit_codes(cli):
    lines = 20000  # about 200 kB: more than the first stretch -n reads from the end
    talk = submit(cli, "--now", "--", PY, "-c", f"for i in range({lines}): print('line', i)")
    bad = submit(cli, "--now", "--", "sh", "-c", "exit 3")
    held = submit(cli, "--", "true")
    gs(cli, "hold", str(held))
    cli.daemon("--interval", "0.1")
    wait = gs(cli, "wait", str(talk), str(bad), timeout=30)
    assert wait.code == 1
    assert f"job {bad}: failed (exit 3): exit code 3" in wait.stdout.splitlines()
    assert gs(cli, "logs", str(talk), "-n", "3").stdout == (
        f"line {lines - 3}\nline {lines - 2}\nline {lines - 1}\n"
    )
    assert gs(cli, "logs", str(talk), "-n", "0").stdout == ""
    assert gs(cli, "logs", str(talk), "--lines", "99999").stdout.count("\n") == lines
    proc = gs(cli, "logs", str(talk), "-n", "-2")
    assert proc.code == 2 and "0 or more" in proc.stderr
    began = time.monotonic()
    proc = gs(cli, "wait", str(held), "--timeout", "1s")
    assert proc.code == 124 and f"not ended: job {held}" in proc.stderr
    assert 1.0 <= time.monotonic() - began < 5.0
    for ids in (["12345"], [str(talk), "0"]):
        proc = gs(cli, "wait", *ids)
        assert proc.code == 2 and "no job" in proc.stderr
    assert gs(cli, "wait", str(talk)).stdout == f"job {talk}: completed (exit 0)\n"


def test_cancel_with_no_daemon_stops_running_jobs_at_once(cli):
    cli.home.joinpath("gridshift.toml").write_text("cancel_grace_s = 1\n")
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    polite = submit(cli, "--now", "--", "sleep", "60")
    deaf = submit(cli, "--now", "--", PY, "-c", stubborn)
    daemon = cli.daemon("--interval", "0.1")
    reach(cli, polite, "running")
    reach(cli, deaf, "running")
    log = cli.home / "logs" / f"{deaf}.log"
    while not (log.exists() and log.read_text().startswith("up")):  # SIGTERM ignored now
        time.sleep(0.05)
    daemon.terminate()  # running jobs outlive it
    assert daemon.wait(timeout=10) == 0
    pids = {}
    for job in (polite, deaf):
        (run_dir,) = cli.db_rows(f"SELECT run_dir FROM attempt WHERE job_id = {job}")[0]
        pids[job] = json.loads((Path(run_dir) / "job.json").read_text())["pid"]
    began = time.monotonic()
    out = gs(cli, "cancel", str(polite), str(deaf)).stdout
    assert time.monotonic() - began < 8.0
    assert f"job {polite}: cancelled (stopped by SIGTERM after" in out
    assert f"job {deaf}: cancelled (stopped by SIGKILL after" in out
    for job, code in ((polite, 128 + 15), (deaf, 128 + 9)):
        shown = json.loads(gs(cli, "show", "--json", str(job)).stdout)
        assert shown["state"] == "cancelled" and shown["exit_code"] == code
        (run,) = shown["runs"]
        assert run["state"] == "exited" and run["finished_at"] and run["energy_kwh"] > 0
        assert not _pid_alive(pids[job])


def test_cancel_with_a_daemon_signals_within_a_pass(cli, tmp_path):
    heard = tmp_path / "heard"
    trap = f"trap 'date +%s.%N > {heard}; exit 0' TERM; while :; do sleep 0.05; done"
    job = submit(cli, "--now", "--", "sh", "-c", trap)
    cli.daemon()  # the default interval (daemon_interval_s, 1 s)
    reach(cli, job, "running")
    time.sleep(0.3)  # the shell has set its trap
    began = time.time()
    proc = gs(cli, "cancel", str(job))
    assert proc.code == 0 and "stopping" in proc.stdout
    deadline = time.monotonic() + 10
    while not heard.exists():
        assert time.monotonic() < deadline, "the daemon signalled the job"
        time.sleep(0.05)
    time.sleep(0.05)
    assert float(heard.read_text()) - began < 3.0  # the request, then at most one pass
    reach(cli, job, "cancelled")


def test_cancel_with_no_daemon_keeps_the_carbon_the_daemon_counted(cli):
    toml = 'cancel_grace_s = 1\n[daemon]\npower_sample = "1s"\n'
    cli.home.joinpath("gridshift.toml").write_text(toml)
    job = submit(cli, "--now", "--", "sleep", "60")
    daemon = cli.daemon("--interval", "0.1", "--grid", "synthetic:replay=now")
    counted = f"SELECT carbon_g, accounted_until FROM attempt WHERE job_id = {job}"
    deadline = time.monotonic() + 30
    while not (cli.db_rows(counted) and (cli.db_rows(counted)[0][0] or 0) > 0):
        assert time.monotonic() < deadline, "the daemon counted carbon"
        time.sleep(0.1)
    time.sleep(0.5)
    daemon.terminate()
    assert daemon.wait(timeout=10) == 0
    ((carbon_g, until),) = cli.db_rows(counted)
    usage = f"SELECT sum(energy_j), sum(carbon_g) FROM usage WHERE job_id = {job}"
    ((energy_j, rows_g),) = cli.db_rows(usage)
    assert rows_g == pytest.approx(carbon_g)
    time.sleep(0.5)  # it runs on with no daemon: energy, but no carbon
    assert "cancelled (stopped by SIGTERM" in gs(cli, "cancel", str(job)).stdout
    shown = json.loads(gs(cli, "show", "--json", str(job)).stdout)
    assert shown["state"] == "cancelled"
    assert shown["carbon_g"] == pytest.approx(carbon_g, rel=1e-3)  # kept, not wiped
    assert "carbon counted up to" in shown["reason"]
    ((energy_after, rows_after),) = cli.db_rows(usage)
    assert rows_after == pytest.approx(rows_g) and energy_after > energy_j
    assert cli.db_rows(counted)[0][1] == until
