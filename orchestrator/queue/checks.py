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
