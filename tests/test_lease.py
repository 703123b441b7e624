"""Two daemons on one PostgreSQL database: one serves the queue (it holds the lease), the
other stands by and takes over when the first dies or goes silent, and no job runs twice."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from orchestrator.daemon.lease import DaemonLease, LeaseLost, current_holder
from orchestrator.queue.db import Database
from tests.conftest import E2E
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.backends("postgresql"), E2E]

JOBS = 6


def _submit(cli, ran, jobs: int = JOBS, sleep_s: float = 1.5) -> None:
    for _ in range(jobs):
        cli.submit(
            "--gpus", "1", "--", "sh", "-c",
            f'echo "$GRIDSHIFT_JOB_ID start" >> {ran}; sleep {sleep_s}; '
            f'echo "$GRIDSHIFT_JOB_ID end" >> {ran}',
        )  # fmt: skip


def _holder_pid(cli) -> int | None:
    holder = current_holder(Database(cli.db_url))
    return None if holder is None else holder["pid"]


def _ran_once_each(cli, ran) -> None:
    lines = ran.read_text().split("\n")
    starts = sorted(int(line.split()[0]) for line in lines if line.endswith("start"))
    ends = sorted(int(line.split()[0]) for line in lines if line.endswith("end"))
    assert starts == list(range(1, JOBS + 1)), f"each job started once: {starts}"
    assert ends == starts, "each ran to its end"
    for job in cli.json("ls", "--all"):
        assert job["state"] == "completed" and job["exit_code"] == 0, job
    assert cli.db_rows("SELECT count(*) FROM attempt")[0][0] == JOBS, "one attempt per job"


class Logged:
    """A daemon process whose stderr is read as it comes."""

    def __init__(self, proc) -> None:
        self.proc, self.pid, self.lines = proc, proc.pid, []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def stop(self, sig=signal.SIGTERM) -> str:
        self.proc.send_signal(sig)
        self.proc.wait(30)
        self._reader.join(10)
        return self.text


def _two_daemons(cli, lease: str) -> tuple[Logged, Logged]:
    cli.home.joinpath("gridshift.toml").write_text(f'[daemon]\nlease = "{lease}"\n')
    cli.env["GRIDSHIFT_FAKE_GPUS"] = "2"
    first = Logged(cli.daemon("--interval", "0.1"))
    wait_for(lambda: _holder_pid(cli) == first.pid, 30, "the first daemon to take the lease")
    second = Logged(cli.daemon("--interval", "0.1"))
    wait_for(lambda: "standing by" in second.text, 30, "the second daemon to stand by")
    return first, second


def test_killed_daemon_is_replaced_by_the_one_standing_by(cli, tmp_path):
    ran = tmp_path / "ran"
    _submit(cli, ran)
    first, second = _two_daemons(cli, "30s")
    wait_for(lambda: ran.exists() and ran.read_text().count("start") >= 2, 30, "the first jobs")
    assert _holder_pid(cli) == first.pid, "the second daemon stands by"
    first.stop(signal.SIGKILL)
    # Same host: the dead holder is known dead, so no need to wait out its 30 s lease.
    wait_for(lambda: _holder_pid(cli) == second.pid, 15, "the standby daemon to take over")
    wait_for(lambda: all(j["state"] == "completed" for j in cli.json("ls", "--all")), 60, "all")
    _ran_once_each(cli, ran)
    err = second.stop()
    assert "running on" not in err.split("holding the lease")[0], "nothing ran on standby"
    assert _holder_pid(cli) is None, "a clean stop hands the lease back"


def test_silent_daemon_loses_its_lease_and_cannot_launch_when_it_wakes(cli, tmp_path):
    ran = tmp_path / "ran"
    _submit(cli, ran)
    first, second = _two_daemons(cli, "2s")
    wait_for(lambda: ran.exists() and ran.read_text().count("start") >= 2, 30, "the first jobs")
    first.proc.send_signal(signal.SIGSTOP)  # a hung host: alive, silent
    t0 = time.monotonic()
    # taken over once the lease expired; where the frozen daemon froze inside a transaction
    # that locks the lease row, once PostgreSQL ended that idle transaction (10 s)
    wait_for(lambda: _holder_pid(cli) == second.pid, 45, "the standby daemon to take over")
    assert time.monotonic() - t0 > 1.0, "taken over only once the lease expired"
    wait_for(lambda: ran.read_text().count("start") >= 4, 30, "the new holder to launch")
    first.proc.send_signal(signal.SIGCONT)  # wakes up believing it serves the queue
    wait_for(lambda: all(j["state"] == "completed" for j in cli.json("ls", "--all")), 60, "all")
    _ran_once_each(cli, ran)
    assert _holder_pid(cli) == second.pid
    wait_for(lambda: "taken over by" in first.text, 30, "the woken daemon to notice")
    assert first.proc.poll() is None, "the woken daemon stands by, it does not exit"
    err = first.stop()
    assert "standing by" in err.split("taken over by")[1], err
    second.stop()


def test_lease_is_checked_in_the_launch_transaction(db_url):
    db = Database(db_url)
    db.ensure_schema()
    a = DaemonLease(db, ttl_s=30, holder={"host": "a", "pid": 1})
    b = DaemonLease(db, ttl_s=30, holder={"host": "b", "pid": 2})
    assert a.try_acquire() is None
    assert b.try_acquire().holder == {"host": "a", "pid": 1}, "b stands by"
    with db.write() as session:
        a.check(session)  # a may launch
    with db.write() as session:  # a's lease runs out: b takes over
        from orchestrator.queue.models import Lease

        row = session.get(Lease, "daemon")
        row.expires_at = row.acquired_at
        session.add(row)
    assert b.try_acquire() is None
    with pytest.raises(LeaseLost), db.write() as session:
        a.check(session)
    with pytest.raises(LeaseLost, match="taken over by pid 2 on b"):
        a.renew()
    b.renew()
    b.release()
    assert current_holder(db) is None


def test_a_frozen_holder_cannot_keep_the_lease_row_locked(db_url):
    """A holder frozen inside a transaction that locks the lease row (a hung host) would
    block every takeover; PostgreSQL ends such idle transactions, so the standby gets in."""
    import threading

    from orchestrator.errors import StoreError
    from orchestrator.queue.db import PG_IDLE_IN_TRANSACTION_MS
    from orchestrator.queue.models import Lease

    db = Database(db_url)
    db.ensure_schema()
    a = DaemonLease(db, ttl_s=1, holder={"host": "a", "pid": 1})
    b = DaemonLease(Database(db_url), ttl_s=30, holder={"host": "b", "pid": 2})
    assert a.try_acquire() is None
    took: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(StoreError), db.write() as session:
        session.get(Lease, "daemon", with_for_update=True)  # ... and a freezes here
        waiter = threading.Thread(target=lambda: took.append(b.try_acquire() is None))
        waiter.start()
        waiter.join(PG_IDLE_IN_TRANSACTION_MS / 1000 + 20)
        session.get(Lease, "daemon", populate_existing=True)  # a wakes: its session is gone
    assert took == [True], "the standby took the lease over"
    assert time.monotonic() - t0 < PG_IDLE_IN_TRANSACTION_MS / 1000 + 15
    with pytest.raises(LeaseLost):
        a.renew()
