"""``Cli.run``'s forked child (``tests.conftest``): ``gridshift ARGS`` as a subprocess runs
it (exactly its environment, working directory, stdin empty, stdout and stderr caught),
but forked from the test process with the imports done, so a command costs its own work
and not Python's and the imports' start-up again (about 0.5 s of CPU each, thousands of
them in the suite). The fork is ``forkcli.run_exact``'s: what a fresh process would not
inherit is reset in the child (signal handlers, the logging and warnings pytest
installed, the CLI's per-process state).

``GRIDSHIFT_TEST_FORK=0`` runs every command as a real subprocess again."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import forkcli

ENABLED = os.environ.get("GRIDSHIFT_TEST_FORK", "1") != "0"
# commands that stay real subprocesses: the daemon (threads, signals, its own children)
KEEP = {"daemon"}


def forkable(args: tuple[str, ...], kwargs: dict) -> bool:
    """Whether ``Cli.run(*args, **kwargs)`` may run in a forked child."""
    return ENABLED and not kwargs and bool(args) and not KEEP.intersection(args)


def run(args: list[str], env: dict[str, str], cwd, timeout: float) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([python, -m, orchestrator, *args], env=env, cwd=cwd,
    capture_output=True, text=True, timeout=timeout)`` (``forkcli.run_exact``)."""
    outcome = forkcli.run_exact(list(args), env, cwd, timeout_s=timeout)
    argv = [sys.executable, "-m", "orchestrator", *args]
    if outcome.code == "timeout":
        raise subprocess.TimeoutExpired(argv, timeout, outcome.stdout, outcome.stderr)
    return subprocess.CompletedProcess(argv, outcome.code, outcome.stdout, outcome.stderr)
