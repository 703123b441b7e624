"""Submit N jobs through the real CLI entry point, each call its own transaction and its
own database connection, as N separate ``gridshift submit`` commands would. Exits 1 and
prints what went wrong if any submission failed."""

from __future__ import annotations

import contextlib
import io
import sys

from orchestrator.cli.app import main


def submit_many(count: int, tag: str) -> list[str]:
    failures = []
    for i in range(count):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main(["submit", "--gpus", "1", "--name", f"{tag}-{i}", "--", "true"])
                code = 0
            except SystemExit as exc:
                code = exc.code
        if code != 0:
            failures.append(f"{tag}-{i}: exit {code}: {err.getvalue().strip()}")
    return failures


if __name__ == "__main__":
    problems = submit_many(int(sys.argv[1]), sys.argv[2])
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1 if problems else 0)
