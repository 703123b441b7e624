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
    show(block, first, lines, follow, out, job_id)


def show(block, first: dict, lines: int | None, follow: bool, out, job_id: int) -> None:
    """Print the job's logs (``first``: the last source's block at 0): every source in
    order, or with ``lines`` the last attempt's (each part's, by rank) last lines; with
    ``follow``, the last attempt's (every part's) until the job ends."""
    count = first["sources"]
    live = [s for s in first.get("live") or [count - 1] if 0 <= s < count] or [count - 1]
    known = {count - 1: first}

    def read(source: int):
        return lambda offset: block(source, offset)

    offsets: dict[int, int] = {}
    for source in live if lines is not None else range(count):
        answer = known.get(source) or read(source)(0)
        if lines is not None:
            got = _tail(read(source), answer, lines, out)
        else:  # earlier attempts (on other servers) as they are, then the last one's parts
            got = _drain(read(source), 0, out, answer)
        if source in live and got is not None:
            offsets[source] = got
    if not offsets and not follow:
        print(f"job {job_id} has no output yet ({first['state']})", file=sys.stderr)
        return
    while follow:
        moved, state = 0, None
        for source in live:
            at = offsets.get(source, 0)
            answer = read(source)(at)
            state = state or answer["state"]  # before any part's data of this round
            got = _drain(read(source), at, out, answer) or 0
            offsets[source], moved = at + got, moved + got
        if not moved:
            if state in DONE:  # what any part wrote last was in this round
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
