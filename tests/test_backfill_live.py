"""Backfill in the live daemon: the real CLI and daemon on four fake GPUs. A 4-GPU job
waits behind a running 2-GPU one; a short 1-GPU job behind it runs in the gap, a long
one does not (it would delay the wide job), and the wide one starts at its reservation:
when the 2-GPU job ends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import E2E

pytestmark = [E2E, pytest.mark.backends("sqlite")]


def _at(job: dict, key: str) -> float:
    moment = datetime.fromisoformat(str(job[key]))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def test_narrow_jobs_run_in_the_gap_and_the_wide_one_starts_at_its_reservation(cli):
    first = cli.submit("--gpus", "2", "--duration", "3s", "--", "sleep", "3")
    wide = cli.submit("--gpus", "4", "--duration", "1s", "--", "sleep", "1")
    short = cli.submit("--gpus", "1", "--duration", "1s", "--", "sleep", "1")
    long = cli.submit("--gpus", "1", "--duration", "1m", "--", "sleep", "1")
    cli.run_until_idle()
    # read from the store (a CLI process per job costs seconds on a loaded machine)
    rows = cli.db_rows("SELECT id, state, started_at, finished_at FROM job")
    jobs = {
        r[0]: dict(zip(("id", "state", "started_at", "finished_at"), r, strict=True)) for r in rows
    }
    a, w, s, n = (jobs[i] for i in (first, wide, short, long))
    assert all(j["state"] == "completed" for j in (a, w, s, n))
    # the short job ran in the gap, before the wide one and while the first one ran
    assert _at(s, "started_at") < _at(a, "finished_at")
    assert _at(s, "finished_at") <= _at(w, "started_at")
    # the wide one started when the first one's GPUs came back: its reservation
    assert _at(a, "finished_at") <= _at(w, "started_at") < _at(a, "finished_at") + 2.0
    # the long one (a minute, by its --duration) would have held a GPU past it: it waited
    assert _at(n, "started_at") >= _at(w, "finished_at")
