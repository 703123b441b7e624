"""Shared fixtures: a private GRIDSHIFT_HOME with fake GPUs, and the real CLI.

Every test that touches the store runs twice, once on SQLite and once on a real
PostgreSQL server (``[sqlite]`` and ``[postgresql]`` in its id): a test asks for
``db_url`` (or for ``cli``, which uses it) and gets a fresh empty database of each kind.
``@pytest.mark.backends("sqlite")`` keeps a test on the backends it is about.

The suite runs on three pytest-xdist workers on two cores (``pyproject.toml``). The
end-to-end tests that wait on wall-clock time or start servers (the live daemon, SSH,
Slurm, the lease, crash recovery) carry ``E2E`` (the ``e2e`` marker: ``-m "not e2e"``
leaves them out). They spend most of their time waiting, which the third worker fills.
They used to be one xdist group run one after another on one worker, but pytest 9.2 made
xdist's grouping a silent no-op (pytest-xdist issue 1386): they have run spread over the
workers since, and are written to (each starts its own daemon, servers and ports).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import forkrun

ROOT = Path(__file__).resolve().parent.parent

# the end-to-end tests that wait on the clock or start servers (see the docstring)
E2E = pytest.mark.e2e


class Cli:
    """Runs the real ``gridshift`` command in a child process."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.started: list[subprocess.Popen] = []

    @property
    def db_url(self) -> str:
        # the home the commands use: a test may point GRIDSHIFT_HOME elsewhere (shared mode)
        home = Path(self.env.get("GRIDSHIFT_HOME") or self.home)
        return self.env.get("GRIDSHIFT_DATABASE_URL") or f"sqlite:///{home / 'gridshift.db'}"

    @property
    def backend(self) -> str:
        return "sqlite" if self.db_url.startswith("sqlite") else "postgresql"

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, cwd=None, **kwargs
    ) -> subprocess.CompletedProcess:
        if forkrun.forkable(args, kwargs):  # the same, forked warm (tests/helpers/forkrun.py)
            proc = forkrun.run(list(args), self.env, cwd or self.home, timeout)
        else:
            proc = subprocess.run(
                [sys.executable, "-m", "orchestrator", *args],
                env=self.env,
                cwd=cwd or self.home,
                capture_output=True,
                text=True,
                timeout=timeout,
                **kwargs,
            )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"gridshift {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str):
        # --json right after the (sub)command: after "--" it would be the job's
        words = 2 if args[0] == "grid" else 1
        return json.loads(self.run(*args[:words], "--json", *args[words:]).stdout)

    def submit(self, *args: str) -> int:
        return int(self.run("submit", *args).stdout.strip())

    def daemon(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", *args],
            env=self.env,
            cwd=self.home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    def run_until_idle(self, timeout: float = 60) -> str:
        proc = self.run("daemon", "--until-idle", "--interval", "0.1", timeout=timeout)
        return proc.stderr

    def db_rows(self, sql: str) -> list[tuple]:
        from sqlalchemy import create_engine, text

        if self.backend == "sqlite" and not Path(self.db_url.removeprefix("sqlite:///")).exists():
            raise LookupError("no database yet")
        engine = create_engine(self.db_url, poolclass=_null_pool())
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(sql)).fetchall()]
        finally:
            engine.dispose()

    def job_count(self) -> int:
        from sqlalchemy.exc import DBAPIError

        try:
            return self.db_rows("SELECT count(*) FROM job")[0][0]
        except (LookupError, DBAPIError):  # no database or no tables yet
            return 0

    def wait_state(self, job_id: int, states: set[str], timeout: float = 30) -> dict:
        """``gridshift show`` of the job once its state is one of ``states``. The polling
        reads the job's row here, not through a CLI process each time (one costs about half
        a second of CPU, which the daemons and jobs under test need on a loaded machine)."""
        deadline = time.monotonic() + timeout
        while True:
            expired = time.monotonic() > deadline
            if expired or self.job_state(job_id) in states:
                job = self.json("show", str(job_id))
                if job["state"] in states:
                    return job
                if expired or job["state"] in ("failed", "cancelled"):
                    raise AssertionError(self._why(job, states))
            time.sleep(0.1)

    def _why(self, job: dict, states: set[str]) -> str:
        """The job's state, events and log tail: a failure in CI explains itself."""
        events = "; ".join(f"{e['to']}: {e.get('reason') or ''}" for e in job.get("events", []))
        log = self.home / "logs" / f"{job['id']}.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        return f"job {job['id']} is {job['state']}, wanted {states}; events: {events}; log: {tail}"

    def job_state(self, job_id: int) -> str | None:
        """The job's state in the store, or None where it cannot be read now."""
        from sqlalchemy.exc import DBAPIError

        try:
            rows = self.db_rows(f"SELECT state FROM job WHERE id = {int(job_id)}")
        except (LookupError, DBAPIError):  # no database yet, or SQLite busy a moment
            return None
        return rows[0][0] if rows else None


def _null_pool():
    from sqlalchemy.pool import NullPool

    return NullPool


def base_env(home: Path, fake_gpus: int = 4) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSHIFT_")}
    env.update(
        {
            "GRIDSHIFT_HOME": str(home),
            "GRIDSHIFT_FAKE_GPUS": str(fake_gpus),
            "PYTHONPATH": str(ROOT),
            "COLUMNS": "200",
        }
    )
    return env


# -- the two store backends ----------------------------------------------------------
BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "backends(*names): run this store test only on these backends"
    )


def pytest_generate_tests(metafunc) -> None:
    if "db_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    names = marker.args if marker else BACKENDS
    metafunc.parametrize("db_backend", names, scope="module")


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server for the whole run, started on first use."""
    from tests.helpers.pgserver import PgServer, pg_missing

    if (why := pg_missing()) is not None:
        pytest.skip(why)
    server = PgServer().start()
    yield server
    server.stop()


def new_db_url(request, backend: str, sqlite_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{sqlite_path}"
    return request.getfixturevalue("pg_server").new_database()


@pytest.fixture
def db_url(request, db_backend: str, tmp_path: Path) -> str:
    """A fresh, empty database of this test's backend."""
    return new_db_url(request, db_backend, tmp_path / "test.db")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "gridshift-home"
    path.mkdir()
    return path


@pytest.fixture
def cli(request, home: Path, db_backend: str) -> Iterator[Cli]:
    env = base_env(home)
    if db_backend != "sqlite":
        env["GRIDSHIFT_DATABASE_URL"] = new_db_url(request, db_backend, home / "gridshift.db")
    c = Cli(home, env)
    yield c
    cleanup(c)


def cleanup(c: Cli) -> None:
    """Kill the daemons a test started and any job or monitor they left running."""
    for proc in c.started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for run_dir in (c.home / "run").glob("attempt-*"):
        for name in ("job.json", "claim"):
            path = run_dir / name
            if not path.exists():
                continue
            text = path.read_text()
            pid = (
                json.loads(text)["pid"]
                if name == "job.json"
                else (int(text.split()[1]) if text.startswith("started") else None)
            )
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL) if name == "job.json" else os.kill(
                        pid, signal.SIGKILL
                    )


def shared_data() -> Path:
    return Path(os.environ.get("GRIDSHIFT_SHARED_DATA", ROOT.parent / "shared" / "data"))


# -- SSH servers (real sshd processes) ---------------------------------------------------
@pytest.fixture(scope="session")
def user_key(tmp_path_factory) -> Path:
    from tests.helpers.sshd import keygen, sshd_missing

    if (why := sshd_missing()) is not None:
        pytest.skip(why)
    return keygen(tmp_path_factory.mktemp("ssh-client") / "id_ed25519")


@pytest.fixture
def ssh_servers(tmp_path: Path, user_key: Path):
    """A factory of started test servers, each a real sshd with its own fake GPUs; all
    stopped at the end of the test. ``known_hosts`` trusts each one started."""
    from tests.helpers.sshd import SshServer

    servers: list = []
    known = tmp_path / "known_hosts"
    known.touch()

    def start(gpus: int = 4, **kw):
        srv = SshServer(tmp_path / f"server-{len(servers)}", user_key, gpus=gpus, **kw).start()
        with open(known, "a") as fh:
            fh.write(srv.known_hosts_line())
        servers.append(srv)
        return srv

    start.known_hosts = known
    yield start
    for srv in servers:
        srv.stop()


# -- a Slurm cluster (real munged, slurmctld, slurmd, slurmdbd) -------------------------
@pytest.fixture(scope="session")
def slurm_cluster():
    """One single-node Slurm cluster with 4 GRES GPUs for the whole run, started on first
    use. Tests that share it tell their jobs apart by name."""
    from tests.helpers.slurmcluster import SlurmCluster, accounting_missing, slurm_missing

    if (why := slurm_missing() or accounting_missing()) is not None:
        pytest.skip(why)
    cluster = SlurmCluster(gpus=4).start()
    yield cluster
    cluster.stop()


def server_python() -> str:
    """The servers' python3: Debian's own where there is one, not this virtualenv's."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
