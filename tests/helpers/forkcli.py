"""The real ``gridshift`` command (``orchestrator.cli.app.main``, the console script's
entry) run in a forked child: as isolated as a subprocess (its own environment, working
directory, file descriptors, memory limit and time limit), without paying Python's and
the imports' start-up again for each run. For many short runs: the bad-input catalogue
(``benchmarks/bad_inputs.py``) and the property-based test of ``submit``."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


@dataclass
class Outcome:
    code: int | str  # the exit status, or "timeout"
    stdout: str
    stderr: str
    seconds: float

    def error_lines(self, command: str = "") -> list[str]:
        """stderr's lines; for ``daemon``, less its log records (it logs as it starts)."""
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        if command == "daemon":
            lines = [ln for ln in lines if not _log_record(ln)]
        return lines

    def one_line_error(self, command: str = "") -> bool:
        """Exit 2 and exactly one ``gridshift: error:`` line (no traceback)."""
        lines = self.error_lines(command)
        return self.code == 2 and len(lines) == 1 and lines[0].startswith("gridshift: error: ")


def warm_up() -> None:
    """Import what every command needs once, so that each forked child starts warm."""
    import pandas  # noqa: F401
    import sqlmodel  # noqa: F401

    import orchestrator.cli.app  # noqa: F401


def run(
    argv: list[str],
    home: Path,
    env: dict[str, str] | None = None,
    *,
    cwd: Path | None = None,
    memory_bytes: int = 2 << 30,
    timeout_s: float = 30.0,
) -> Outcome:
    """``gridshift ARGV`` with ``GRIDSHIFT_HOME=home`` and ``env`` over a copy of this
    environment without its ``GRIDSHIFT_*`` variables."""
    out, err = home / ".stdout", home / ".stderr"
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller
        code = 70
        try:
            _child(argv, home, env or {}, cwd or home, out, err, memory_bytes)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    code: int | str = _wait(pid, timeout_s)
    outcome = Outcome(
        code=code,
        stdout=out.read_text(errors="replace") if out.exists() else "",
        stderr=err.read_text(errors="replace") if err.exists() else "",
        seconds=time.perf_counter() - start,
    )
    out.unlink(missing_ok=True)
    err.unlink(missing_ok=True)
    return outcome


def _child(argv, home: Path, env, cwd: Path, out: Path, err: Path, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    for name in [k for k in os.environ if k.startswith("GRIDSHIFT_")]:
        del os.environ[name]
    os.environ.update({"GRIDSHIFT_HOME": str(home), "COLUMNS": "200", **env})
    if "TZ" in env:
        time.tzset()
    os.chdir(cwd)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    # the caller's sys.stdout/stderr may not write to fds 1 and 2 (pytest's capture)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    from orchestrator.cli.app import main

    main(list(argv))


def _wait(pid: int, timeout_s: float) -> int | str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "timeout"


def _log_record(line: str) -> bool:
    words = line.split()
    return bool(words) and (words[0] in LEVELS or (len(words) > 1 and words[1] in LEVELS))


def stored(home: Path) -> dict[str, int]:
    """Rows of the tables a bad input must not touch, in the home's SQLite database."""
    counts = {"job": 0, "crontemplate": 0, "dependency": 0}
    db = home / "gridshift.db"
    if not db.exists():
        return counts
    con = sqlite3.connect(db)
    try:
        for table in counts:
            with contextlib.suppress(sqlite3.OperationalError):  # no such table yet
                (counts[table],) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    finally:
        con.close()
    return counts
