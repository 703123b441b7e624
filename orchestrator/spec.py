"""A job as submitted: validated from command-line options or one line of a sweep file.

Sweep lines (JSONL) carry the same fields as the options: ``name``, ``gpus`` (``2`` or
``"2-8"``), ``duration`` (``"2h30m"``, or a number of seconds), ``deadline`` or ``within``,
``interruptible``, ``priority``, ``after`` (an id or a list), ``label``/``labels``,
``workdir``, ``env`` (an object, or a list of ``"K=V"``) and ``command`` (a list of
arguments; a string is split like a shell would split words, never run by a shell).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import SpecError
from orchestrator.timeparse import parse_deadline, parse_duration_s, within_to_deadline

_GPUS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the executor sets per attempt; never taken from the submitter.
_EXECUTOR_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "GRIDSHIFT_JOB_ID",
    "GRIDSHIFT_JOB_NAME",
    "CUDA_DEVICE_ORDER",
)
SWEEP_FIELDS = frozenset(
    {
        "name",
        "gpus",
        "duration",
        "deadline",
        "within",
        "interruptible",
        "priority",
        "after",
        "label",
        "labels",
        "workdir",
        "env",
        "command",
    }
)


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    command: list[str] = Field(min_length=1)
    gpus_min: int = Field(ge=0)
    gpus_max: int = Field(ge=0)
    duration_s: float | None = None
    deadline: datetime | None = None
    interruptible: bool = False
    priority: int = 0
    after: list[int] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    workdir: str
    env: dict[str, str] = Field(default_factory=dict)


def parse_gpus(value: int | str) -> tuple[int, int]:
    if isinstance(value, bool):
        raise SpecError(f"invalid GPU count {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SpecError(f"invalid GPU count {value}: it cannot be negative")
        return value, value
    match = _GPUS.match(str(value))
    if not match:
        raise SpecError(f"invalid GPU count {value!r}: use a number (2) or a range (2-8)")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if high < low:
        raise SpecError(f"invalid GPU range {value!r}: the maximum is below the minimum")
    return low, high


def parse_env(items: list[str] | dict[str, Any]) -> dict[str, str]:
    pairs = items.items() if isinstance(items, dict) else [_split_env(i) for i in items]
    env = {}
    for key, value in pairs:
        if not _ENV_NAME.match(str(key)):
            raise SpecError(f"invalid environment variable name {key!r}")
        env[str(key)] = str(value)
    return env


def _split_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise SpecError(f"invalid --env {item!r}: use KEY=VALUE")
    return key, value


def submitter_env() -> dict[str, str]:
    """The submitting shell's environment, which the job runs with (as Slurm's default
    ``--export=ALL``), less what the executor sets per attempt."""
    return {k: v for k, v in os.environ.items() if k not in _EXECUTOR_ENV}


def build_spec(
    raw: dict[str, Any], *, now: datetime, cwd: str, base_env: dict[str, str]
) -> JobSpec:
    """Validate one submission. ``raw`` uses the sweep-file field names."""
    unknown = set(raw) - SWEEP_FIELDS
    if unknown:
        raise SpecError(f"unknown field(s): {', '.join(sorted(unknown))}")
    command = raw.get("command") or []
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as exc:
            raise SpecError(f"cannot split command {command!r}: {exc}") from None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise SpecError("command must be a list of strings")
    if not command or not command[0].strip():
        raise SpecError(
            "empty command: give the command after --, e.g. gridshift submit -- python train.py"
        )
    gpus_min, gpus_max = parse_gpus(raw.get("gpus", 1))
    duration = raw.get("duration")
    duration_s = None
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        if duration <= 0:
            raise SpecError(f"invalid duration {duration}: it must be longer than zero")
        duration_s = float(duration)
    elif duration is not None:
        duration_s = parse_duration_s(str(duration))
    if raw.get("deadline") and raw.get("within"):
        raise SpecError("give either a deadline or --within, not both")
    deadline = None
    if raw.get("deadline"):
        deadline = parse_deadline(str(raw["deadline"]), now)
    elif raw.get("within"):
        deadline = within_to_deadline(str(raw["within"]), now)
    workdir = Path(raw.get("workdir") or cwd).expanduser()
    if not workdir.is_absolute():
        workdir = Path(cwd) / workdir
    if not workdir.is_dir():
        raise SpecError(f"working directory {str(workdir)!r} does not exist")
    after = raw.get("after") or []
    after = [after] if isinstance(after, int | str) else after
    labels = raw.get("labels") or raw.get("label") or []
    labels = [labels] if isinstance(labels, str) else labels
    env = dict(base_env)
    env.update(parse_env(raw.get("env") or {}))
    try:
        return JobSpec(
            name=raw.get("name") or None,
            command=command,
            gpus_min=gpus_min,
            gpus_max=gpus_max,
            duration_s=duration_s,
            deadline=deadline,
            interruptible=bool(raw.get("interruptible", False)),
            priority=int(raw.get("priority", 0)),
            after=[int(a) for a in after],
            labels=[str(label) for label in labels],
            workdir=str(workdir),
            env=env,
        )
    except (ValueError, TypeError) as exc:
        raise SpecError(f"invalid job: {_first_error(exc)}") from None


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc)


def read_json_lines(path: Path) -> list[tuple[int, dict]]:
    """The JSON objects of a JSONL file with their line numbers; blank lines and lines
    starting with ``#`` are skipped. Any problem is one ``SpecError`` naming the line."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not a text file") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
        if not isinstance(raw, dict):
            raise SpecError(f"{path}:{number}: expected a JSON object")
        rows.append((number, raw))
    return rows
