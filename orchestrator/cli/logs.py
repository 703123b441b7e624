"""``gridshift logs``: a job's output, optionally followed until the job ends."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from orchestrator.cli import context

POLL_S = 0.25
CHUNK = 1 << 20


def logs(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
) -> None:
    """Print a job's output (stdout and stderr together)."""
    from orchestrator import store
    from orchestrator.errors import PermissionDenied
    from orchestrator.states import FINAL, JobState

    c = context.get(ctx)
    path = c.settings.log_path(job_id)

    def job_state() -> str:
        with c.db.read() as session:
            return store.get_job(session, job_id).state

    state = job_state()  # unknown ids fail here
    done = {s.value for s in FINAL} | {JobState.LOST.value}
    out = sys.stdout.buffer
    offset = 0
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                got_output = False
                while block := fh.read(CHUNK):  # stream: training logs can be huge
                    out.write(block)
                    offset += len(block)
                    got_output = True
        except FileNotFoundError:
            got_output = False
            if not follow:
                print(f"job {job_id} has no output yet ({state})", file=sys.stderr)
                return
        except PermissionError:
            raise PermissionDenied(f"cannot read {path}: permission denied") from None
        if got_output:
            out.flush()
        if not follow:
            return
        if not got_output:
            if state in done:
                return
            time.sleep(POLL_S)
            state = job_state()
