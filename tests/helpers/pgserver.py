"""A real PostgreSQL server for the tests: Debian's binaries, a throwaway cluster in a
temporary directory, listening on 127.0.0.1 only, with durability switched off (these
databases live for one test run). PostgreSQL refuses to run as root, so as root the
cluster belongs to the ``postgres`` system user that Debian's package creates."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers.waiting import free_port


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.parent.name)
    except ValueError:
        return 0.0


def pg_missing() -> str | None:
    """Why no test server can start here, or None."""
    if pg_bin() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user to run PostgreSQL as"
    return None


class PgServer:
    def __init__(self) -> None:
        self.bin = pg_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gridshift-pg-"))
        self.data = self.dir / "data"
        self.proc: subprocess.Popen | None = None
        self._user = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self._user = pw.pw_name
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._count = 0

    def _run(self, *argv: str) -> None:
        proc = subprocess.run(argv, user=self._user, capture_output=True, text=True, cwd=self.dir)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> PgServer:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--locale=C")  # fmt: skip
        with open(self.dir / "server.log", "ab") as server_log:
            self.proc = self._spawn(server_log)
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                # accepting connections is not yet accepting logins: ask for real
                if self._ready():
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"PostgreSQL did not start:\n{log}")
            time.sleep(0.1)

    def _spawn(self, log) -> subprocess.Popen:
        return subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", str(self.dir), "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=300", "-c", "shared_buffers=64MB"],
            user=self._user, cwd=self.dir, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip

    def _ready(self) -> bool:
        proc = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
        )
        return proc.returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "gs") -> str:
        """A fresh empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._count += 1
        name = f"{prefix}_{os.getpid()}_{self._count}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: do not wait for clients
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
