"""Durations (``2h30m``) and deadlines (ISO 8601) as people type them. UTC inside."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from orchestrator.errors import SpecError

_UNITS_S = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")


def parse_duration_s(text: str) -> float:
    """Seconds in a duration such as ``45s``, ``90m``, ``2h30m``, ``1.5h``, ``1d12h``, ``1w``.
    A unit is required on every number."""
    cleaned = text.strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for match in _PART.finditer(cleaned):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if not cleaned or pos != len(cleaned):
        raise SpecError(f"invalid duration {text!r}: use e.g. 45s, 90m, 2h30m, 1.5h or 1d")
    if total <= 0:
        raise SpecError(f"invalid duration {text!r}: it must be longer than zero")
    return total


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return "".join(parts)


def parse_deadline(text: str, now: datetime) -> datetime:
    """An ISO 8601 time; without an offset it is read in the local time zone. Returned in
    UTC. A deadline not after ``now`` is refused."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SpecError(
            f"invalid deadline {text!r}: use ISO 8601, e.g. 2026-11-23T08:00 or "
            "2026-11-23T08:00+01:00"
        ) from None
    if value.tzinfo is None:
        value = value.astimezone()  # local wall-clock time as the user typed it
    value = value.astimezone(UTC)
    if value <= now:
        raise SpecError(f"deadline {text!r} is in the past")
    return value


def within_to_deadline(text: str, now: datetime) -> datetime:
    return now + timedelta(seconds=parse_duration_s(text))


def utc_now() -> datetime:
    return datetime.now(UTC)
