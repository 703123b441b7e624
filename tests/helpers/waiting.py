"""Small helpers the server fixtures and end-to-end tests share: a free local port, and
waiting for a condition with a deadline."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition", every_s: float = 0.1):
    """Poll ``predicate`` until it returns something true, and return that; fail the test
    with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every_s)
    return got
