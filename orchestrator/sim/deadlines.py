"""Deadline rules of a what-if scenario: how much flexibility each traced job gets.

Each rule maps a job's submission and run time to the time it must have finished. The
*original finish* is submission + run time (running at once). Clock times are read in the
scenario's time zone (default UTC).

- ``none``: no deadline; policies defer such a job at most their maximum (24 h).
- ``within:DURATION``: the original finish plus ``DURATION`` (``within:24h``: a job may
  finish up to a day later than if it had started at once).
- ``next-workday`` (``next-workday:09:00-17:00``): a finish inside working hours on a
  workday stays; one after closing time, before opening time or on a weekend moves to the
  next opening time on a workday (Friday evening → Monday 09:00).
- ``semi-weekly`` (``semi-weekly:mon,thu``): the first of those weekdays' opening time
  (09:00) at or after the original finish.
"""

from __future__ import annotations

import re

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.timeparse import parse_duration_s

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOURS = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
RULES = "none, within:24h, next-workday[:09:00-17:00] or semi-weekly[:mon,thu]"


class DeadlineRule:
    def __init__(self, text: str) -> None:
        self.text = text.strip().lower()
        name, _, arg = self.text.partition(":")
        self.name = name
        self.open_s, self.close_s = 9 * 3600, 17 * 3600
        self.slack_s = 0.0
        self.weekdays = (0, 3)
        if name == "none" and not arg:
            return
        if name == "within":
            self.slack_s = parse_duration_s(arg) if arg else -1.0
            if self.slack_s <= 0:
                raise SpecError(f"deadline rule {text!r}: give the slack, e.g. within:24h")
        elif name == "next-workday":
            if arg:
                m = _HOURS.match(arg)
                if not m:
                    raise SpecError(f"deadline rule {text!r}: hours like 09:00-17:00")
                h0, m0, h1, m1 = (int(g) for g in m.groups())
                self.open_s, self.close_s = h0 * 3600 + m0 * 60, h1 * 3600 + m1 * 60
                if not 0 <= self.open_s < self.close_s <= 86400 or m0 > 59 or m1 > 59:
                    raise SpecError(f"deadline rule {text!r}: hours like 09:00-17:00")
        elif name == "semi-weekly":
            if arg:
                days = [d.strip()[:3] for d in arg.split(",")]
                if not days or any(d not in DAYS for d in days):
                    raise SpecError(f"deadline rule {text!r}: weekdays like mon,thu")
                self.weekdays = tuple(sorted({DAYS.index(d) for d in days}))
        else:
            raise SpecError(f"unknown deadline rule {text!r}; use {RULES}")

    def deadlines(self, submit_s: np.ndarray, run_s: np.ndarray, tz: str = "UTC") -> np.ndarray:
        """Deadlines (epoch seconds; NaN for ``none``) for arrays of jobs."""
        finish = np.asarray(submit_s, dtype=float) + np.asarray(run_s, dtype=float)
        if self.name == "none":
            return np.full(len(finish), np.nan)
        if self.name == "within":
            return finish + self.slack_s
        import pandas as pd

        local = pd.to_datetime(finish, unit="s", utc=True).tz_convert(tz)
        dow = np.asarray(local.day_of_week)
        midnight = local.normalize().tz_localize(None)
        second = (local.tz_localize(None) - midnight).total_seconds().to_numpy()
        if self.name == "next-workday":
            days = np.zeros(len(finish), dtype=np.int64)
            keep = (dow < 5) & (second >= self.open_s) & (second <= self.close_s)
            days[(dow < 5) & (second > self.close_s)] = 1
            days[dow == 4] = np.where(second[dow == 4] > self.close_s, 3, 0)
            days[dow == 5], days[dow == 6] = 2, 1
        else:
            options = []
            for w in self.weekdays:
                ahead = (w - dow) % 7
                ahead = np.where((ahead == 0) & (second > self.open_s), 7, ahead)
                options.append(ahead)
            days = np.min(options, axis=0)
            keep = np.zeros(len(finish), dtype=bool)
        target = (midnight + pd.to_timedelta(days, unit="D")) + pd.Timedelta(seconds=self.open_s)
        target = target.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
        moved = target.as_unit("ns").asi8 / 1e9
        moved = np.where(pd.isna(target), finish, moved)
        return np.where(keep, finish, np.maximum(moved, finish))
