"""One server reached with the system OpenSSH client (``ssh``).

Why OpenSSH and not asyncssh: it reads the user's own ``~/.ssh/config`` (ProxyJump,
agents, certificates, ``Match`` blocks) and ``known_hosts`` exactly as their shell does;
one multiplexed master connection per server (``ControlMaster``) makes each later command
cost a round trip, not a handshake; and the daemon's loop stays synchronous, with no event
loop inside APScheduler and no crypto wheels to build.

Every remote command is an argument list joined with ``shlex.join``: the remote shell
sees each argument as one word, whatever it holds. Host keys are checked against
``known_hosts`` (``StrictHostKeyChecking=yes``) unless a node turns that off, which is
logged. The master connections' sockets live in a directory the daemon owns (its home's
``ssh/``, or a private one where that path is too long for a socket), checked with
``lstat`` before every use: owned by this user, mode 0700, not a symlink; anything else
is refused and nothing is sent through it. A node's ``user`` may be ``"{user}"``: each
job then logs in as its submitter's account there, one master per (server, account).

A server that refuses, times out or drops the connection is marked down: calls
to it fail at once (``HostUnreachable``) until the next retry is due, with a back-off
from 2 s to 30 s, so one dead server never stalls the daemon.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import pwd
import re
import shlex
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from executors import bundle, sshanswers
from executors.errors import ExecutorError, HostUnreachable

log = logging.getLogger(__name__)
RETRY_MIN_S, RETRY_MAX_S = 2.0, 30.0
#: A server that answers nonsense is left alone longer each time, up to this: its
#: connection works, so only time tells whether it has been mended.
BAD_ANSWER_MAX_S = 600.0


USER_TEMPLATE = "{user}"
ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
SOCKET_NAME_LEN = 16  # hex digits of a hash: sockets' paths are limited to ~108 bytes
MAX_CONTROL_PATH = 90  # 107 less the ".<16 random>" ssh adds while it binds a master


class RemoteError(ExecutorError):
    """The server ran the command and it failed."""


class BadAnswer(HostUnreachable):
    """The server answered something that is not the verb's answer (not JSON, wrong
    types, missing keys): that node is erroring for the pass, like one that is down."""


class UnsafeControlDir(HostUnreachable):
    """The control sockets' directory is not this user's own private directory."""


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

    @property
    def per_user(self) -> bool:
        """Jobs log in as their submitter (``user = "{user}"``), not one shared account."""
        return USER_TEMPLATE in (self.user or "")

    def for_account(self, account: str) -> SshTarget:
        """This server as ``account`` (``{user}`` in ``user`` and ``remote_dir``)."""
        if not ACCOUNT.match(account):
            raise ExecutorError(f"node {self.node}: {account!r} is not an account name")
        return dataclasses.replace(
            self,
            user=(self.user or "").replace(USER_TEMPLATE, account),
            remote_dir=self.remote_dir.replace(USER_TEMPLATE, account),
        )

    def remote_path(self, *parts: str) -> str:
        base = self.remote_dir[2:] if self.remote_dir.startswith("~/") else self.remote_dir
        return "/".join([base.rstrip("/"), *parts])


def own_account() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


@functools.lru_cache(maxsize=1)
def private_control_dir() -> Path:
    """A directory of this process's own, created atomically with an unguessable name
    (where no other is given, or the given one is too long for a socket's path)."""
    return Path(tempfile.mkdtemp(prefix="gs-ssh-"))


def check_control_dir(path: Path) -> None:
    """Create ``path`` (0700) when missing; then insist, by ``lstat``, that it is a
    directory (not a symlink) owned by this user with mode 0700. Raises
    ``UnsafeControlDir`` otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeControlDir(f"cannot create the SSH control directory {path}: {exc}") from None
    st = os.lstat(path)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "it is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        why = "it is not a directory"
    elif st.st_uid != os.geteuid():
        why = f"it belongs to uid {st.st_uid}, not {os.geteuid()}"
    elif stat.S_IMODE(st.st_mode) != 0o700:
        why = f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700"
    if why:
        raise UnsafeControlDir(
            f"refusing the SSH control directory {path}: {why}; nothing is sent through "
            "it (remove it and let gridshift create its own)"
        )


class SshLink:
    """One server as one account. For a ``{user}`` node, ``template`` keeps the node as
    configured and ``target`` is it as this process's own account (discovery, caps)."""

    def __init__(
        self, target: SshTarget, clock=time.monotonic, control_dir: Path | None = None
    ) -> None:
        self.template = target
        self.target = target.for_account(own_account()) if target.per_user else target
        self._clock = clock
        self.control_dir = control_dir or private_control_dir()
        if len(str(self.control_dir)) + 1 + SOCKET_NAME_LEN > MAX_CONTROL_PATH:
            self.control_dir = private_control_dir()  # too long for a socket's path
        t = self.target
        key = f"{t.address}:{t.host}:{t.port}:{t.identity_file}:{t.known_hosts}"
        self._socket = self.control_dir / hashlib.sha256(key.encode()).hexdigest()[:SOCKET_NAME_LEN]
        self._lock = threading.Lock()
        self._master_lock = threading.Lock()  # one master at a time, never two
        self._lib: str | None = None
        self.down_since: float | None = None  # time.time() of the first failure
        self.last_error: str | None = None
        self._retry_at = 0.0
        self._backoff_s = RETRY_MIN_S
        self._strikes: dict[str, int] = {}  # verb -> malformed answers since its last good one
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

    @property
    def socket_path(self) -> Path:
        """Where this link's master connection listens."""
        return self._socket

    def bad_answer(self, what: str, why: str) -> BadAnswer:
        """The node answered nonsense: erroring (down) for this pass; retried later."""
        reason = f"{what}: malformed answer ({why})"
        self._mark_down(reason)
        with self._lock:  # a good answer to another verb does not forgive this one: a
            # server that answers ``claim`` well but ``launch`` with nonsense (or the two
            # by turns) would take a job each pass; it waits longer each time instead
            self._strikes[what] = self._strikes.get(what, 0) + 1
            wait_s = min(BAD_ANSWER_MAX_S, RETRY_MIN_S * 4 ** max(self._strikes.values()))
            self._retry_at = max(self._retry_at, self._clock() + wait_s)
        return BadAnswer(f"node {self.target.node}: {reason}")

    def for_account(self, account: str) -> SshLink:
        """This server as another account (a ``{user}`` node's submitter)."""
        return SshLink(self.template.for_account(account), self._clock, self.control_dir)

    def _check_dir(self) -> None:
        try:
            check_control_dir(self.control_dir)
        except UnsafeControlDir as exc:
            self._mark_down(str(exc))
            raise UnsafeControlDir(f"node {self.target.node}: {exc}") from None

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
        self._check_dir()
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
        mark_up: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on the server; raises ``HostUnreachable`` or, with ``check``,
        ``RemoteError`` when it exits non-zero. A down server is up again once a command
        ran (with ``mark_up``; a verb waits until its answer proved well formed)."""
        if not self.retry_due():
            raise HostUnreachable(
                f"node {self.target.node}: unreachable ({self.last_error}); next try in "
                f"{max(0.0, self._retry_at - self._clock()):.0f}s"
            )
        self._master()
        self._check_dir()
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
        if mark_up:
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
        out = self.run(argv, stdin=stdin, mark_up=False).stdout
        try:
            answer = sshanswers.check(verb, json.loads(out))
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise self.bad_answer(verb, f"{exc}; got {out[:120]!r}") from None
        self.answered_well(verb)
        return answer

    def answered_well(self, verb: str) -> None:
        """``verb`` answered as it should: that verb's malformed answers are forgiven
        (not another's), and the server is up again."""
        self._strikes.pop(verb, None)
        self._mark_up()

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
        # neither marks a down server up: the answer it is asked for has to be well formed
        probe = self.run([py, "-c", bundle.PROBE, lib], mark_up=False).stdout.decode().strip()
        state, _, where = probe.partition(" ")
        if state != "present":
            where = self.run([py, "-c", bundle.INSTALL, lib], stdin=data, mark_up=False)
            where = where.stdout.decode().strip()
            log.info("node %s: installed the job monitor in %s", self.target.node, where)
        self._lib = where
        return where

    def close(self) -> None:
        """End the master connection."""
        try:
            check_control_dir(self.control_dir)
        except UnsafeControlDir:
            return  # nothing of ours to close there
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
