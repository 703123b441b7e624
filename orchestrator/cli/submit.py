"""``gridshift submit``: queue a job, or a sweep of jobs from a JSONL file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context

HELP = """Queue a training job (or a sweep with --file).

Everything after -- is the command, run as an argument list, never through a shell
unless you write sh -c.

Example: gridshift submit --gpus 2 --within 12h -- python train.py --lr 3e-4"""


def submit(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command and its arguments.", show_default=False)
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name to recognise the job by.")] = None,
    gpus: Annotated[
        str,
        typer.Option(
            help="GPUs: a count (2) or a range the job can run "
            "at (2-8; it runs at the maximum for now)."
        ),
    ] = "1",
    duration: Annotated[
        str | None, typer.Option(help="Expected run time at full width and power, e.g. 2h30m.")
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="Finish by this time (ISO 8601; local time without an offset)."),
    ] = None,
    within: Annotated[str | None, typer.Option(help="Finish within this long, e.g. 12h.")] = None,
    interruptible: Annotated[
        bool,
        typer.Option(
            "--interruptible", help="The job checkpoints on SIGTERM and may be suspended."
        ),
    ] = False,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    after: Annotated[
        list[str] | None, typer.Option(help="Run only after job ID completed; repeat or give 3,4.")
    ] = None,
    label: Annotated[list[str] | None, typer.Option(help="A label (repeatable).")] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Working directory (default: the current one).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE added to the job's environment (repeatable)."),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="Submit every job spec in this JSONL file, all or none."),
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option(
            help='Repeat: queue the job at each occurrence of this cron expression ("0 2 * * *"; '
            "local time; a sixth field in front gives seconds).",
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(help="With --cron: each occurrence must finish within this long, e.g. 8h."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    from orchestrator import store
    from orchestrator.cli.render import print_json
    from orchestrator.errors import SpecError
    from orchestrator.inventory import largest_node_gpus
    from orchestrator.spec import build_spec, submitter_env
    from orchestrator.timeparse import utc_now

    c = context.get(ctx)
    now, cwd, base_env = utc_now(), os.getcwd(), submitter_env()
    if (cron is None) != (window is None):
        raise SpecError("give --cron and --window together")
    if cron is not None and file is not None:
        raise SpecError("--cron repeats one job; it does not take --file")
    if file is not None:
        given = [command, name, duration, deadline, within, after, label, workdir, env]
        if any(given) or gpus != "1" or priority or interruptible:
            raise SpecError(
                "with --file, give the job options inside the file, one JSON object per line"
            )
        specs = _read_sweep(file, now=now, cwd=cwd, base_env=base_env)
    else:
        raw = {
            "command": command or [],
            "name": name,
            "gpus": gpus,
            "duration": duration,
            "deadline": deadline,
            "within": within,
            "interruptible": interruptible,
            "priority": priority,
            "after": _split_ids(after or []),
            "labels": label or [],
            "workdir": str(workdir) if workdir else None,
            "env": env or [],
        }
        if cron is not None:
            _add_cron(c, raw, cron, window, now, cwd, base_env, as_json)
            return
        specs = [build_spec(raw, now=now, cwd=cwd, base_env=base_env)]
    largest = largest_node_gpus(c.settings, c.db)
    jobs = store.submit(c.db, specs, user=c.user, now=now, largest_node_gpus=largest)
    if as_json:
        out = [{"id": j.id, "state": j.state} for j in jobs]
        print_json(out if file is not None else out[0])
    else:
        for job in jobs:
            typer.echo(job.id)


def _split_ids(values: list[str]) -> list[int]:
    from orchestrator.errors import SpecError

    ids = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit():
                raise SpecError(f"invalid job id {part.strip()!r} in --after")
            ids.append(int(part))
    return ids


def _read_sweep(path: Path, **kwargs) -> list:
    from orchestrator.errors import GridshiftError, SpecError
    from orchestrator.spec import build_spec, read_json_lines

    specs = []
    for number, raw in read_json_lines(path):
        try:
            specs.append(build_spec(raw, **kwargs))
        except GridshiftError as exc:
            raise SpecError(f"{path}:{number}: {exc}") from None
    if not specs:
        raise SpecError(f"{path} holds no job specs")
    return specs


def _add_cron(c, raw: dict, cron: str, window: str, now, cwd: str, base_env, as_json: bool):
    from orchestrator import cron as crons
    from orchestrator.cli.render import print_json
    from orchestrator.timeparse import parse_duration_s

    window_s = parse_duration_s(window)
    raw = dict(raw, workdir=str(Path(raw["workdir"] or cwd).expanduser().absolute()))
    row = c.db.write_retrying(
        lambda session: crons.add(session, raw, cron, window_s, c.user, now, base_env)
    )
    upcoming = crons.next_fire(row, now)
    if as_json:
        print_json({"cron_id": row.id, "next": upcoming.isoformat() if upcoming else None})
    else:
        typer.echo(f"cron template {row.id}; next occurrence {upcoming:%Y-%m-%d %H:%M:%S %Z}")
