"""The daemon's socket server: users' requests, answered from threads of its own.

A Unix socket at ``settings.socket_path``, owned by the daemon's user, mode 0660 with the
``shared_group`` (0600 without one), bound under a temporary name and renamed into place;
a stale socket there is replaced only when it is a socket of the daemon's user, anything
else (a symlink, a file, a socket another daemon serves, a directory others can write)
is refused. Each connection: the caller's uid and gid from ``SO_PEERCRED`` (groups from
the user database), checked against the queue (root, the daemon's user, members of the
group), one request read within ``timeout_s`` and ``MAX_REQUEST`` bytes, one answer.
At most ``max_clients`` connections are served at once (``per_user`` of them from one
uid); the dispatch loop never waits on any of this.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections import Counter

from orchestrator.api import protocol
from orchestrator.daemon.ops import handle
from orchestrator.daemon.ops.base import Caller, OpContext
from orchestrator.errors import DaemonError, GridshiftError, PermissionDenied, boundary

log = logging.getLogger(__name__)
PING_S = 3.0  # a daemon that does not answer a ping this long loses its socket to another


class SocketTaken(DaemonError):
    """A live daemon serves the socket already."""


class SocketServer:
    def __init__(
        self,
        ctx: OpContext,
        *,
        gid: int | None = None,
        timeout_s: float = 10.0,
        max_clients: int = 32,
        per_user: int = 8,
        max_request: int = protocol.MAX_REQUEST,
    ) -> None:
        self.ctx = ctx
        self.path = str(ctx.settings.socket_path)
        self.gid = gid  # the shared group: its members may connect
        self.timeout_s = timeout_s
        self.per_user = per_user
        self.max_request = max_request
        self.max_slots = max_clients
        self._slots = threading.BoundedSemaphore(max_clients)
        self._lock = threading.Lock()
        self._users: Counter[int] = Counter()
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    # -- the socket file ------------------------------------------------------------------
    def start(self) -> SocketServer:
        """Serve the socket; DaemonError when it cannot (SocketTaken: a live daemon does)."""
        self._bind()
        self._run_thread(self._accept, "gridshift-socket")
        return self

    def keep(self, every_s: float = 2.0) -> SocketServer:
        """Several daemons of one queue on one host (PostgreSQL: a holder and standbys):
        whichever has the socket serves it; the others look every ``every_s`` and take it
        when it is stale or its daemon stops answering (a frozen one)."""
        self._run_thread(self._accept, "gridshift-socket")
        self._run_thread(lambda: self._keep(every_s), "gridshift-socket-keeper")
        return self

    def _keep(self, every_s: float) -> None:
        told = False
        while not self._stopping.is_set():
            if self._inode is None or _inode(self.path) != self._inode:
                self._release()
                try:
                    self._bind()
                except SocketTaken:
                    if not told:
                        log.info("another daemon on this host serves %s", self.path)
                        told = True
                except DaemonError as exc:
                    log.warning("%s", exc)
            self._stopping.wait(every_s)

    def _run_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _bind(self) -> None:
        parent, name = os.path.split(self.path)
        _check_directory(parent, self.gid is not None)
        _check_stale(self.path)
        temp = os.path.join(parent, f".{name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            _check_stale(temp)
            os.unlink(temp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound, fd = protocol.bindable(temp)
        try:
            sock.bind(bound)
            # a path in a directory only the daemon's user can write: nobody swaps it
            if self.gid is not None:
                os.chown(temp, -1, self.gid)
            os.chmod(temp, 0o660 if self.gid is not None else 0o600)
            sock.listen(128)
            os.rename(temp, self.path)
            self._inode = _inode(self.path)
        except OSError as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise DaemonError(f"cannot serve {self.path}: {exc.strerror}") from None
        finally:
            if fd is not None:
                os.close(fd)
        sock.settimeout(0.5)  # the accept loop looks at the stop flag this often
        self._sock = sock
        log.info("serving requests on %s", self.path)

    def _release(self) -> None:
        """Stop listening; remove the socket file only if it is still the one made here."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._inode is not None and _inode(self.path) == self._inode:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._inode = None

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._release()

    # -- connections ------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopping.is_set():
            if not self._slots.acquire(timeout=0.5):
                continue  # every slot busy: the kernel's backlog holds the next ones
            try:
                if self._sock is None:  # not ours now (another daemon here serves it)
                    raise TimeoutError
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                if self._sock is None:
                    self._stopping.wait(0.5)
                self._slots.release()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        counted = None
        try:  # whatever a request does, its slot and its member's count come back
            try:
                _pid, uid, gid = struct.unpack(
                    "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                )
                conn.settimeout(self.timeout_s)
                caller = Caller.from_ids(uid, gid)
                self._admit(caller)
                if not self.ctx.privileged(caller):
                    with self._lock:
                        self._users[uid] += 1
                        counted = uid
                        crowded = self._users[uid] > self.per_user
                    if crowded:
                        raise protocol.Busy("too many requests of yours at once; try again")
                answer = self._answer(conn, caller)
            except GridshiftError as exc:
                answer = protocol.failure(exc)
            except OSError:  # the client went away
                answer = None
            except Exception:  # a defect answering one request: that request's failure
                log.exception("a request failed")
                answer = protocol.failure(RuntimeError())
            if answer is not None:
                conn.settimeout(self.timeout_s)
                conn.sendall(answer)
        except OSError:
            pass
        finally:
            conn.close()
            if counted is not None:
                with self._lock:
                    self._users[counted] -= 1
            self._slots.release()

    def _admit(self, caller: Caller) -> None:
        if self.ctx.privileged(caller) or (self.gid is not None and self.gid in caller.gids):
            return
        group = self.ctx.settings.shared_group
        raise PermissionDenied(
            f"{caller.name} may not use this queue"
            + (f" (members of the group {group} may)" if group else "")
        )

    def _answer(self, conn: socket.socket, caller: Caller) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        try:
            line = protocol.read_line(conn, self.max_request, deadline)
        except TimeoutError:
            raise protocol.ProtocolError(f"no whole request within {self.timeout_s:g}s") from None
        op, args = protocol.parse_request(line)
        started = time.monotonic()
        try:
            with boundary():
                answer = protocol.ok(handle(self.ctx, caller, op, args))
        except GridshiftError:
            raise
        except Exception:
            log.exception("request %s of %s (uid %d) failed", op, caller.name, caller.uid)
            return protocol.failure(RuntimeError())
        log.debug("%s of %s: %.3fs", op, caller.name, time.monotonic() - started)
        return answer


def serve(settings, db) -> SocketServer:
    """Start answering requests on the queue's socket (the daemon's side of the CLI). On
    SQLite one daemon serves a queue (its lock says so) and a socket it cannot make stops
    it; on PostgreSQL every daemon of the queue on this host shares the socket's path."""
    from orchestrator.queue.ownership import home_layout

    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True)
    server = SocketServer(ctx, gid=home_layout(settings).gid)
    return server.start() if db.is_sqlite else server.keep()


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _check_directory(path: str, shared: bool) -> None:
    """The socket's directory: a real directory (created 0755 if missing) that no one
    but the daemon's user (or root) can write: others could swap the socket for theirs
    and read what clients send (a job's environment)."""
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise DaemonError(f"cannot serve a socket in {path}: {exc.strerror}") from None
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise DaemonError(f"refusing to serve a socket in {path}: not a directory")
    others = st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (me, 0) or others or (shared and st.st_mode & 0o020):
        raise DaemonError(
            f"refusing to serve a socket in {path}: users other than the daemon's can write "
            "there (make it the daemon's, mode 0755)"
        )


def _check_stale(path: str) -> None:
    """What lies at ``path`` may go only if it is a dead socket of the daemon's user."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        raise DaemonError(
            f"refusing to replace {path}: it is not a socket of this daemon's user "
            "(remove it by hand if it is yours)"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound, fd = protocol.bindable(path)
    try:
        probe.settimeout(PING_S)
        probe.connect(bound)
        probe.sendall(protocol.request_bytes("ping", {}))
        protocol.result_of(protocol.read_line(probe, 1 << 16, time.monotonic() + PING_S))
    except (OSError, GridshiftError):
        return  # stale: nothing listens, or what listens does not answer (frozen)
    finally:
        probe.close()
        if fd is not None:
            os.close(fd)
    raise SocketTaken(f"another gridshift daemon serves {path}")
