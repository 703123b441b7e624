"""A job as submitted: validated from command-line options or one line of a sweep file.

Sweep lines (JSONL) carry the same fields as the options: ``name``, ``gpus`` (``2`` or
``"2-8"``), ``duration`` (``"2h30m"``, or a number of seconds), ``deadline`` (ISO 8601) or
``within`` (as ``duration``), ``interruptible`` and ``share`` (true or false), ``checkpoint_cost``
(as ``duration``, 0 to one day; an interruptible job's only), ``gpu_type`` (``v100``:
only nodes of that type; the daemon refuses a type no node has), ``priority`` (an
integer), ``after`` (an id or a list), ``label``/``labels``, ``workdir``, ``env`` (an
object of strings, or a list of ``"K=V"``) and ``command`` (a list of arguments; a string
is split like a shell would split words, never run by a shell). Types are JSON's, kept
strictly (``orchestrator.queue.checks``); durations and ``within`` are at most one year, a
deadline at most ten years away, and one the duration cannot meet is refused; ``within``
0 (``--now``) sets the deadline to the submission: no waiting. null means "not given".
"""

from __future__ import annotations

import json
import os
import re
import shlex
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import SpecError, first_invalid
from orchestrator.queue import checks
from orchestrator.timeparse import (
    check_seconds,
    format_duration,
    parse_checkpoint_s,
    parse_deadline,
    parse_duration_s,
)

_GPUS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$", re.ASCII)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the executor sets per attempt; never taken from the submitter.
_EXECUTOR_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "GRIDSHIFT_JOB_ID",
    "GRIDSHIFT_JOB_KEY",
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
        "share",
        "checkpoint_cost",
        "priority",
        "after",
        "label",
        "labels",
        "workdir",
        "env",
        "command",
        "gpu_type",
    }
)
#: a GPU type as a user names it (``v100``, ``a100``, a lab's own label)
_GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$", re.ASCII)


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    command: list[str] = Field(min_length=1)
    gpus_min: int = Field(ge=0)
    gpus_max: int = Field(ge=0)
    duration_s: float | None = None
    deadline: datetime | None = None
    interruptible: bool = False
    share: bool = False  # may share its GPUs with another job that may (co-location)
    checkpoint_s: float | None = None  # run time a suspension costs it; None: the lab's
    priority: int = 0
    after: list[int] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    workdir: str
    env: dict[str, str] = Field(default_factory=dict)
    gpu_type: str | None = None  # lower-case; the daemon checks that some node has it


def parse_gpu_type(value: Any, where: str = "") -> str | None:
    """``--gpu-type``: a short name of letters, digits, ``.``, ``_`` or ``-`` (case does
    not matter); None or "": any type."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _GPU_TYPE.match(value.strip().lower()):
        raise SpecError(
            f"{where}invalid GPU type {checks.shown(value)}: a name such as v100 or a100 "
            "(letters, digits, '.', '_', '-'; at most 64)"
        )
    return value.strip().lower()


def parse_gpus(value: int | str) -> tuple[int, int]:
    """``2`` or ``"2"`` (a count), ``"2-8"`` (a range); at most ``checks.MAX_GPUS``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        hint = " (write it without .0)" if isinstance(value, float) and value.is_integer() else ""
        raise SpecError(
            f"invalid GPU count {checks.shown(value)}: use a number (2) or a range (2-8){hint}"
        )
    if isinstance(value, int):
        if value < 0:
            raise SpecError(f"invalid GPU count {value}: it cannot be negative")
        low = high = value
    else:
        match = _GPUS.match(value) if len(value) <= 40 else None
        if not match:
            raise SpecError(
                f"invalid GPU count {checks.shown(value)}: use a number (2) or a range (2-8)"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
    if high > checks.MAX_GPUS:
        raise SpecError(f"invalid GPU count {checks.shown(value)}: at most {checks.MAX_GPUS}")
    if high < low:
        raise SpecError(f"invalid GPU range {value!r}: the maximum is below the minimum")
    return low, high


def parse_env(items: list[str] | dict[str, Any]) -> dict[str, str]:
    if isinstance(items, dict):
        pairs = list(items.items())
    elif isinstance(items, list):
        pairs = [_split_env(checks.text(i, "env item")) for i in items]
    else:
        raise SpecError(
            f"env must be an object or a list of KEY=VALUE strings, not {checks.shown(items)}"
        )
    env = {}
    for key, value in pairs:
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise SpecError(f"invalid environment variable name {checks.shown(key)}")
        if not isinstance(value, str):
            raise SpecError(
                f"environment variable {key}: the value must be a string, not {checks.shown(value)}"
            )
        env[key] = checks.text(value, f"environment variable {key}", limit=1 << 20)
    return env


def _split_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise SpecError(f"invalid --env {checks.shown(item)}: use KEY=VALUE")
    return key, value


def submitter_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The submitting shell's environment (``environ``: as the CLI sent it), which the job
    runs with (as Slurm's default ``--export=ALL``), less what the executor sets per
    attempt."""
    given = os.environ if environ is None else environ
    return {str(k): str(v) for k, v in given.items() if k not in _EXECUTOR_ENV}


def build_spec(
    raw: dict[str, Any],
    *,
    now: datetime,
    cwd: str,
    base_env: dict[str, str],
    check_workdir: bool = True,
) -> JobSpec:
    """Validate one submission. ``raw`` uses the sweep-file field names. The daemon passes
    ``check_workdir=False``: the submitting CLI checked it as its user (the daemon, often
    root, must not answer what exists where its caller cannot look)."""
    unknown = set(raw) - SWEEP_FIELDS
    if unknown:
        raise SpecError(f"unknown field(s): {', '.join(sorted(map(checks.shown, unknown)))}")
    command = _command(raw.get("command"))
    gpus_min, gpus_max = parse_gpus(_given(raw, "gpus", 1))
    duration_s = _duration(raw.get("duration"))
    deadline = _deadline(raw, now)
    left_s = None if deadline is None else (deadline - now).total_seconds()
    if left_s and duration_s is not None and duration_s > left_s:  # (0: --now)
        raise SpecError(
            f"the job runs {format_duration(duration_s)} but its deadline is "
            f"{format_duration(left_s)} away: it could never meet it"
        )
    workdir_text = checks.text(_given(raw, "workdir", cwd), "workdir")
    workdir = Path(workdir_text).expanduser()
    if not workdir.is_absolute():
        workdir = Path(cwd) / workdir
    if check_workdir and not workdir.is_dir():
        raise SpecError(f"working directory {str(workdir)!r} does not exist")
    after = _given(raw, "after", [])
    after = after if isinstance(after, list) else [after]
    labels = raw.get("labels") if raw.get("labels") is not None else raw.get("label")
    labels = [] if labels is None else labels
    labels = [labels] if isinstance(labels, str) else labels
    if not isinstance(labels, list):
        raise SpecError(f"labels must be a string or a list of strings, not {checks.shown(labels)}")
    name = raw.get("name")
    interruptible = checks.boolean(_given(raw, "interruptible", False), "interruptible")
    checkpoint_s = _checkpoint(raw.get("checkpoint_cost"), interruptible)
    env = dict(base_env)
    env.update(parse_env(_given(raw, "env", {})))
    try:
        return JobSpec(
            name=None if name is None or name == "" else checks.text(name, "name", limit=256),
            command=command,
            gpus_min=gpus_min,
            gpus_max=gpus_max,
            duration_s=duration_s,
            deadline=deadline,
            interruptible=interruptible,
            share=checks.boolean(_given(raw, "share", False), "share"),
            checkpoint_s=checkpoint_s,
            priority=checks.integer(_given(raw, "priority", 0), "priority"),
            after=[checks.job_id(a, "after") for a in after],
            labels=[checks.text(label, "label", limit=256) for label in labels],
            workdir=str(workdir),
            env=env,
            gpu_type=parse_gpu_type(raw.get("gpu_type")),
        )
    except (ValueError, TypeError) as exc:
        raise SpecError(f"invalid job: {_first_error(exc)}") from None


def _given(raw: dict[str, Any], key: str, default: Any) -> Any:
    """The field's value; JSON null (or an absent field) means the default."""
    value = raw.get(key)
    return default if value is None else value


def _command(command: Any) -> list[str]:
    if command is None:
        command = []
    if isinstance(command, str):
        checks.text(command, "command", limit=1 << 20)
        try:
            command = shlex.split(command)
        except ValueError as exc:
            raise SpecError(f"cannot split command {checks.shown(command)}: {exc}") from None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise SpecError("command must be a list of strings")
    for arg in command:
        checks.text(arg, "command argument", limit=1 << 20)
    if not command or not command[0].strip():
        raise SpecError(
            "empty command: give the command after --, e.g. gridshift submit -- python train.py"
        )
    return command


def _duration(value: Any) -> float | None:
    """A duration given as text (``2h30m``) or a number of seconds; None: not given."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_s(value)
    return check_seconds(checks.number(value, "duration"), value)


def _checkpoint(value: Any, interruptible: bool) -> float | None:
    """The run time a suspension costs the job (``--checkpoint-cost``); None: not given.
    Only an interruptible job is ever suspended: the option on another is a mistake."""
    if value is None:
        return None
    if not interruptible:
        raise SpecError(
            "--checkpoint-cost is for --interruptible jobs only (no other job is suspended)"
        )
    return parse_checkpoint_s(value)


def _deadline(raw: dict[str, Any], now: datetime) -> datetime | None:
    deadline, within = raw.get("deadline"), raw.get("within")
    if deadline is not None and within is not None:
        raise SpecError("give either a deadline or --within, not both")
    if deadline is not None:
        return parse_deadline(checks.text(deadline, "deadline", limit=100), now)
    if within is not None:  # 0 (--now): no waiting; its deadline is its submission
        if within in (0, "0") or (isinstance(within, str) and within.strip() in ("0", "0s")):
            return now
        return now + timedelta(seconds=_duration(within))
    return None


def _first_error(exc: Exception) -> str:
    if not callable(getattr(exc, "errors", None)):
        return str(exc)
    loc, msg = first_invalid(exc)
    return f"{'.'.join(str(p) for p in loc)}: {msg}"


#: The largest job file read (a sweep of many thousand jobs is far smaller).
MAX_FILE_BYTES = 64 << 20


def read_text_file(path: Path, what: str = "file", limit: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of at most ``limit`` bytes (a device such as /dev/zero, or a
    file too large, is refused instead of read without end)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise SpecError(f"{path}: {what} larger than {limit >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path} is not a text file (not UTF-8: byte {exc.start + 1} is {data[exc.start]:#04x})"
        ) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(text: str) -> Any:
    """JSON as the standard has it: no NaN or Infinity. Nesting too deep for the decoder
    is a ValueError like any other malformed JSON."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json_lines(path: Path) -> list[tuple[int, dict]]:
    """The JSON objects of a JSONL file with their line numbers; blank lines and lines
    starting with ``#`` are skipped. Any problem is one ``SpecError`` naming the line."""
    lines = read_text_file(Path(path), "job file").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = loads_strict(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
        except ValueError as exc:
            raise SpecError(f"{path}:{number}: invalid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise SpecError(f"{path}:{number}: expected a JSON object")
        rows.append((number, raw))
    return rows
