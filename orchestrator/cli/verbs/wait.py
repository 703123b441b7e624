"""``gridshift wait``: block until jobs have ended, one short request a second (no lock
is held between requests)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from orchestrator.cli import context

POLL_S = 1.0
#: Exit codes: as ``timeout(1)`` for a timeout; 1 when a job did not complete.
TIMED_OUT = 124
SHOWN = 10  # ids named in one error line
FINISHED = ("completed", "failed", "cancelled", "lost")


def wait(
    ctx: typer.Context,
    job_ids: Annotated[list[int], typer.Argument(help="Job ids.", show_default=False)],
    timeout: Annotated[
        str | None, typer.Option(help="Give up after this long (e.g. 30m): exit 124.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing.")] = False,
) -> None:
    """Wait until every job given has ended, printing each end as it happens. Exit 0 when
    all completed, 1 when any failed, was cancelled or lost (or was removed by clean),
    124 on --timeout (as timeout(1)). A held job is waited for until released and ended."""
    from orchestrator.errors import NotFoundError

    limit_s = None
    if timeout is not None:
        from orchestrator.timeparse import parse_duration_s

        limit_s = parse_duration_s(timeout)
    c = context.get(ctx)
    begin = time.monotonic()
    left = list(dict.fromkeys(job_ids))
    failed, first = False, True
    while left:
        answer = dict((i, job) for i, job in c.call("states", {"job_ids": left})["jobs"])
        if first:
            missing = [i for i in left if answer.get(i) is None]
            if missing:
                raise NotFoundError(f"no job {_some(missing)}")
            first = False
        for job_id in list(left):
            job = answer.get(job_id)
            if job is not None and job["state"] not in FINISHED:
                continue
            left.remove(job_id)
            failed = failed or job is None or job["state"] != "completed"
            if not quiet:
                typer.echo(f"job {job_id}: {_said(job)}")
        if not left:
            break
        spent_s = time.monotonic() - begin
        if limit_s is not None and spent_s >= limit_s:
            if not quiet:
                still = _some(left)
                typer.echo(f"timed out after {timeout}; not ended: job {still}", err=True)
            raise typer.Exit(TIMED_OUT)
        time.sleep(POLL_S if limit_s is None else max(0.0, min(POLL_S, limit_s - spent_s)))
    raise typer.Exit(1 if failed else 0)


def _some(ids: list[int]) -> str:
    """Ids for one line: the first ``SHOWN``, then how many more."""
    text = ", ".join(str(i) for i in ids[:SHOWN])
    return text if len(ids) <= SHOWN else f"{text} and {len(ids) - SHOWN} more"


def _said(job: dict | None) -> str:
    from orchestrator.cli.render import printable

    if job is None:
        return "gone (removed meanwhile)"
    state, code, reason = job["state"], job["exit_code"], job["reason"]
    text = state
    if code is not None:
        text += f" (exit {code})"
    if reason and state != "completed":
        text += f": {printable(reason)}"
    return text
