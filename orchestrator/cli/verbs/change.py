"""``gridshift restart``, ``hold``, ``release`` and ``edit``."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context

IDS = Annotated[list[int], typer.Argument(help="Job ids.", show_default=False)]


def restart(ctx: typer.Context, job_ids: IDS) -> None:
    """Queue finished jobs (completed, failed, cancelled, lost) again, each as a new job
    with the same spec: command, GPUs, run time, priority, labels, dependencies, and a
    deadline as far after the new submission as the old one's was. Prints each new id."""
    made = context.get(ctx).call("restart", {"job_ids": job_ids})
    for job in made["jobs"]:
        note = f" ({job['note']})" if job.get("note") else ""
        typer.echo(f"job {job['id']}: restart of job {job['restart_of']}{note}")


def hold(ctx: typer.Context, job_ids: IDS) -> None:
    """Hold queued jobs: never planned or started, nor the jobs that wait on them, until
    released (yours; root may hold any)."""
    _print(context.get(ctx).call("hold", {"job_ids": job_ids}))


def release(ctx: typer.Context, job_ids: IDS) -> None:
    """Release held jobs: queued again, planned at the daemon's next pass."""
    _print(context.get(ctx).call("release", {"job_ids": job_ids}))


def _print(made: dict) -> None:
    for job_id, result in made["results"]:
        typer.echo(f"job {job_id}: {result}")


def edit(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    priority: Annotated[int | None, typer.Option(help="Higher runs first.")] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="Finish by this time (ISO 8601; local time without an offset)."),
    ] = None,
    within: Annotated[
        str | None, typer.Option(help="Finish within this long from now, e.g. 12h.")
    ] = None,
    duration: Annotated[
        str | None, typer.Option(help="Expected run time at full width and power, e.g. 2h30m.")
    ] = None,
    gpus: Annotated[str | None, typer.Option(help="GPUs: a count (2) or a range (2-8).")] = None,
    gpu_type: Annotated[
        str | None,
        typer.Option(help='Only GPUs of this type (v100, a100 ...); "" for any type.'),
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name to recognise the job by.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Change a queued or held job, checked as submit checks it (a bad value: nothing
    changes). The daemon plans it again at its next pass."""
    from orchestrator.cli.render import print_json

    changes = {"priority": priority, "deadline": deadline, "within": within,
               "duration": duration, "gpus": gpus, "gpu_type": gpu_type,
               "name": name}  # fmt: skip
    made = context.get(ctx).call(
        "edit", {"job_id": job_id, "changes": {k: v for k, v in changes.items() if v is not None}}
    )
    if as_json:
        print_json(made)
        return
    gpus_text = str(made["gpus_min"]) if made["gpus_min"] == made["gpus_max"] else (
        f"{made['gpus_min']}-{made['gpus_max']}"
    )  # fmt: skip
    parts = [f"priority {made['priority']}", f"gpus {gpus_text}"]
    if made.get("gpu_type"):
        parts.append(f"gpu type {made['gpu_type']}")
    if made["duration_s"] is not None:
        from orchestrator.timeparse import format_duration

        parts.append(f"duration {format_duration(made['duration_s'])}")
    if made["deadline"] is not None:
        from orchestrator.timeparse import format_time

        parts.append(f"deadline {format_time(made['deadline'], seconds=True)}")
    if made["name"]:
        from orchestrator.cli.render import printable

        parts.append(f"name {printable(made['name'])}")
    typer.echo(f"job {made['id']} ({made['state']}): {', '.join(parts)}")
