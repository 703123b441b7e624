"""A cron expression's occurrences, as instants in UTC, kept the way cron keeps time.

The expression is read as crontab reads it: five fields (minute hour day month weekday),
or six with seconds first; weekday 0 and 7 are Sunday; when both the day of the month and
the weekday are restricted, a day matching either one matches (Vixie cron's rule). APScheduler
parses the fields and finds the next matching wall-clock time; this module turns wall-clock
times into instants in the template's time zone.

Occurrences are instants, iterated in UTC with a strictly increasing cursor: each one is
found strictly after the last, so none can repeat. Across daylight-saving transitions the
rule is Vixie cron's (and cronie's). An expression whose minute and hour fields both name
fixed values (``30 2 * * *``) is a *fixed-time* job; one whose minute or hour field starts
with ``*`` (``*/30 * * * *``, ``0 * * * *``) is a *wildcard* job.

- Spring forward (a wall-clock hour is skipped): a fixed-time occurrence inside the skipped
  hour runs once, at the transition (a daily job still runs that day, an hour "early" by the
  clock, as in cron). A wildcard job's times in the skipped hour do not exist and are
  skipped: it runs on as the new times pass (``*/30`` fires at 01:30, then 03:00).
- Fall back (a wall-clock hour happens twice): a fixed-time job runs once, at the first
  occurrence of its time; a wildcard job runs as times pass, once per distinct instant
  (``*/30`` fires at 02:00 and 02:30 summer time, then at 02:00 and 02:30 winter time, an
  hour apart each; an hourly job keeps firing every hour).

An expression that never fires (``0 0 31 2 *``) is refused: it must fire within
``HORIZON_YEARS``. Transitions are found by probing the zone's offset a day apart (tz data
has no two transitions within one day since the 1940s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache

from orchestrator.errors import SpecError

HORIZON_YEARS = 50  # an expression must fire within this many years to be accepted
_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_MAX_STEPS = 100_000  # segments and folded times looked at per search, at most
_DOW = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NUMERIC_DOW = re.compile(r"^(\*|\d+(?:-\d+)?)(?:/(\d+))?$")


@dataclass(frozen=True)
class Schedule:
    """The occurrences of one expression in one time zone."""

    expr: str
    zone: tzinfo
    fixed: bool  # a fixed-time job (minute and hour fixed), else a wildcard job
    matchers: tuple  # APScheduler cron triggers in UTC, used for naive wall-clock times

    def next_after(self, since: datetime) -> datetime | None:
        """The first occurrence strictly after ``since`` (in UTC), or None if none."""
        u = since.astimezone(UTC)
        wall_from = _wall(u, self.zone)
        for _ in range(_MAX_STEPS):
            off = _offset(u, self.zone)
            wall = self._match_after(wall_from)
            if wall is None:
                return None
            candidate = (wall - off).replace(tzinfo=UTC)
            change = _transition(u, candidate, off, self.zone)
            if change is None:
                if self.fixed and _second_of_fold(wall, candidate, self.zone):
                    u, wall_from = candidate, wall  # the time happened already: once
                    continue
                return candidate
            new_off = _offset(change, self.zone)
            if self.fixed and new_off > off and wall < _wall(change, self.zone):
                return change  # a fixed time inside the skipped hour: at the transition
            u, wall_from = change, _wall(change, self.zone) - _US
        return None

    def latest_in(self, since: datetime, until: datetime) -> datetime | None:
        """The last occurrence in (since, until], found in a bounded number of steps
        (a binary search over the instants; occurrences fall on whole seconds)."""
        first = self.next_after(since)
        if first is None or first > until:
            return None
        lo, hi = first, until.astimezone(UTC)  # next_after(lo) <= until < next_after(hi)
        after = self.next_after(lo)
        if after is None or after > hi:
            return first
        while hi - lo > timedelta(seconds=1):
            mid = lo + (hi - lo) / 2
            nxt = self.next_after(mid)
            if nxt is not None and nxt <= until:
                lo = mid
            else:
                hi = mid
        return self.next_after(lo)

    def count_in(self, since: datetime, until: datetime, cap: int) -> int:
        """How many occurrences lie in (since, until], counting to ``cap`` at most."""
        n, t = 0, since
        while n < cap:
            t = self.next_after(t)
            if t is None or t > until:
                break
            n += 1
        return n

    def _match_after(self, wall: datetime) -> datetime | None:
        """The first naive wall-clock time strictly after ``wall`` that matches."""
        start = (wall + _US).replace(tzinfo=UTC)
        found = [m.get_next_fire_time(None, start) for m in self.matchers]
        found = [f for f in found if f is not None]
        return min(found).replace(tzinfo=None) if found else None


def parse(expr: str, zone: tzinfo | None = None) -> Schedule:
    """The schedule of ``expr`` in ``zone`` (this machine's by default); one SpecError if
    the expression is not valid or never fires."""
    if not isinstance(expr, str):
        raise SpecError(f"invalid cron expression {expr!r}: not text")
    if zone is None:
        zone = local_zone()
    made = _parse(" ".join(expr.split()), zone)
    if isinstance(made, str):
        raise SpecError(made)
    return made


def local_zone() -> tzinfo:
    from orchestrator.timeparse import local_zone as machine_zone

    return machine_zone()


@lru_cache(maxsize=256)
def _parse(expr: str, zone: tzinfo) -> Schedule | str:
    """A Schedule, or the one-line reason there is none (cached: the daemon reads every
    template at every pass)."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6:
        return (
            f"invalid cron expression {expr!r}: give 5 fields (minute hour day month weekday), "
            "or 6 with seconds first"
        )
    if "\x00" in expr:
        return "invalid cron expression: it holds a NUL byte"
    second, minute, hour, day, month, dow = fields
    try:
        weekdays = _weekdays(dow)
        base = {"second": second, "minute": minute, "hour": hour, "month": month}
        if day.startswith("*") or dow.startswith("*"):
            kinds = [{"day": day, "day_of_week": weekdays}]
        else:  # both restricted: either matches (crontab's rule)
            kinds = [{"day": day, "day_of_week": "*"}, {"day": "*", "day_of_week": weekdays}]
        matchers = tuple(CronTrigger(**base, **k, timezone=UTC) for k in kinds)
        now = datetime.now(UTC)
        end = now + timedelta(days=365.25 * HORIZON_YEARS)
        probes = [CronTrigger(**base, **k, timezone=UTC, end_date=end) for k in kinds]
    except (ValueError, TypeError) as exc:
        return f"invalid cron expression {expr!r}: {exc}"
    if all(p.get_next_fire_time(None, now) is None for p in probes):
        return f"cron expression {expr!r} never fires (no such date)"
    fixed = not (minute.startswith("*") or hour.startswith("*"))
    return Schedule(expr, zone, fixed, matchers)


def _weekdays(field: str) -> str:
    """A crontab weekday field (0 or 7 is Sunday) as APScheduler reads it (0 is Monday):
    numbers become day names; names and ``*`` are the same in both."""
    out = []
    for part in field.split(","):
        match = _NUMERIC_DOW.match(part)
        if match is None or part == "*":
            out.append(part)
            continue
        span, step = match.group(1), int(match.group(2) or 1)
        if span == "*":
            first, last = 0, 6
        else:
            first, _, rest = span.partition("-")
            first = int(first)
            last = int(rest) if rest else (6 if match.group(2) else first)
        if not (0 <= first <= 7 and 0 <= last <= 7) or first > last or step < 1:
            raise ValueError(f"invalid weekday {part!r} (0-7, 0 and 7 are Sunday)")
        out.extend(_DOW[d % 7] for d in range(first, last + 1, step))
    return ",".join(dict.fromkeys(out))


def _wall(u: datetime, zone: tzinfo) -> datetime:
    return u.astimezone(zone).replace(tzinfo=None)


def _offset(u: datetime, zone: tzinfo) -> timedelta:
    return u.astimezone(zone).utcoffset()


def _transition(u: datetime, until: datetime, off: timedelta, zone: tzinfo) -> datetime | None:
    """The first instant in (u, until] whose offset is not ``off``, or None."""
    a = u
    while a < until:
        b = min(a + _DAY, until)
        if _offset(b, zone) != off:
            lo, hi = int(a.timestamp()), int(b.timestamp())  # tz changes: whole seconds
            if hi != b.timestamp():
                hi += 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(datetime.fromtimestamp(mid, UTC), zone) == off:
                    lo = mid
                else:
                    hi = mid
            return datetime.fromtimestamp(hi, UTC)
        a = b
    return None


def _second_of_fold(wall: datetime, at: datetime, zone: tzinfo) -> bool:
    """Whether ``at`` is the second instant of a wall-clock time that happens twice."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return first < second and at == second
