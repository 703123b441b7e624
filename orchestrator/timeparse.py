"""Durations (``2h30m``) and deadlines (ISO 8601) as people type them. UTC inside."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from orchestrator.errors import SpecError

_UNITS_S = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])", re.ASCII)
#: The longest duration, window or ``within`` gridshift takes, and the farthest deadline:
#: one year. Beyond it a plan is meaningless and its horizon would not fit in memory.
MAX_DURATION_S = 365 * 86400.0
MAX_DURATION_TEXT = "one year (365d)"
#: A deadline given as a date may lie further out (a "some time this decade" date), but
#: not without bound: ten years.
MAX_DEADLINE_S = 10 * 365 * 86400.0
#: The largest checkpoint cost, per job or the lab's: one day.
MAX_CHECKPOINT_S = 86400.0
MAX_CHECKPOINT_TEXT = "one day (1d)"


def parse_duration_s(text: str) -> float:
    """Seconds in a duration such as ``45s``, ``90m``, ``2h30m``, ``1.5h``, ``1d12h``, ``1w``.
    A unit is required on every number; the total is more than zero and at most
    ``MAX_DURATION_S`` (one year)."""
    return check_seconds(total_duration_s(text), text)


def total_duration_s(text: str, what: str = "duration") -> float:
    """The seconds ``text`` adds up to, unchecked (zero or over a year pass: callers that
    take such values say so themselves); a SpecError if it is not a duration."""
    if not isinstance(text, str):
        raise SpecError(f"invalid {what} {text!r}: use e.g. 45s, 90m, 2h30m, 1.5h or 1d")
    cleaned = text.strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for match in _PART.finditer(cleaned):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if not cleaned or pos != len(cleaned):
        raise SpecError(f"invalid {what} {text!r}: use e.g. 45s, 90m, 2h30m, 1.5h or 1d")
    return total


def parse_checkpoint_s(value: str | float) -> float:
    """A checkpoint cost (the run time a suspension and restart cost a job): a duration
    as text (``10m``; ``0`` or ``0s``: free) or a number of seconds, from zero to
    ``MAX_CHECKPOINT_S`` (one day; a larger cost would silently stop all splitting)."""
    given = value
    if isinstance(value, str):
        value = 0.0 if value.strip() == "0" else total_duration_s(value, "checkpoint cost")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"invalid checkpoint cost {_shown(given)}: use e.g. 5m, 90s or 0")
    if not math.isfinite(value) or not 0 <= value <= MAX_CHECKPOINT_S:
        raise SpecError(
            f"invalid checkpoint cost {_shown(given)}: it must be 0 to {MAX_CHECKPOINT_TEXT}"
        )
    return float(value)


def check_seconds(seconds: float, given: object = None) -> float:
    """``seconds`` if it is a finite duration longer than zero and at most one year."""
    shown = _shown(seconds if given is None else given)
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise SpecError(f"invalid duration {shown}: it must be at most {MAX_DURATION_TEXT}")
    if seconds <= 0:
        raise SpecError(f"invalid duration {shown}: it must be longer than zero")
    return float(seconds)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    UTC. A deadline not after ``now``, or more than ten years after it, is refused."""
    shown = _shown(text)
    try:
        value = datetime.fromisoformat(text.strip())
        value = _localised(value).astimezone(UTC)
    except (ValueError, OverflowError, AttributeError, TypeError):
        raise SpecError(
            f"invalid deadline {shown}: use ISO 8601, e.g. 2026-11-23T08:00 or "
            "2026-11-23T08:00+01:00"
        ) from None
    if value <= now:
        raise SpecError(f"deadline {shown} is in the past")
    if (value - now).total_seconds() > MAX_DEADLINE_S:
        raise SpecError(f"deadline {shown} is too far away: at most ten years from now")
    return value


def parse_time(text: str, what: str = "time") -> datetime:
    """A time as people type it (ISO 8601: ``2026-11-24``, ``2026-11-24T08:00``,
    ``2026-11-24 08:00+01:00``, ``...Z``), in UTC. Without an offset it is read in the
    local time zone (``TZ``), as every time gridshift takes from a person is."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        return _localised(value).astimezone(UTC)
    except (ValueError, OverflowError, AttributeError, TypeError):
        raise SpecError(
            f"invalid {what} {_shown(text)}: use ISO 8601, e.g. 2026-11-23T08:00 (local) or "
            "2026-11-23T08:00+01:00"
        ) from None


def _localised(value: datetime) -> datetime:
    """``value`` with the local zone (``local_zone``) when it has none: the wall-clock time
    as the user typed it, with zoneinfo's (PEP 495, fold=0) reading of a time the clock
    skips (as if it had not changed: 02:30 on a spring-forward night is 03:30 summer time)
    or repeats (its first occurrence). A ``TZ`` naming no zone is one SpecError."""
    return value if value.tzinfo is not None else value.replace(tzinfo=local_zone())


def aware_text(text: str | None, what: str = "time") -> str | None:
    """A time typed by the user, as ISO 8601 with its UTC offset, to hand to the daemon
    (whose zone may not be the user's): naive text is read here, in the user's zone.
    Text that is no time goes as it is, for the daemon's own one-line error; a ``TZ``
    naming no zone is this caller's one line."""
    if text is not None:
        local_zone()
    try:
        return None if text is None else parse_time(text, what).isoformat()
    except SpecError:
        return text


#: ``GRIDSHIFT_UTC=1`` or ``gridshift --utc``: every time printed in UTC.
_UTC_FORCED = False


def show_utc(flag: bool) -> None:
    global _UTC_FORCED
    _UTC_FORCED = flag


def utc_shown() -> bool:
    from orchestrator.api.environ import env_flag

    return _UTC_FORCED or env_flag("GRIDSHIFT_UTC")


def format_time(value: datetime | str | None, *, seconds: bool = False) -> str:
    """A time for people, with its zone: ``2026-11-24 07:40 CET`` in the local zone (a
    zone without an abbreviation: its offset, ``2026-11-24 07:40 +05:30``), or in UTC
    with ``--utc`` (``2026-11-24 06:40 UTC``). ISO text is read first (naive: UTC, as
    stored); None or empty: ``-``."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # UTC inside
    shape = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    shown, zone = shown_time(value)
    return f"{shown:{shape}} {zone}"


def shown_time(value: datetime) -> tuple[datetime, str]:
    """An aware time as it is shown (local, or UTC with ``--utc``) and its zone's label:
    the abbreviation (``CET``), else the offset (``+05:30``)."""
    if utc_shown():
        return value.astimezone(UTC), "UTC"
    zone = local_zone()
    try:
        local = value.astimezone(zone)
    except (OverflowError, OSError, ValueError):  # beyond the platform's clock
        return value.astimezone(UTC), "UTC"
    zone = local.tzname() or ""
    if not zone.isalpha():  # "+0530", "-03", "": no abbreviation; the offset then
        offset = local.strftime("%z")
        zone = f"{offset[:3]}:{offset[3:]}" if offset else "UTC"
    return local, zone


def within_to_deadline(text: str, now: datetime) -> datetime:
    return now + timedelta(seconds=parse_duration_s(text))


_ZONES: dict[str | None, object] = {}


def local_zone():
    """This machine's time zone (``TZ``, else the system's) as a ZoneInfo; one SpecError
    when ``TZ`` names no zone. The one source of the local zone: naive input, printed
    times, cron and plots all read it."""
    import os

    tz = os.environ.get("TZ")
    if tz in _ZONES:  # keyed by TZ: a change of TZ is read afresh
        return _ZONES[tz]
    import tzlocal

    try:  # tzlocal's own cache would outlive a change of TZ
        _ZONES[tz] = zone = tzlocal.reload_localzone()
        return zone
    except Exception as exc:  # tzlocal raises zoneinfo's, ValueError and its own errors
        zone = os.environ.get("TZ", "the system's")
        raise SpecError(
            f"unknown local time zone {_shown(zone)} (TZ): set TZ to a zone such as "
            f"Europe/Berlin or UTC ({type(exc).__name__})"
        ) from None


def zone_info(name: str):
    """The ZoneInfo of an IANA name; one SpecError for anything else."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        if not isinstance(name, str) or not name or "\x00" in name or len(name) > 255:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError, IndexError):
        raise SpecError(f"unknown time zone {_shown(name)} (e.g. UTC, Europe/Berlin)") from None


def utc_now() -> datetime:
    return datetime.now(UTC)


# -- power, as people type it (one parser for every option and setting) ------------------
_POWER_UNITS_W = {"": 1.0, "w": 1.0, "kw": 1e3, "mw": 1e6, "gw": 1e9}
_POWER = re.compile(r"(\d+(?:\.\d+)?)([kmg]?w)?", re.ASCII | re.IGNORECASE)
#: The largest site power limit taken: 1 GW (a larger one is a typo, not a site).
MAX_POWER_W = 1e9


def parse_power_w(value: str | float) -> float:
    """Watts in a power such as ``15kW``, ``15 kW``, ``800W``, ``1.5MW``, ``1GW`` or a
    number of watts (``15000``). Units are case-insensitive but for the M: a lowercase
    ``m`` is milli (``1.5mW``), which no site is capped in, so it is refused rather than
    read as mega; the power is more than zero and at most ``MAX_POWER_W`` (1 GW)."""
    shown = _shown(value)
    usage = "use e.g. 15kW, 800W or 1.5MW"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"invalid power {shown}: {usage}")
    if isinstance(value, str):
        match = _POWER.fullmatch(value.strip().replace(" ", ""))
        if match is None:
            raise SpecError(f"invalid power {shown}: {usage}")
        unit = match.group(2) or ""
        if unit.startswith("m"):
            raise SpecError(f"invalid power {shown}: m is milli; write MW for megawatts")
        value = float(match.group(1)) * _POWER_UNITS_W[unit.lower()]
    if not math.isfinite(value) or not 0 < value <= MAX_POWER_W:
        raise SpecError(f"invalid power {shown}: it must be more than 0 W and at most 1 GW")
    return float(value)
