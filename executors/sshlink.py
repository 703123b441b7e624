"""One server reached with the system OpenSSH client (``ssh``).

Why OpenSSH and not asyncssh: it reads the user's own ``~/.ssh/config`` (ProxyJump,
agents, certificates, ``Match`` blocks) and ``known_hosts`` exactly as their shell does;
one multiplexed master connection per server (``ControlMaster``) makes each later command
cost a round trip, not a handshake; and the daemon's loop stays synchronous, with no event
loop inside APScheduler and no crypto wheels to build.

Every remote command is an argument list joined with ``shlex.join``: the remote shell
sees each argument as one word, whatever it holds. Host keys are checked against
``known_hosts`` (``StrictHostKeyChecking=yes``) unless a node turns that off, which is
logged. A server that refuses, times out or drops the connection is marked down: calls
to it fail at once (``HostUnreachable``) until the next retry is due, with a back-off
from 2 s to 30 s, so one dead server never stalls the daemon.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from executors import bundle
from executors.errors import ExecutorError, HostUnreachable

log = logging.getLogger("gridshift.executors.ssh")
RETRY_MIN_S, RETRY_MAX_S = 2.0, 30.0


class RemoteError(ExecutorError):
    """The server ran the command and it failed."""


@dataclass(frozen=True)
class SshTarget:
    """How to reach one node's server."""

    node: str
    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None  # None: ssh's own (~/.ssh/known_hosts)
    verify_host_key: bool = True
    python: str = "python3"
    remote_dir: str = ".gridshift"  # relative to the login directory unless absolute
    sudo: bool = False  # nvidia-smi -pl behind sudo -n
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 30.0

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def remote_path(self, *parts: str) -> str:
        base = self.remote_dir[2:] if self.remote_dir.startswith("~/") else self.remote_dir
        return "/".join([base.rstrip("/"), *parts])


def control_dir() -> Path:
    """Where master connections' sockets live: short (sockets have a ~100 byte path
    limit), private to this user."""
    path = Path(tempfile.gettempdir()) / f"gridshift-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


class SshLink:
    def __init__(self, target: SshTarget, clock=time.monotonic) -> None:
        self.target = target
        self._clock = clock
        key = f"{target.address}:{target.port}:{target.identity_file}:{target.known_hosts}"
        self._socket = control_dir() / hashlib.sha256(key.encode()).hexdigest()[:20]
        self._lock = threading.Lock()
        self._master_lock = threading.Lock()  # one master at a time, never two
        self._lib: str | None = None
        self.down_since: float | None = None  # time.time() of the first failure
        self.last_error: str | None = None
        self._retry_at = 0.0
        self._backoff_s = RETRY_MIN_S
        if not target.verify_host_key:
            log.warning(
                "node %s: host key checking is OFF (verify_host_key = false); the "
                "connection to %s could be intercepted",
                target.node,
                target.host,
            )

    # -- state --------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.down_since is None

    def retry_due(self) -> bool:
        return self.up or self._clock() >= self._retry_at

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            if self.down_since is None:
                self.down_since = time.time()
                log.warning("node %s: unreachable: %s", self.target.node, reason)
            else:
                self._backoff_s = min(RETRY_MAX_S, self._backoff_s * 2)
            self.last_error = reason
            self._retry_at = self._clock() + self._backoff_s
            self._lib = None

    def _mark_up(self) -> None:
        if self.down_since is not None:
            with self._lock:
                log.info("node %s: reachable again", self.target.node)
                self.down_since, self.last_error = None, None
                self._backoff_s = RETRY_MIN_S

    # -- commands -----------------------------------------------------------------------
    def _options(self) -> list[str]:
        t = self.target
        opts = [
            "-p", str(t.port),
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, round(t.connect_timeout_s))}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-o", f"ControlPath={self._socket}",
        ]  # fmt: skip
        if t.identity_file:
            opts += ["-i", t.identity_file, "-o", "IdentitiesOnly=yes"]
        if not t.verify_host_key:
            opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        else:
            opts += ["-o", "StrictHostKeyChecking=yes"]
            if t.known_hosts:
                opts += ["-o", f"UserKnownHostsFile={t.known_hosts}"]
        return opts

    def _master(self) -> None:
        """Start the multiplexed master connection when there is none."""
        with self._master_lock:
            self._start_master()

    def _start_master(self) -> None:
        if self._socket.exists():
            return
        with tempfile.TemporaryFile() as err:
            argv = ["ssh", *self._options(), "-o", "ControlMaster=yes",
                    "-o", "ControlPersist=600", "-N", "-f", self.target.address]  # fmt: skip
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    timeout=self.target.connect_timeout_s + 5,
                )
            except subprocess.TimeoutExpired:
                self._fail("connection timed out")
            if done.returncode != 0:
                err.seek(0)
                self._fail(_last_line(err.read().decode(errors="replace")) or "ssh failed")

    def _fail(self, reason: str):
        if "host key" in reason.lower() or "REMOTE HOST IDENTIFICATION" in reason:
            reason = f"host key of {self.target.host} does not match known_hosts ({reason})"
        self._mark_down(reason)
        raise HostUnreachable(f"node {self.target.node}: {reason}")

    def run(
        self,
        argv: list[str],
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on the server; raises ``HostUnreachable`` or, with ``check``,
        ``RemoteError`` when it exits non-zero."""
        if not self.retry_due():
            raise HostUnreachable(
                f"node {self.target.node}: unreachable ({self.last_error}); next try in "
                f"{max(0.0, self._retry_at - self._clock()):.0f}s"
            )
        self._master()
        cmd = ["ssh", *self._options(), "-o", "ControlMaster=no", self.target.address,
               "--", shlex.join(argv)]  # fmt: skip
        try:
            done = subprocess.run(
                cmd,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s or self.target.command_timeout_s,
            )
        except subprocess.TimeoutExpired:
            self._fail(f"no answer within {timeout_s or self.target.command_timeout_s:.0f}s")
        if done.returncode == 255:  # ssh's own failure: connection, auth, host key
            self._fail(_last_line(done.stderr.decode(errors="replace")) or "connection lost")
        self._mark_up()
        if check and done.returncode != 0:
            text = _last_line(done.stderr.decode(errors="replace")) or f"exit {done.returncode}"
            raise RemoteError(f"node {self.target.node}: {argv[0]}: {text}")
        return done

    def text(self, argv: list[str]) -> str:
        """Standard output of ``argv`` (the runner ``SmiGpuControl`` uses)."""
        return self.run(argv).stdout.decode(errors="replace")

    def verb(self, verb: str, *args: str, request: dict | None = None) -> dict:
        """One ``executors.remote`` verb; its JSON answer."""
        lib = self.installed()
        argv = ["env", f"PYTHONPATH={lib}", self.target.python, "-m", "executors.remote",
                verb, *args]  # fmt: skip
        stdin = json.dumps(request).encode() if request is not None else None
        out = self.run(argv, stdin=stdin).stdout
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            raise RemoteError(
                f"node {self.target.node}: {verb}: bad answer {out[:200]!r}"
            ) from None

    def read(self, path: str, offset: int) -> bytes | None:
        """A file on the server (a job's log) from byte ``offset`` on, at most 1 MiB;
        None when it does not exist."""
        argv = ["env", f"PYTHONPATH={self.installed()}", self.target.python, "-m",
                "executors.remote", "read", path, str(offset)]  # fmt: skip
        done = self.run(argv, check=False)
        if done.returncode == 3:
            return None
        if done.returncode != 0:
            raise RemoteError(f"node {self.target.node}: cannot read {path}")
        return done.stdout

    def installed(self) -> str:
        """The server's copy of the monitor and verbs (installed on first use)."""
        if self._lib is not None:
            return self._lib
        digest, data = bundle.archive()
        lib = self.target.remote_path("lib", digest)
        py = self.target.python
        probe = self.run([py, "-c", bundle.PROBE, lib]).stdout.decode().strip()
        state, _, where = probe.partition(" ")
        if state != "present":
            where = self.run([py, "-c", bundle.INSTALL, lib], stdin=data).stdout.decode().strip()
            log.info("node %s: installed the job monitor in %s", self.target.node, where)
        self._lib = where
        return where

    def close(self) -> None:
        """End the master connection."""
        if self._socket.exists():
            subprocess.run(
                ["ssh", *self._options(), "-O", "exit", self.target.address],
                capture_output=True,
                timeout=10,
                check=False,
            )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
