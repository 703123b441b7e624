"""One daemon run through every fault the daemon must outlive, and an ordinary job
submitted alongside still completes, with the daemon under 500 MB.

The run: a carbon-aware daemon whose grid chain starts with a provider that refuses the
key (HTTP 401) and one that refuses connections, then a CSV trace; two local fake GPUs
and an SSH server whose ``executors.remote`` answers ``{}`` to launch and status; a job
that writes garbage and a sample dated 1e15 into its power log, forges ``exit.json`` and
kills its monitor; rows written into the database by hand (an infinite and a huge
duration, a deadline in the year 9999, a width of 2**40, a cron window of 30,000 years);
and a cron template whose working directory was deleted. Real processes, a real sshd, a
real HTTP server, a real SQLite file.
"""

from __future__ import annotations

import json
import signal
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import E2E, server_python
from tests.helpers.provider import ProviderServer
from tests.helpers.waiting import wait_for
from tests.test_daemon_faults import HOSTILE, hand_written_rows
from tests.test_ssh_daemon import ssh_node

pytestmark = [E2E, pytest.mark.slow, pytest.mark.backends("sqlite")]


@pytest.fixture
def refusing_provider():
    """A provider whose key has expired: every request is answered 401."""
    server = ProviderServer().start()
    server.status["/"] = 401
    yield server.url, server.requests
    server.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on leaving: connections are refused


def _lying_python(where: Path) -> Path:
    """The server's python3, except that ``executors.remote`` answers ``{}`` to launch
    and status (the other verbs work)."""
    fake = where / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1 $2 $3" in\n'
        '  "-m executors.remote launch"|"-m executors.remote status")\n'
        "    cat >/dev/null; echo '{}'; exit 0;;\n"
        "esac\n"
        f'exec {server_python()} "$@"\n'
    )
    fake.chmod(0o755)
    return fake


def _trace(path: Path) -> Path:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    rows = ["time,carbon_g_per_kwh"]
    rows += [
        f"{(now + timedelta(hours=h)).isoformat()},{200 + 10 * (h % 5)}" for h in range(-6, 72)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def _toml(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _sql(cli, statement: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(cli.db_url)
    with engine.begin() as conn:
        conn.execute(text(statement))
    engine.dispose()


def test_one_daemon_run_outlives_every_fault_and_an_ordinary_job_completes(
    cli, ssh_servers, refusing_provider, tmp_path
):
    base_url, asked = refusing_provider
    srv = ssh_servers(gpus=1)
    node = {**ssh_node(srv, ssh_servers, "liar"), "python": str(_lying_python(tmp_path))}
    nodes = [{"name": "here", "executor": "local", "fake_gpus": 2}, node]
    lines = ["daemon_interval_s = 0.2", "", "[grid.electricitymaps]",
             f'base_url = "{base_url}"', 'api_key = "expired-key-1234"', "", "[grid.uk]",
             f'base_url = "http://127.0.0.1:{_closed_port()}"']  # fmt: skip
    for n in nodes:
        lines += ["", "[[nodes]]", *(f"{k} = {_toml(v)}" for k, v in n.items())]
    (cli.home / "gridshift.toml").write_text("\n".join(lines) + "\n")
    trace = _trace(tmp_path / "trace.csv")

    # the faults a user can submit through the CLI
    hostile = cli.submit("--now", "--gpus", "2", "--", "sh", "-c", HOSTILE)
    gone = tmp_path / "gone"
    gone.mkdir()
    cli.run("submit", "--cron", "* * * * * *", "--window", "1h", "--", "true", cwd=gone)
    cli.run("submit", "--cron", "* * * * * *", "--window", "1h", "--", "true")
    gone.rmdir()
    template = cli.submit("--duration", "1m", "--within", "2h", "--", "true")
    forged = hand_written_rows(cli, template)
    _sql(cli, "UPDATE crontemplate SET window_s = 1e12 WHERE id = 2")
    cli.run("cancel", str(template))
    ordinary = cli.submit("--now", "--gpus", "1", "--", "sh", "-c", "sleep 1; echo fine")

    daemon = cli.daemon(
        "--grid", "electricitymaps:DE", "--grid", "uk", "--grid", f"csv:{trace}",
        "--interval", "0.2",
    )  # fmt: skip
    try:
        ends = {"completed", "failed", "lost"}
        wait_for(lambda: daemon.poll() is not None or cli.job_state(ordinary) in ends,
                 timeout_s=120, what="the ordinary job's end")  # fmt: skip
        assert daemon.poll() is None, daemon.stderr.read()
        done = cli.json("show", str(ordinary))
        assert done["state"] == "completed", done
        assert cli.run("logs", str(ordinary)).stdout == "fine\n"
        wait_for(lambda: cli.job_state(hostile) == "lost", timeout_s=120, what="hostile lost")
        status = cli.json("status")
        assert daemon.poll() is None, "the daemon is still serving"
        peak_mb = _peak_rss_mb(daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=60)
    log = daemon.stderr.read()
    assert code == 0, log
    assert peak_mb < 500, f"the daemon peaked at {peak_mb:.0f} MB"

    # the grid: the refused key and the refused connection fell through to the trace
    assert asked, "the first provider was asked"
    assert status["signal"]["g_per_kwh"] is not None, status
    assert log.count("refused the credentials") == 1, "the refused key is logged once"
    # the SSH server that answers nonsense is that node's fault (the ordinary job, with
    # the local GPUs taken by the hostile one, may well have been sent there first)
    assert status["daemon"] == "running"
    # the hostile job is lost with why; its forged files moved nothing else
    job = cli.json("show", str(hostile))
    assert "cannot be believed" in job["reason"], job["reason"]
    # the rows written by hand failed, each with its reason
    for job_id, why in forged.items():
        row = cli.json("show", str(job_id))
        assert row["state"] == "failed" and "cannot be believed" in row["reason"], row
        assert why in row["reason"], (why, row["reason"])
    # the cron templates: the deleted workdir paused, the absurd window disabled
    crons = {c["id"]: c for c in json.loads(cli.run("cron", "ls", "--json").stdout)}
    assert "does not exist" in crons[1]["fault"], crons[1]
    assert "invalid cron window" in crons[2]["fault"], crons[2]
    assert "JobLookupError" not in log and "maximum number of running instances" not in log
