"""``Cli.run``'s forked child (``tests.conftest``): ``gridshift ARGS`` as a subprocess runs
it (exactly its environment, working directory, stdin empty, stdout and stderr caught),
but forked from the test process with the imports done, so a command costs its own work
and not Python's and the imports' start-up again (about 0.5 s of CPU each, thousands of
them in the suite). What a fresh process would not inherit is reset in the child: signal
handlers, the logging and warnings pytest installed, and the CLI's per-process state.

``GRIDSHIFT_TEST_FORK=0`` runs every command as a real subprocess again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

ENABLED = os.environ.get("GRIDSHIFT_TEST_FORK", "1") != "0"
# commands that stay real subprocesses: the daemon (threads, signals, its own children)
KEEP = {"daemon"}
_warm = False


def forkable(args: tuple[str, ...], kwargs: dict) -> bool:
    """Whether ``Cli.run(*args, **kwargs)`` may run in a forked child."""
    return ENABLED and not kwargs and bool(args) and not KEEP.intersection(args)


def warm_up() -> None:
    """Import what every command needs once, so that each forked child starts warm."""
    global _warm
    if not _warm:
        import pandas  # noqa: F401
        import sqlmodel  # noqa: F401

        import orchestrator.cli.app  # noqa: F401

        _warm = True


def run(args: list[str], env: dict[str, str], cwd, timeout: float) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([python, -m, orchestrator, *args], env=env, cwd=cwd,
    capture_output=True, text=True, timeout=timeout)``."""
    warm_up()
    with tempfile.TemporaryDirectory(prefix="gs-fork-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller
            code = 70
            try:
                _child(args, env, str(cwd), out, err)
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
        code = _wait(pid, timeout)
        argv = [sys.executable, "-m", "orchestrator", *args]
        stdout = _read(out)
        stderr = _read(err)
    if code is None:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _child(args, env: dict[str, str], cwd: str, out: str, err: str) -> None:
    import logging
    import warnings

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

    sys.argv = [os.path.join(os.path.dirname(timeparse.__file__), "__main__.py"), *args]
    main(list(args))


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's exit status (as subprocess gives it), or None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    os.kill(pid, signal.SIGKILL)  # as subprocess.run's timeout: the child alone
    os.waitpid(pid, 0)
    return None
