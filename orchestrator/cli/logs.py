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
TAIL_WINDOW = 64 << 10  # bytes read first from a log's end for ``-n``
TAIL_MAX = 1 << 20  # bytes ``-n`` reads back at most (then prints them, lines or not)


def logs(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    lines: Annotated[
        int | None,
        typer.Option("--lines", "-n", help="Only the last N lines (as tail -n), then --follow."),
    ] = None,
) -> None:
    """Print a job's output (stdout and stderr together)."""
    from orchestrator.errors import SpecError

    if lines is not None and lines < 0:
        raise SpecError(f"--lines {lines}: give 0 or more lines")
    c = context.get(ctx)
    out = sys.stdout.buffer

    def block(source: int | None, offset: int) -> dict:
        return c.call("logs", {"job_id": job_id, "source": source, "offset": offset})

    first = block(None, 0)  # unknown ids and other users' jobs fail here
    last = first["sources"] - 1
    read = lambda offset: block(last, offset)  # noqa: E731
    state = first["state"]
    if lines is not None:  # the last attempt's output: its last lines
        got = _tail(read, first if last == 0 else read(0), lines, out)
    else:
        for source in range(last):  # earlier attempts on other servers: as they are
            _drain(lambda offset, s=source: block(s, offset), 0, out)
        got = _drain(read, 0, out, first if last == 0 else None)
    if got is None and not follow:
        print(f"job {job_id} has no output yet ({state})", file=sys.stderr)
        return
    offset = got or 0
    while follow:
        answer = read(offset)
        state = answer["state"]
        got = _drain(read, offset, out, answer)
        offset += got or 0
        if not got:
            if state in DONE:  # what it wrote last was in this answer
                return
            time.sleep(POLL_S)


def _tail(read, answer: dict, lines: int, out) -> int | None:
    """Write the last ``lines`` lines of a log (``answer``: its block at offset 0); the
    offset its end is at, None when there is no file. Lines end at ``\\n`` only, as
    ``tail -n``'s (a progress bar's ``\\r`` does not end one). The daemon says the file's
    size (a log on this host): only its end is read, a longer stretch each time until it
    holds enough lines; else (an SSH server's) all of it is read, keeping its end. At most
    ``TAIL_MAX`` bytes are kept: lines that do not fit in them are printed as their last
    ``TAIL_MAX`` bytes (a log with no line break, its end)."""
    if answer["data"] is None:
        return None
    size, window = answer.get("size"), TAIL_WINDOW
    while True:
        start = 0 if size is None else max(0, size - window)
        data, end, cut = _collect(read, start, answer if start == 0 else None, size)
        pieces = data.split(b"\n")
        whole = [p + b"\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
        if start > 0 or cut:
            whole = whole[1:]  # the first may be cut
        if (start == 0 and not cut) or len(whole) >= lines:
            break
        if window >= TAIL_MAX or size is None:
            whole = [data]  # the last TAIL_MAX bytes hold fewer lines: all of them
            break
        window = min(window * 8, TAIL_MAX)
    if lines:
        out.write(b"".join(whole[-lines:]))
        out.flush()
    return end


def _collect(read, start: int, answer: dict | None, size: int | None) -> tuple[bytes, int, bool]:
    """The log's bytes from ``start`` to ``size`` (None: to its end, keeping the last
    ``TAIL_MAX`` bytes); the end, and whether bytes after ``start`` were dropped."""
    parts: list[bytes] = []
    offset, kept, cut = start, 0, False
    while size is None or offset < size:
        answer = answer or read(offset)
        data = base64.b64decode(answer["data"] or "")
        answer = None
        if not data:
            break
        if size is not None:
            data = data[: size - offset]
        parts.append(data)
        offset, kept = offset + len(data), kept + len(data)
        while kept - len(parts[0]) >= TAIL_MAX:
            kept -= len(parts.pop(0))
            cut = True
    data = b"".join(parts)
    if len(data) > TAIL_MAX:
        data, cut = data[-TAIL_MAX:], True
    return data, offset, cut


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
