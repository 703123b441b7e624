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

With a grid signal the daemon plans each job in time. Without
--within or --deadline a job may wait up to 24 h for low carbon
(--within 12h: up to 12 h less its run time); --now (or --within 0)
starts it as soon as GPUs are free. Its run time is --duration, else
measured from its progress reports (GRIDSHIFT_PROGRESS_FILE), else
that of your earlier runs of its --name, else the lab's default_duration
(4h unless configured). The id goes to stdout; what the daemon will
do with the job, to stderr.

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
            help="GPUs: a count (2; 0 for none) or a range the job can run at (2-8): "
            "with a grid signal the planner picks the width, without one it runs at "
            "the maximum (capped to the largest node; a job whose minimum needs more "
            "runs across whole SSH servers)."
        ),
    ] = "1",
    duration: Annotated[
        str | None, typer.Option(help="Expected run time at full width and power, e.g. 2h30m.")
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="Finish by this time (ISO 8601; local time without an offset)."),
    ] = None,
    within: Annotated[
        str | None,
        typer.Option(help="Finish within this long, e.g. 12h (default 24h; 0: no waiting)."),
    ] = None,
    now: Annotated[
        bool, typer.Option("--now", help="Start as soon as GPUs are free (as --within 0).")
    ] = False,
    interruptible: Annotated[
        bool,
        typer.Option(
            "--interruptible", help="The job checkpoints on SIGTERM and may be suspended."
        ),
    ] = False,
    share: Annotated[
        bool,
        typer.Option(
            "--share",
            help="The job may run on one GPU with another job that may (co-location), on "
            "nodes whose share policy allows it, where the slowdown is small.",
        ),
    ] = False,
    checkpoint_cost: Annotated[
        str | None,
        typer.Option(
            help="Only with --interruptible: the run time one checkpoint and restart cost "
            "this job, e.g. 10m (0 to 1d; default: the lab's daemon.checkpoint_cost, 5m "
            "unless configured). It is suspended only where the carbon saved pays for it."
        ),
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    gpu_type: Annotated[
        str | None,
        typer.Option(
            help="Run only on GPUs of this type: v100, p100, a100, a40, rtx6000, k80 (as in "
            "the GPU models `gridshift nodes` lists), or a lab's own label. Default: any; "
            "the daemon picks among the free types."
        ),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(metavar="ID", help="Run only after job ID completed; repeat or give 3,4."),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option(metavar="LABEL", help="A label (repeatable).")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Working directory (default: the current one).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="Added to the job's environment (repeatable)."),
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
    from orchestrator.cli.render import print_json
    from orchestrator.errors import SpecError
    from orchestrator.timeparse import aware_text

    c = context.get(ctx)
    cwd = os.getcwd()
    if (cron is None) != (window is None):
        raise SpecError("give --cron and --window together")
    if cron is not None and file is not None:
        raise SpecError("--cron repeats one job; it does not take --file")
    if now:
        if within is not None or deadline is not None:
            raise SpecError("--now is --within 0: give it without --within or --deadline")
        within = "0"
    request: dict = {"cwd": cwd, "env": dict(os.environ)}
    if file is not None:
        given = [command, name, duration, deadline, within, after, label, workdir, env]
        given += [checkpoint_cost, gpu_type]
        if any(given) or gpus != "1" or priority or interruptible or share or now:
            raise SpecError(
                "with --file, give the job options inside the file, one JSON object per line"
            )
        request |= _read_sweep(file, cwd)
    else:
        raw = {
            "command": command or [],
            "name": name,
            "gpus": gpus,
            "duration": duration,
            "deadline": aware_text(deadline),  # naive: the user's zone, not the daemon's
            "within": within,
            "interruptible": interruptible,
            "share": share,
            "checkpoint_cost": checkpoint_cost,
            "priority": priority,
            "after": _split_ids(after or []),
            "labels": label or [],
            "workdir": _workdir(str(workdir) if workdir else None, cwd),
            "env": env or [],
            "gpu_type": gpu_type,
        }
        request["jobs"] = [raw]
        if cron is not None:
            request |= {"cron": cron, "window": window}
    made = c.call("submit", request)
    if cron is not None:
        _print_cron(made, as_json)
    elif as_json:
        out = made["jobs"]
        print_json(out if file is not None else out[0])
    else:
        for job in made["jobs"]:
            typer.echo(job["id"])
        _say_outlook(made["jobs"])


def _say_outlook(jobs: list[dict]) -> None:
    """What the daemon will do with each job, on stderr (stdout holds the ids alone, for
    scripts: ``id=$(gridshift submit ...)``); ten jobs at most."""
    from orchestrator.cli.render import local_time, printable

    for job in jobs[:10]:
        said = job.get("outlook")
        if said and job.get("may_wait_until") and said.startswith("may wait until "):
            # the time in this shell's zone (or --utc), not the daemon's
            rest = said.partition(" for low carbon")[2]
            said = f"may wait until {local_time(job['may_wait_until'])} for low carbon{rest}"
        if said:
            typer.echo(f"job {job['id']}: {printable(said)}", err=True)
    if len(jobs) > 10:
        typer.echo(f"(and {len(jobs) - 10} more jobs; gridshift plan shows them all)", err=True)


def _workdir(given, cwd: str) -> str:
    """The job's working directory as this user sees it: absolute, and there (the daemon
    does not look at the user's paths; it enters it as the user at launch)."""
    from orchestrator.errors import SpecError
    from orchestrator.queue.checks import text

    if given is not None and not isinstance(given, str):
        raise SpecError("workdir must be a string")
    path = Path(text(given or cwd, "workdir")).expanduser()
    if not path.is_absolute():
        path = Path(cwd) / path
    if not path.is_dir():
        raise SpecError(f"working directory {str(path)!r} does not exist")
    return str(path)


def _split_ids(values: list[str]) -> list[int]:
    from orchestrator.errors import SpecError
    from orchestrator.queue.checks import job_id, shown

    ids = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isascii() or not part.strip().isdigit():
                raise SpecError(f"invalid job id {shown(part.strip())} in --after")
            ids.append(job_id(int(part), "--after"))
    return ids


def _read_sweep(path: Path, cwd: str) -> dict:
    """The sweep's job objects (each workdir resolved here) and their line numbers; the
    daemon validates the rest and names the line of the first problem."""
    from orchestrator.errors import GridshiftError, SpecError
    from orchestrator.queue.spec import read_json_lines

    jobs, lines = [], []
    for number, raw in read_json_lines(path):
        try:
            raw["workdir"] = _workdir(raw.get("workdir"), cwd)
        except GridshiftError as exc:
            raise SpecError(f"{path}:{number}: {exc}") from None
        jobs.append(raw)
        lines.append(number)
    if not jobs:
        raise SpecError(f"{path} holds no job specs")
    return {"jobs": jobs, "lines": lines, "file": str(path)}


def _print_cron(made: dict, as_json: bool) -> None:
    from orchestrator.cli.render import local_time, print_json

    if as_json:
        print_json(made)
        return
    when = local_time(made["next"]) if made["next"] else "none"
    typer.echo(f"cron template {made['cron_id']}; next occurrence {when}")
