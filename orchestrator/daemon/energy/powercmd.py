"""A node's power command (``power_off``, ``power_on`` in its ``[[nodes]]`` table), run as
the daemon's own user, which is root on a shared server.

The argument list comes from the root-owned config alone, never from a user, and runs
without a shell, its program by absolute path (``NodeConfig`` checks it), with an
environment the daemon builds (``PATH=/usr/sbin:/usr/bin:/sbin:/bin``, ``LANG=C``): a
submitter's ``PATH`` or ``LD_PRELOAD`` chooses nothing. Its standard input is empty; its
output goes to an anonymous file, of which only the last line, at most 200 characters
with control characters escaped, is kept for the log and ``nodes``: what it prints is
not believed, only its exit status is. One still running after ``timeout_s`` is killed
with its whole process group (SIGKILL) and has failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
_RUNNING: set[subprocess.Popen] = set()  # commands under way, killed when the daemon stops
_LOCK = threading.Lock()
SHOWN_CHARS = 200  # of a command's last line of output
READ_BYTES = 4096  # of its output's end


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str  # exit 0, exit 3: <its last line>, killed after 2m, cannot run: ...


def run_power_command(argv: list[str], timeout_s: float) -> Outcome:
    """Run one power command to its end or its timeout; never raises for its failure."""
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(ENV),
                cwd="/",
                start_new_session=True,  # its own process group: killed whole
                close_fds=True,
            )
        except OSError as exc:
            return Outcome(False, f"cannot run {argv[0]}: {exc.strerror or exc}")
        with _LOCK:
            _RUNNING.add(proc)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Outcome(False, f"{_name(argv)} still running after {timeout_s:g}s: killed")
        finally:
            _kill_group(proc)  # what it left behind in its group goes too
            with _LOCK:
                _RUNNING.discard(proc)
        tail = _last_line(out)
    if code == 0:
        return Outcome(True, "exit 0")
    why = f"signal {-code}" if code < 0 else f"exit {code}"
    return Outcome(False, f"{_name(argv)}: {why}" + (f": {tail}" if tail else ""))


def kill_running() -> None:
    """The daemon stops: the commands still under way are killed (a server left waking or
    powering off is taken as off by the next daemon, which wakes it when needed)."""
    with _LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _name(argv: list[str]) -> str:
    return os.path.basename(argv[0]) or argv[0]


def _last_line(out) -> str:
    """The output's last non-empty line, escaped and cut: for people, never parsed."""
    size = out.seek(0, os.SEEK_END)
    out.seek(max(0, size - READ_BYTES))
    text = out.read().decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return escape(lines[-1])[:SHOWN_CHARS] if lines else ""


def escape(text: str) -> str:
    """Control characters as ``\\xNN`` (one record is one line)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
