"""A synthetic signal, so what-if runs and demos work on a machine with no data files:
``synthetic:mean=300&days=28&start=2023-01-02&seed=1``.

Around ``mean`` (g/kWh, or EUR/MWh with ``quantity=price``): a daily solar dip
(``solar``, the relative depth at 13:00 UTC, zero at night), a weekly pattern (``weekly``:
weekends that much lower, weekdays higher, zero over a week), and seeded AR(1) noise
(``noise``: its standard deviation relative to the mean, with hour-to-hour persistence as
weather has). ``step`` is the resolution (default 1h). The values never fall below 5 % of
the mean. The same options and seed always give the same signal. ``replay=now``: the
signal's whole weeks repeated over all time, lined up by weekday and time of day (a live
source for a daemon or a demo, at any date; ``grid.replay``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from grid.errors import SourceSpecError
from grid.replay import replay_mode
from grid.resample import MAX_POINTS
from grid.signal import PRICE, Signal
from grid.sources.base import FileSource

DEFAULTS = {
    "mean": "300",
    "days": "28",
    "start": "2023-01-02",  # a Monday
    "seed": "0",
    "step": "1h",
    "solar": "0.35",
    "weekly": "0.1",
    "noise": "0.08",
    "quantity": "carbon",
    "replay": "off",
}
PERSISTENCE = 0.9  # AR(1) correlation from one hour to the next


class Synthetic(FileSource):
    name = "synthetic"

    def __init__(self, spec: str, options: dict[str, str]) -> None:
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise SourceSpecError(
                f"synthetic: unknown option(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(DEFAULTS)}"
            )
        opts = {**DEFAULTS, **options}
        self.mean = _number(opts, "mean", low=0.0, open_low=True, high=1e6)
        self.days = _number(opts, "days", low=0.0, open_low=True, high=3650.0)
        self.solar = _number(opts, "solar", low=0.0, high=1.0)
        self.weekly = _number(opts, "weekly", low=0.0, high=1.0)
        self.noise = _number(opts, "noise", low=0.0, high=2.0)
        self.seed = int(_number(opts, "seed", low=0, high=2.0**63))
        self.step_s = _step_s(opts["step"])
        points = self.days * 86400 / self.step_s
        if points > MAX_POINTS:
            raise SourceSpecError(
                f"synthetic: {self.days:g} days of {self.step_s:g} s steps make {points:,.0f} "
                f"points, more than {MAX_POINTS:,}: give fewer days or a longer step"
            )
        try:
            start = datetime.fromisoformat(opts["start"])
        except ValueError:
            raise SourceSpecError(f"synthetic: invalid start {opts['start']!r}") from None
        self.start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        if opts["quantity"] == "price":
            self.quantity, self.unit, self.currency, self.kind = PRICE, "EUR/MWh", "EUR", None
        elif opts["quantity"] != "carbon":
            raise SourceSpecError("synthetic: quantity must be carbon or price")
        super().__init__(spec, zone="synthetic")
        self.resolution_s = self.step_s
        self.replay = replay_mode(opts, "synthetic")
        self._signal: Signal | None = None

    def load(self) -> Signal:
        if self._signal is None:
            n = max(1, int(self.days * 86400 // self.step_s))
            times = [self.start + timedelta(seconds=i * self.step_s) for i in range(n)]
            values = self.values(np.arange(n) * self.step_s + self.start.timestamp())
            self._signal = self.signal(list(zip(times, values.tolist(), [False] * n, strict=True)))
        return self._signal

    def values(self, t_s: np.ndarray) -> np.ndarray:
        hours = (t_s % 86400) / 3600
        sun = np.clip(np.sin(np.pi * (hours - 7) / 12), 0, None)  # 07:00-19:00, top at 13:00
        weekday = ((t_s // 86400).astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday
        week = np.where(weekday >= 5, -self.weekly, self.weekly * 2 / 5)
        rng = np.random.default_rng(self.seed)
        shocks = rng.normal(0.0, 1.0, len(t_s))
        rho = PERSISTENCE ** (self.step_s / 3600)
        ar = np.empty(len(t_s))
        level = shocks[0] if len(t_s) else 0.0
        for i, shock in enumerate(shocks):  # seconds for a year of hours
            level = rho * level + np.sqrt(1 - rho**2) * shock if i else level
            ar[i] = level
        shape = 1 - self.solar * (sun - 1 / np.pi) + week + self.noise * ar
        return self.mean * np.maximum(shape, 0.05)


def _number(
    opts: dict[str, str],
    key: str,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
) -> float:
    try:
        value = float(opts[key])
    except ValueError:
        raise SourceSpecError(f"synthetic: {key} must be a number, not {opts[key]!r}") from None
    if (
        (low is not None and (value < low or (open_low and value == low)))
        or (high is not None and value > high)
        or not np.isfinite(value)
    ):
        bounds = f"{'above' if open_low else 'at least'} {low:g}" if low is not None else ""
        if high is not None:
            bounds += f"{' and ' if bounds else ''}at most {high:g}"
        raise SourceSpecError(f"synthetic: {key} must be {bounds}, not {opts[key]!r}")
    return value


def _step_s(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        seconds = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except (ValueError, KeyError):
        seconds = 0
    if seconds < 60 or 86400 % seconds:
        raise SourceSpecError(
            f"synthetic: step must divide a day and be at least 1m (e.g. 15m, 1h), not {text!r}"
        )
    return seconds
