"""``gridshift cancel``."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context


def cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[int], typer.Argument(help="Job ids.", show_default=False)],
) -> None:
    """Cancel jobs (yours; root may cancel any).

    A running job gets SIGTERM on its process group, then SIGKILL after the grace period
    (cancel_grace_s): from the daemon at its next pass, or, with no daemon running, from
    this command at once (it waits for the job to end and records it cancelled)."""
    from orchestrator.cli.render import plain

    c = context.get(ctx)
    made = c.call("cancel", {"job_ids": job_ids})
    for job_id, result in made["results"]:
        if result == "stopping":
            result = f"stopping (SIGTERM, then SIGKILL after {made['grace_s']:g}s" + (
                "; no daemon is running, so when one starts)" if made["no_daemon"] else ")"
            )
        typer.echo(f"job {job_id}: {plain(result)}")


def clean(
    ctx: typer.Context,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Finished at least this long ago (e.g. 30d, 12h).")
    ] = "30d",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove finished jobs (completed, failed, cancelled) and their runs' rows, run
    directories and logs (yours; root and the daemon's user: everyone's).

    Kept: jobs an unfinished job waits on; the per-day usage rows that carbon budgets add
    up (so `budget` still counts what was spent). `report` lists jobs: after a clean it
    covers the jobs that remain. On SSH nodes the copies on the servers stay."""
    import math

    from orchestrator.cli.render import print_json
    from orchestrator.errors import SpecError
    from orchestrator.timeparse import parse_duration_s

    older_than_s = parse_duration_s(older_than)
    if not math.isfinite(older_than_s):
        raise SpecError(f"invalid duration {older_than!r}: it must be finite")
    made = context.get(ctx).call("clean", {"older_than_s": older_than_s, "dry_run": dry_run})
    if json_out:
        print_json(made)
        return
    jobs, verb = len(made["jobs"]), "would remove" if made["dry_run"] else "removed"
    if not jobs:
        typer.echo(f"nothing to clean: no finished job ended before {made['before']}")
    else:
        typer.echo(
            f"{verb} {jobs} job(s) finished before {made['before']}: {made['attempts']} "
            f"attempt(s), {made['events']} event(s), {made['run_dirs']} run director"
            f"{'y' if made['run_dirs'] == 1 else 'ies'} and {made['logs']} log(s), "
            f"{made['bytes'] / 1e6:.1f} MB"
        )
    for line in made["skipped"]:
        typer.echo(f"left: {line}", err=True)
