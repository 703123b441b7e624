"""``gridshift logs``: a job's output, optionally followed until the job ends. The daemon
reads it (a job that ran on an SSH server, from that server) and answers in blocks; only
the job's owner (or root) may read it."""

from __future__ import annotations

import base64
import sys
import time
from typing import Annotated

import typer

from orchestrator.cli import context

POLL_S = 0.25
DONE = {"completed", "failed", "cancelled", "lost"}


def logs(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
) -> None:
    """Print a job's output (stdout and stderr together)."""
    c = context.get(ctx)
    out = sys.stdout.buffer

    def block(source: int | None, offset: int) -> dict:
        return c.call("logs", {"job_id": job_id, "source": source, "offset": offset})

    first = block(None, 0)  # unknown ids and other users' jobs fail here
    last = first["sources"] - 1
    for source in range(last):  # earlier attempts on other servers: as they are
        _drain(lambda offset, s=source: block(s, offset), 0, out)
    state, offset = first["state"], 0
    read = lambda offset: block(last, offset)  # noqa: E731
    got = _drain(read, offset, out, first if last == 0 else None)
    if got is None and not follow:
        print(f"job {job_id} has no output yet ({state})", file=sys.stderr)
        return
    offset += got or 0
    while follow:
        answer = read(offset)
        state = answer["state"]
        got = _drain(read, offset, out, answer)
        offset += got or 0
        if not got:
            if state in DONE:  # what it wrote last was in this answer
                return
            time.sleep(POLL_S)


def _drain(read, offset: int, out, answer: dict | None = None) -> int | None:
    """Copy from ``offset`` to the end (``answer``: the first block, already asked for);
    bytes copied, None when there is no file."""
    total = 0
    while True:
        answer = answer or read(offset + total)
        if answer["data"] is None:
            return None if total == 0 else total
        data = base64.b64decode(answer["data"])
        answer = None
        if not data:
            return total
        out.write(data)
        out.flush()
        total += len(data)
