"""The socket protocol, version 1: one request per connection, one JSON line each way.

    request:  {"v": 1, "op": "submit", "args": {...}}\\n
    answer:   {"v": 1, "ok": true, "result": ...}\\n
          or  {"v": 1, "ok": false, "error": {"kind": "SpecError", "message": "...",
                                                 "exit_code": 2}}\\n

A request is at most ``MAX_REQUEST`` bytes and must arrive whole within the server's
per-client timeout; anything else (too big, too slow, not JSON, another version, an
unknown op) gets one error answer and the connection is closed. The caller's identity is
never part of a request: the server takes it from the kernel (``SO_PEERCRED``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import orchestrator.errors as errors

VERSION = 1
MAX_REQUEST = 8 << 20  # bytes, the newline included: a sweep of thousands of jobs fits
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes, the NUL included


class ProtocolError(errors.UserError):
    """A request the daemon cannot read: too big, too slow, not JSON, another version."""


class TooLarge(ProtocolError):
    pass


class Busy(errors.DaemonError):
    """The daemon serves as many of this user's requests as it will at once: retry."""


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def request_bytes(op: str, args: dict) -> bytes:
    return encode({"v": VERSION, "op": op, "args": args})


def parse_request(line: bytes) -> tuple[str, dict]:
    """``(op, args)`` of one request line; ProtocolError for anything malformed."""
    try:  # NaN and Infinity are not JSON; nesting too deep for the parser is malformed
        message = json.loads(line, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ProtocolError("malformed request: not a JSON object on one line") from None
    if not isinstance(message, dict):
        raise ProtocolError("malformed request: not a JSON object on one line")
    if message.get("v") != VERSION:
        raise ProtocolError(
            f"protocol version {message.get('v')!r} is not spoken here (this daemon speaks "
            f"{VERSION}); use a gridshift of the daemon's version"
        )
    op, args = message.get("op"), message.get("args", {})
    if not isinstance(op, str) or not isinstance(args, dict):
        raise ProtocolError("malformed request: give op (a string) and args (an object)")
    return op, args


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def ok(result: Any) -> bytes:
    return encode({"v": VERSION, "ok": True, "result": result})


def failure(exc: BaseException) -> bytes:
    if isinstance(exc, errors.GridshiftError):
        kind, message, code = type(exc).__name__, str(exc), exc.exit_code
    else:  # a bug in the daemon: its log has the traceback, the client one line
        kind, message, code = "InternalError", "the daemon failed (see its log)", 1
    error = {"kind": kind, "message": message, "exit_code": code}
    return encode({"v": VERSION, "ok": False, "error": error})


def result_of(answer: bytes) -> Any:
    """The result of an answer line, or its error raised as the gridshift error it names."""
    try:
        message = json.loads(answer)
    except (ValueError, UnicodeDecodeError):
        raise errors.DaemonError("the daemon's answer is not JSON") from None
    if not isinstance(message, dict) or message.get("v") != VERSION:
        raise errors.DaemonError("the daemon speaks another protocol version")
    if message.get("ok"):
        return message.get("result")
    error = message.get("error") or {}
    kind = str(error.get("kind"))
    cls = {"ProtocolError": ProtocolError, "TooLarge": ProtocolError, "Busy": Busy}.get(kind)
    cls = cls or getattr(errors, kind, None)
    text = str(error.get("message") or "the daemon failed")
    if isinstance(cls, type) and issubclass(cls, errors.GridshiftError):
        raise cls(text)
    exc = errors.GridshiftError(text)
    exc.exit_code = int(error.get("exit_code") or 1)
    raise exc


def read_line(sock: socket.socket, limit: int, deadline: float | None) -> bytes:
    """Bytes up to the first newline (excluded), or to the end of the stream. TooLarge past
    ``limit`` bytes; TimeoutError past ``deadline`` (``time.monotonic``), whole request
    included, so a client that trickles a byte at a time gets no more time than one that
    sends nothing."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(left)
        block = sock.recv(1 << 16)
        if not block:
            return b"".join(chunks)
        end = block.find(b"\n")
        if end >= 0:
            chunks.append(block[:end])
            size += end
        else:
            chunks.append(block)
            size += len(block)
        if size > limit:
            raise TooLarge(f"request larger than {limit >> 20} MiB")
        if end >= 0:
            return b"".join(chunks)


def bindable(path: str) -> tuple[str, int | None]:
    """A name for ``path`` that fits in a socket address: the path itself, or, when it is
    too long, its name under ``/proc/self/fd`` of its directory opened here (the caller
    closes the returned descriptor)."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return path, None
    parent, name = os.path.split(path)
    fd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}", fd
