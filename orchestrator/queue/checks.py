"""Strict checks for values as they enter: from a command line, a JSON job file, a trace.

JSON's types are kept: a bool is a bool (``"false"`` is not false), an integer is an
integer (``1.9`` is not 1; ``1.0`` is refused too, with a message saying so), a string is
a string (``null`` is not ``"None"``). Integers fit in 64 bits (what the store holds);
text holds no NUL byte and no lone surrogate (neither can be stored or passed to a
process). Each problem is one ``SpecError`` naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.errors import SpecError

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
#: More GPUs than any one job or node is given; placement says the exact limit later.
MAX_GPUS = 65_536
MAX_TEXT = 4096  # characters in a name, label or argument


class GpuLimit(int):
    """The most GPUs one job may have here (an int), with why in words."""

    words: str

    def __new__(cls, gpus: int, words: str) -> GpuLimit:
        out = super().__new__(cls, gpus)
        out.words = words
        return out


def too_wide(gpus_min: int, limit: int | None) -> str | None:
    """Why a job of ``gpus_min`` GPUs can never run here, or None (``limit`` None: not
    known yet)."""
    if limit is None or gpus_min <= limit:
        return None
    return f"needs {gpus_min} GPUs; {getattr(limit, 'words', f'the largest node has {limit}')}"


def spec_label(specs: list, i: int, labels: list[str] | None = None) -> str:
    """What a refusal calls the ``i``-th of ``specs``: its ``labels`` entry (a submit
    file's ``path:line: ``), else ``job N: `` where there are several, else nothing."""
    if labels is not None and i < len(labels):
        return labels[i]
    return f"job {i + 1}: " if len(specs) > 1 else ""


def shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def text(value: Any, field: str, *, limit: int = MAX_TEXT) -> str:
    """A string that can be stored and passed to a process."""
    if not isinstance(value, str):
        raise SpecError(f"{field} must be a string, not {shown(value)}")
    if "\x00" in value:
        raise SpecError(f"{field} {shown(value)} holds a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(f"{field} {shown(value)} is not valid UTF-8 text") from None
    if len(value) > limit:
        raise SpecError(f"{field} is {len(value)} characters long; at most {limit}")
    return value


def integer(value: Any, field: str, *, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """A JSON integer (not a bool, a float or a string) in [low, high]."""
    if isinstance(value, bool):
        raise SpecError(f"{field} must be a whole number, not {shown(value)}")
    if isinstance(value, float):
        hint = " (write it without .0)" if math.isfinite(value) and value.is_integer() else ""
        raise SpecError(f"{field} must be a whole number, not {shown(value)}{hint}")
    if not isinstance(value, int):
        raise SpecError(f"{field} must be a whole number, not {shown(value)}")
    if not low <= value <= high:
        raise SpecError(f"{field} {shown(value)} is out of range: {low} to {high}")
    return value


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{field} must be true or false, not {shown(value)}")
    return value


def number(value: Any, field: str) -> float:
    """A finite JSON number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{field} must be a number, not {shown(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise SpecError(f"{field} must be a finite number, not {shown(value)}")
    return result


def job_id(value: Any, field: str = "job id") -> int:
    return integer(value, field, low=1)


def stored_job_problem(job: Any) -> str | None:
    """Why a job row as stored cannot be planned, or None. The CLI and the socket check
    every value on the way in, but a database may predate those checks or be edited by
    hand: the daemon believes no row it did not check (an infinite duration, a deadline
    in the year 9999 or a width of 2**40 would stop or swamp every pass)."""
    from orchestrator.timeparse import (
        MAX_CHECKPOINT_S,
        MAX_CHECKPOINT_TEXT,
        MAX_DEADLINE_S,
        MAX_DURATION_S,
        MAX_DURATION_TEXT,
    )

    d = job.duration_s
    if d is not None and not (isinstance(d, int | float) and 0 < d <= MAX_DURATION_S):
        return (
            f"duration {shown(d)} s: a duration is longer than zero and at most {MAX_DURATION_TEXT}"
        )
    c = getattr(job, "checkpoint_s", None)
    if c is not None and not (
        isinstance(c, int | float) and not isinstance(c, bool) and 0 <= c <= MAX_CHECKPOINT_S
    ):
        return f"checkpoint cost {shown(c)} s: it is 0 to {MAX_CHECKPOINT_TEXT}"
    lo, hi = job.gpus_min, job.gpus_max
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= MAX_GPUS):
        return f"GPUs {shown(lo)}-{shown(hi)} are not a range within 0-{MAX_GPUS}"
    if not isinstance(job.priority, int) or not INT64_MIN <= job.priority <= INT64_MAX:
        return f"priority {shown(job.priority)} is not a 64-bit whole number"
    if job.deadline is not None and job.submitted_at is not None:
        ahead_s = (job.deadline - job.submitted_at).total_seconds()
        if ahead_s > MAX_DEADLINE_S + 86400.0:
            return f"deadline {job.deadline:%Y-%m-%d} is more than ten years after submission"
    return None
