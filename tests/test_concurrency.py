"""Many processes share one queue database safely."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

PROCESSES = 8
# jobs per process: SQLite's single writer is where submissions pile up; PostgreSQL's
# row-level concurrency meets the same 8 writers with fewer (1600 took ~100 s; 800 and
# 400, 22 s and 17 s of the suite under load: halved, the 8 still write at once)
EACH = {"sqlite": 50, "postgresql": 30}  # 400 and 240 submissions by 8 writers at once


def test_eight_processes_submitting_jobs_at_once(cli):
    each = EACH[cli.backend]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.submit_many", str(each), f"p{i}"],
            env=cli.env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errors)
    assert not any("locked" in e for e in errors)
    assert cli.job_count() == PROCESSES * each
    names = {row[0] for row in cli.db_rows("SELECT name FROM job")}
    assert len(names) == PROCESSES * each
    events = cli.db_rows("SELECT count(*) FROM event WHERE to_state = 'queued'")[0][0]
    assert events == PROCESSES * each, "one event row per submission"


def test_real_cli_processes_on_a_fresh_database(cli):
    """Schema creation races too: several commands hit a database that does not exist."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "submit", "--", "true"],
            env=cli.env,
            cwd=cli.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    failed = [(p.returncode, err) for p, (_out, err) in zip(procs, results, strict=True)]
    assert not [f for f in failed if f[0] != 0], [f for f in failed if f[0] != 0]
    assert sorted(int(out) for out, _ in results) == list(range(1, 9))
