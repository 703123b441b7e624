"""The thin client: where the daemon's socket is, and one request to it.

``locate`` reads what it needs of the configuration (``GRIDSHIFT_*`` variables over the
TOML file over defaults, as ``orchestrator.settings`` does) with the standard library
alone, so a command answered by the daemon never loads pydantic or the database layer.
"""

from __future__ import annotations

import os
import socket
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.api import protocol
from orchestrator.api.environ import env_value
from orchestrator.errors import DaemonError

DEFAULT_HOME = "~/.local/share/gridshift"
SOCKET_NAME = "gridshift.sock"
TIMEOUT_S = 600.0  # a report or a plan may fetch a grid signal first


class NoDaemon(DaemonError):
    """Nothing listens on the socket (no file there, or a stale one)."""


@dataclass(frozen=True)
class Address:
    socket: str
    shared: bool  # shared_group is set: the CLI never opens the database


def locate(config: Path | None) -> Address | None:
    """The socket's path and the mode, or None when the configuration cannot be read this
    cheaply (a missing or malformed file, an empty home or socket: the full settings
    loader says what is wrong). The variables are read as the settings read them
    (``api.environ.env_value``: any case)."""
    home, where = env_value("GRIDSHIFT_HOME"), env_value("GRIDSHIFT_SOCKET")
    if _blank(home) or _blank(where):
        return None
    path = Path(config) if config else Path(home or DEFAULT_HOME).expanduser() / "gridshift.toml"
    data: dict = {}
    try:
        with open(path, "rb") as fh:
            raw = fh.read((1 << 20) + 1)  # a device such as /dev/zero never ends
        if len(raw) > 1 << 20:
            return None
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        if config is not None:
            return None
    except PermissionError:
        # a shared queue's config is root's (it may hold secrets): members find the
        # socket through GRIDSHIFT_SOCKET and GRIDSHIFT_SHARED_GROUP instead
        if not where:
            return None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):
        return None
    home = home if home is not None else data.get("home", DEFAULT_HOME)
    where = where if where is not None else data.get("socket")
    group = env_value("GRIDSHIFT_SHARED_GROUP")
    group = group if group is not None else data.get("shared_group")
    if not isinstance(home, str) or not isinstance(where, str | None):
        return None
    if _blank(home) or _blank(where):
        return None
    if where is None:
        where = os.path.join(Path(home).expanduser().absolute(), SOCKET_NAME)
    return Address(str(Path(where).expanduser().absolute()), bool(group))


def _blank(value: str | None) -> bool:
    """Set but empty: the settings refuse it (a home in the working directory)."""
    return isinstance(value, str) and not value.strip()


def request(path: str, op: str, args: dict, timeout_s: float = TIMEOUT_S) -> Any:
    """Send one request, return its result (or raise the error the daemon answered).
    NoDaemon when nothing listens at ``path``. A daemon busy with this user's other
    requests is asked again, for up to about ten seconds."""
    for wait_s in (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2):
        try:
            return _request(path, op, args, timeout_s)
        except protocol.Busy:
            time.sleep(wait_s)
    return _request(path, op, args, timeout_s)


def _request(path: str, op: str, args: dict, timeout_s: float) -> Any:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        fd = None
        try:
            name, fd = protocol.bindable(path)
            sock.connect(name)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            raise NoDaemon(f"no gridshift daemon serves {path}") from None
        except PermissionError:
            raise DaemonError(
                f"cannot reach the gridshift daemon at {path}: permission denied (is your "
                "user in the queue's group? a new group needs a new login)"
            ) from None
        finally:
            if fd is not None:
                os.close(fd)
        try:
            sock.sendall(protocol.request_bytes(op, args))
            sock.shutdown(socket.SHUT_WR)
            answer = protocol.read_line(sock, 1 << 40, None)
        except TimeoutError:
            raise DaemonError(f"the gridshift daemon at {path} did not answer") from None
        except OSError as exc:
            answer = _rest(sock)  # it may have answered (and closed) before reading it all
            if not answer:
                raise DaemonError(f"the gridshift daemon at {path}: {exc.strerror}") from None
        if not answer:
            raise DaemonError(f"the gridshift daemon at {path} closed without an answer")
        return protocol.result_of(answer)
    finally:
        sock.close()


def _rest(sock: socket.socket) -> bytes:
    try:
        return protocol.read_line(sock, 1 << 40, None)
    except OSError:
        return b""
