"""The daemon never falls over because of one job: hostile run files, a vanished monitor,
an attempt whose bookkeeping fails, a restart with fewer GPUs than a running job holds.
Real daemons, real jobs, real SQLite files."""

from __future__ import annotations

import json
import resource
import signal
import sys
import time

import pytest

from executors.local import LocalExecutor
from tests.conftest import E2E
from tests.helpers.waiting import wait_for

pytestmark = [E2E, pytest.mark.backends("sqlite")]

# The job finds its run directory through its progress file. It writes garbage into the
# power log, a sample dated 1e15 (31 million years ahead), then kills its monitor and
# leaves a forged exit record: every attempt of it is lost, with why, and retried.
HOSTILE = r"""
run=$(dirname "$GRIDSHIFT_PROGRESS_FILE")
printf 'garbage line\n\377\376 x\nnan nan\n1e15 5\n' >> "$run/power.log"
sleep 1.5
printf '{"exit_code": "0", "signal": 1e999, "ended_at": 12}' > "$run/exit.json.tmp"
mv "$run/exit.json.tmp" "$run/exit.json"
kill -9 $PPID
"""


def hand_written_rows(cli, template: int, wrong: dict[str, str] | None = None) -> dict[int, str]:
    """Copies of queued job ``template`` with values no CLI accepts, written straight
    into the database (as an old or hand-edited one may hold): id -> what is wrong."""
    from sqlalchemy import create_engine, text

    wrong = wrong or {
        "duration_s = 9e999": "duration inf s",
        "duration_s = 99999999 * 604800.0": "duration 60479999395200.0 s",
        "deadline = '9999-12-31 00:00:00.000000'": "more than ten years after submission",
        "gpus_max = 1099511627776": "GPUs 1-1099511627776",
    }
    engine = create_engine(cli.db_url)
    made = {}
    with engine.begin() as conn:
        columns = [r[1] for r in conn.execute(text("PRAGMA table_info(job)")) if r[1] != "id"]
        names = ", ".join(columns)
        for change, why in wrong.items():
            conn.execute(
                text(f"INSERT INTO job ({names}) SELECT {names} FROM job WHERE id = :t"),
                {"t": template},
            )
            new = conn.execute(text("SELECT max(id) FROM job")).scalar_one()
            conn.execute(text(f"UPDATE job SET {change} WHERE id = :id"), {"id": new})
            made[new] = why
    engine.dispose()
    return made


def test_hostile_run_files_lose_that_job_and_the_others_complete(cli, tmp_path):
    hostile = cli.submit("--", "sh", "-c", HOSTILE)
    ordinary = cli.submit("--", "sh", "-c", "sleep 1; echo fine")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    log = cli.run_until_idle(timeout=120)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert max(before, peak_kb) < 500 * 1024, f"a child peaked at {peak_kb} KiB"
    assert cli.json("show", str(ordinary))["state"] == "completed"
    job = cli.json("show", str(hostile))
    assert job["state"] == "lost" and job["attempts"] == 4, job
    assert "exit.json cannot be believed: exit_code is '0'" in job["reason"], job["reason"]
    assert "not requeued again" in job["reason"]
    tos = [e["to"] for e in job["events"]]
    assert tos.count("lost") == 4 and tos.count("queued") == 4, tos
    assert "Traceback" not in log


def test_a_job_whose_monitor_vanished_is_requeued(cli, tmp_path):
    marker = tmp_path / "first"
    script = f"if [ ! -e {marker} ]; then touch {marker}; kill -9 $PPID; exit 0; fi; echo again"
    job_id = cli.submit("--", "sh", "-c", script)
    cli.run_until_idle(timeout=60)
    job = cli.json("show", str(job_id))
    assert job["state"] == "completed" and job["attempts"] == 2, job
    assert [e["to"] for e in job["events"]][-5:] == [
        "lost", "queued", "planned", "running", "completed",
    ]  # fmt: skip
    assert "monitor vanished" in next(e["reason"] for e in job["events"] if e["to"] == "lost")
    assert cli.run("logs", str(job_id)).stdout == "again\n"


def test_restart_with_fewer_gpus_than_a_running_job_holds(cli, tmp_path):
    go = tmp_path / "go"
    wait_go = f"while [ ! -e {go} ]; do sleep 0.1; done; echo wide"
    wide = cli.submit("--gpus", "4", "--", "sh", "-c", wait_go)
    daemon = cli.daemon("--interval", "0.05")
    cli.wait_state(wide, {"running"})
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    narrow = cli.submit("--gpus", "1", "--", "sh", "-c", "echo narrow")
    cli.env["GRIDSHIFT_FAKE_GPUS"] = "2"  # the config now says two: GPUs 2 and 3 are gone
    restarted = cli.daemon("--interval", "0.2")
    # its own first pass (the killed daemon's node row and health row are still there:
    # under load, waiting for those let the job end before the daemon ever saw it)
    wait_for(lambda: cli.db_rows("SELECT pid FROM health") == [(restarted.pid,)], what="start")
    # passes go by (about 7, as 3 s of 0.5 s passes were): the daemon lives, and places
    # nothing on GPUs 0 and 1
    time.sleep(1.5)
    assert restarted.poll() is None, "the daemon stopped at start"
    assert cli.job_state(wide) == "running" and cli.job_state(narrow) == "queued"
    go.touch()
    cli.wait_state(narrow, {"completed"})
    restarted.terminate()
    log = restarted.communicate(timeout=30)[1]
    assert log.count("holds GPU(s) 2,3 of node") == 1, log
    assert "has no GPU" not in log, "no pass stopped on the GPUs that are gone"
    first = cli.json("show", str(wide))
    second = cli.json("show", str(narrow))
    assert first["state"] == "completed" and first["attempts"] == 1, first
    assert second["started_at"] >= first["finished_at"], "nothing placed on the held GPUs"


class _FailsForOne(LocalExecutor):
    """Polling one attempt raises (a defect reached only through that attempt)."""

    def __init__(self, bad_attempt: int) -> None:
        super().__init__()
        self.bad_attempt = bad_attempt

    def _do_poll(self, handle):
        if handle.attempt_id == self.bad_attempt:
            raise KeyError("monitor")
        return super()._do_poll(handle)


def test_one_attempt_whose_reaping_fails_is_skipped_with_why_and_the_pass_goes_on(
    cli, monkeypatch, caplog
):
    from tests.test_crash_recovery import _daemon

    bad = cli.submit("--", "sh", "-c", "sleep 30")
    good = cli.submit("--", sys.executable, "-c", "print('ok')")
    daemon = _daemon(cli, monkeypatch, _FailsForOne(bad_attempt=1))
    try:
        wait_for(
            lambda: (
                daemon.tick(daemon.clock.now()) is not None and cli.job_state(good) == "completed"
            ),
            timeout_s=30,
        )
        for _ in range(3):
            daemon.tick(daemon.clock.now())
    finally:
        daemon.executor.close()
    job = cli.json("show", str(bad))
    assert job["state"] == "running"
    assert "daemon error" in job["reason"] and "KeyError" in job["reason"], job["reason"]
    tracebacks = [r for r in caplog.records if r.exc_info and "attempt 1" in r.getMessage()]
    assert len(tracebacks) == 1, "logged with its traceback once, not every pass"
    json.dumps(job)


def test_rows_no_cli_accepts_fail_with_why_and_the_pass_goes_on(cli, tmp_path):
    """An infinite duration in the database stopped the carbon-aware daemon at every
    start (OverflowError in the planner); a deadline in the year 9999 swamped it."""
    from datetime import UTC, datetime, timedelta

    template = cli.submit("--duration", "1m", "--within", "2h", "--", "true")
    forged = hand_written_rows(cli, template)
    unreadable = hand_written_rows(cli, template, {
        "deadline = 'garbage'": "ValueError",
        "command = 'not json'": "JSONDecodeError",
    })  # fmt: skip
    cli.run("cancel", str(template))
    ordinary = cli.submit("--now", "--", "sh", "-c", "echo fine")  # no waiting
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    trace = tmp_path / "trace.csv"
    rows = [f"{(now + timedelta(hours=h)).isoformat()},{200 + h % 3}" for h in range(-4, 60)]
    trace.write_text("time,carbon_g_per_kwh\n" + "\n".join(rows) + "\n")
    log = cli.run("daemon", "--grid", f"csv:{trace}", "--until-idle", "--interval", "0.1",
                  timeout=120).stderr  # fmt: skip
    assert cli.json("show", str(ordinary))["state"] == "completed", log
    for job_id, why in forged.items():
        row = cli.json("show", str(job_id))
        assert row["state"] == "failed", row
        assert "the stored job cannot be believed" in row["reason"] and why in row["reason"]
    for job_id, why in unreadable.items():  # (show cannot read them either: SQL)
        ((state, reason),) = cli.db_rows(f"SELECT state, reason FROM job WHERE id = {job_id}")
        assert state == "failed" and "a column cannot be read" in reason and why in reason
    events = cli.db_rows(f"SELECT to_state FROM event WHERE job_id = {max(unreadable)}")
    assert events[-1] == ("failed",)
