"""The real ``gridshift`` command (``orchestrator.cli.app.main``, the console script's
entry) run in a forked child: as isolated as a subprocess (its own environment, working
directory, file descriptors, memory limit and time limit), without paying Python's and
the imports' start-up again for each run. For many short runs: the bad-input catalogue
(``benchmarks/bad_inputs.py``), the property-based test of ``submit`` and, through
``forkrun``, the tests' ``Cli.run``."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sqlite3
import sys
import tempfile
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


_warm = False


def warm_up() -> None:
    """Import what every command needs once, so that each forked child starts warm."""
    global _warm
    if not _warm:
        import pandas  # noqa: F401
        import sqlmodel  # noqa: F401

        import orchestrator.cli.app  # noqa: F401

        _warm = True


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
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSHIFT_")}
    full = {**base, "GRIDSHIFT_HOME": str(home), "COLUMNS": "200", **(env or {})}
    return run_exact(argv, full, cwd or home, timeout_s=timeout_s, memory_bytes=memory_bytes)


def run_exact(
    argv: list[str],
    env: dict[str, str],
    cwd: Path | str,
    *,
    timeout_s: float,
    memory_bytes: int | None = None,
) -> Outcome:
    """``gridshift ARGV`` in exactly ``env`` and ``cwd``, as a subprocess would run it
    (stdin empty, stdout and stderr caught), with a fresh process's signal handlers,
    logging, warnings and CLI state; killed after ``timeout_s`` (code ``"timeout"``)."""
    warm_up()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gs-fork-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller
            code = 70
            try:
                _child(argv, env, str(cwd), out, err, memory_bytes)
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
        return Outcome(code, _read(out), _read(err), time.perf_counter() - start)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _child(argv, env: dict[str, str], cwd: str, out: str, err: str, memory_bytes) -> None:
    import logging
    import warnings

    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    os.chdir(cwd)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    # the caller's sys.stdout/stderr may not write to fds 1 and 2 (pytest's capture)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    # a fresh interpreter's logging and warnings, not pytest's capture of them
    named = [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in (logging.getLogger(), *named):  # what in-process tests set up here
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.disabled = False
    logging.getLogger().setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    warnings.resetwarnings()
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
        warnings.simplefilter("ignore", category)
    warnings.simplefilter("ignore", ResourceWarning)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    # the CLI's per-process state, as a new process starts with it
    from orchestrator import timeparse

    timeparse.show_utc(False)
    timeparse._ZONES.clear()
    from orchestrator.cli.app import main

    sys.argv = [os.path.join(os.path.dirname(timeparse.__file__), "__main__.py"), *argv]
    main(list(argv))


def _wait(pid: int, timeout_s: float) -> int | str:
    """The child's exit status (as subprocess gives it), or "timeout" after ``timeout_s``
    (the child killed, as subprocess.run's timeout kills it)."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
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
