"""``gridshift logs``: a job's output, optionally followed until the job ends. A job that
ran on an SSH server is read from that server (its log stays there)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Annotated

import typer

from orchestrator.cli import context

POLL_S = 0.25
CHUNK = 1 << 20
Reader = Callable[[int], bytes | None]  # bytes from an offset on; None: no such file


def logs(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
) -> None:
    """Print a job's output (stdout and stderr together)."""
    from orchestrator import store
    from orchestrator.states import FINAL, JobState

    c = context.get(ctx)

    def job_state() -> str:
        with c.db.read() as session:
            return store.get_job(session, job_id).state

    state = job_state()  # unknown ids fail here
    done = {s.value for s in FINAL} | {JobState.LOST.value}
    links: dict = {}
    sources = _sources(c, job_id, links)
    out = sys.stdout.buffer
    try:
        for read in sources[:-1]:  # earlier attempts on other servers: as they are
            _drain(read, 0, out)
        read = sources[-1]
        offset = 0
        while True:
            got = _drain(read, offset, out)
            if got is None and not follow:
                print(f"job {job_id} has no output yet ({state})", file=sys.stderr)
                return
            offset += got or 0
            if not follow:
                return
            if not got:
                if state in done:
                    return
                time.sleep(POLL_S)
                state = job_state()
                if state in done:  # what it wrote last, then stop
                    offset += _drain(read, offset, out) or 0
                    return
    finally:
        for link in links.values():
            link.close()


def _drain(read: Reader, offset: int, out) -> int | None:
    """Copy from ``offset`` to the end; bytes copied, None when there is no file."""
    total = 0
    while True:
        block = read(offset + total)
        if block is None:
            return None if total == 0 else total
        if not block:
            return total
        out.write(block)
        out.flush()
        total += len(block)


def _sources(c, job_id: int, links: dict) -> list[Reader]:
    """Where the job's output is: this host's log, or each server it ran on, in the
    order of its attempts."""
    from sqlmodel import select

    from orchestrator.models import Attempt

    with c.db.read() as session:
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
        ).all()
    ssh_nodes = {n.name: n for n in c.settings.nodes if n.executor == "ssh"}
    keys: list[tuple[str, str]] = []
    for att in attempts:
        if att.node in ssh_nodes:
            path = (att.handle or {}).get("data", {}).get("log_path")
            if path is None:
                from orchestrator.sshnodes import ssh_target

                path = ssh_target(ssh_nodes[att.node]).remote_path("logs", f"{job_id}.log")
            key = (att.node, path)
        else:
            key = ("", str(c.settings.log_path(job_id)))
        if key not in keys:
            keys.append(key)
    if not keys:
        keys.append(("", str(c.settings.log_path(job_id))))
    return [_reader(c, node, path, links) for node, path in keys]


def _reader(c, node: str, path: str, links: dict) -> Reader:
    if not node:

        def local(offset: int) -> bytes | None:
            from orchestrator.errors import PermissionDenied

            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(CHUNK)
            except FileNotFoundError:
                return None
            except PermissionError:
                raise PermissionDenied(f"cannot read {path}: permission denied") from None

        return local
    from orchestrator import sshnodes

    if node not in links:
        cfg = next(n for n in c.settings.nodes if n.name == node)
        links[node] = sshnodes.build_links([cfg])[node]
    link = links[node]
    return lambda offset: link.read(path, offset)
