"""CSV traces: ``csv:PATH[?column=...&time=...&quantity=...&unit=...&zone=...]``.

Recognised as downloaded:
- Electricity Maps exports (``Datetime (UTC)``, ``Carbon Intensity gCO₂eq/kWh (LCA)`` and
  ``(direct)``): the lifecycle column by default, ``?basis=direct`` for the direct one;
- standardised day-ahead prices (``Datetime (UTC),Datetime (Local),Price (USD/MWh)``);
- ``Time,Carbon Intensity`` (naive UTC timestamps, as in the Let's Wait Awhile study).
Any other CSV: ``time=`` names the timestamp column (default: the first), ``column=`` the
value column (default: the only numeric one), ``quantity=carbon|price``, ``unit=``,
``tz=`` for naive timestamps that are not UTC. Rows are regularised by ``grid.resample``.
History and forecast both read the file: a trace is what happened. ``replay=now`` replays
the trace live: shifted by whole weeks to line up with now, and looped (``grid.replay``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from grid.errors import SourceSpecError
from grid.replay import replay_mode
from grid.signal import PRICE, Signal
from grid.sources.base import MAX_VALUE, FileSource

EM_TIME = "Datetime (UTC)"
EM_LCA = "Carbon Intensity gCO₂eq/kWh (LCA)"
EM_DIRECT = "Carbon Intensity gCO₂eq/kWh (direct)"
_PRICE = re.compile(r"^Price \((\w+)/MWh\)$")


class CsvTrace(FileSource):
    name = "csv"

    def __init__(self, spec: str, path: str, options: dict[str, str]) -> None:
        self.path = Path(path).expanduser()
        self.options = dict(options)
        unknown = set(options) - {
            "column",
            "time",
            "quantity",
            "unit",
            "zone",
            "tz",
            "basis",
            "kind",
            "resolution",
            "replay",
        }
        if unknown:
            raise SourceSpecError(f"csv: unknown option(s) {', '.join(sorted(unknown))}")
        self.replay = replay_mode(options, "csv")
        super().__init__(spec, zone=options.get("zone", self.path.stem))
        self._signal: Signal | None = None
        self._mtime_ns: int | None = None

    def load(self) -> Signal:
        """The file's signal, read again when the file changed (a live daemon may follow
        a trace that something appends to)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            mtime = None
        if self._signal is None or mtime != self._mtime_ns:
            self._signal = self._read()
            self._mtime_ns = mtime
        return self._signal

    def _read(self) -> Signal:
        import pandas as pd

        try:
            frame = pd.read_csv(self.path)
        except FileNotFoundError:
            raise SourceSpecError(f"csv: no such file {str(self.path)!r}") from None
        except (
            OSError,
            UnicodeDecodeError,
            pd.errors.ParserError,
            pd.errors.EmptyDataError,
        ) as exc:
            raise SourceSpecError(
                f"csv: cannot read {str(self.path)!r}: {str(exc).splitlines()[0]}"
            ) from None
        time_col, value_col = self._columns(frame)
        try:
            with warnings.catch_warnings():  # numbers beyond any date: pandas only warns
                warnings.simplefilter("error", RuntimeWarning)
                times = pd.to_datetime(frame[time_col], utc=False, format="mixed")
            if times.isna().any():
                raise ValueError(time_col)
        except (ValueError, TypeError, OverflowError, RuntimeWarning):
            raise SourceSpecError(
                f"csv: column {time_col!r} does not hold timestamps (ISO 8601, 1900 to 2200)"
            ) from None
        if times.dt.tz is None:
            zone = _zone(self.options.get("tz", "UTC"))
            try:
                times = times.dt.tz_localize(zone, ambiguous="infer", nonexistent="shift_forward")
            except (ValueError, OverflowError) as exc:
                raise SourceSpecError(
                    f"csv: cannot read the times in {zone}: {str(exc).splitlines()[0]}"
                ) from None
        values = self._values(frame[value_col], value_col)
        if "resolution" in self.options:
            self.resolution_s = _resolution_s(self.options["resolution"])
        rows = list(
            zip(times.dt.tz_convert("UTC"), values.tolist(), [False] * len(values), strict=True)
        )
        return self.signal(rows)

    def _values(self, column, name: str):
        """The column's numbers. An empty cell is a value not known (NaN); anything else
        must be a finite number, and a carbon intensity is not negative."""
        import numpy as np
        import pandas as pd

        values = pd.to_numeric(column, errors="coerce")
        given = column.notna() & (column.astype(str).str.strip() != "")
        bad = np.flatnonzero(given & values.isna())
        if len(bad):
            raise SourceSpecError(
                f"csv: row {int(bad[0]) + 2}: {_shown(column.iloc[bad[0]])} in column "
                f"{name!r} is not a number"
            )
        if values.notna().sum() == 0:
            raise SourceSpecError(f"csv: column {name!r} has no numbers")
        numbers = values.to_numpy(dtype=float)
        low = 0.0 if self.quantity != PRICE else -MAX_VALUE
        wrong = np.flatnonzero(~np.isnan(numbers) & ~((numbers >= low) & (numbers <= MAX_VALUE)))
        if len(wrong):
            what = "a price" if self.quantity == PRICE else "a carbon intensity"
            allowed = f"-{MAX_VALUE:g} to {MAX_VALUE:g}" if low else f"0 to {MAX_VALUE:g}"
            value = float(numbers[wrong[0]])
            raise SourceSpecError(
                f"csv: row {int(wrong[0]) + 2}: {value!r} in column {name!r} is not "
                f"{what} ({allowed} {self.unit})"
            )
        return values

    def _columns(self, frame) -> tuple[str, str]:
        cols = list(frame.columns)
        opts = self.options
        if EM_TIME in cols and EM_LCA in cols and "column" not in opts:
            basis = opts.get("basis", "lifecycle")
            if basis not in ("lifecycle", "direct"):
                raise SourceSpecError("csv: basis must be lifecycle or direct")
            self.basis = basis
            if "Zone Id" in cols and "zone" not in opts and len(frame):
                self.zone = str(frame["Zone Id"].iloc[0])
            return EM_TIME, EM_LCA if basis == "lifecycle" else EM_DIRECT
        price_cols = [c for c in cols if _PRICE.match(c)]
        if EM_TIME in cols and price_cols and "column" not in opts:
            self._as_price(_PRICE.match(price_cols[0]).group(1))
            return EM_TIME, price_cols[0]
        time_col = opts.get("time", cols[0])
        if time_col not in cols:
            raise SourceSpecError(f"csv: no column {time_col!r}; columns: {', '.join(cols)}")
        if "column" in opts:
            if opts["column"] not in cols:
                raise SourceSpecError(
                    f"csv: no column {opts['column']!r}; columns: {', '.join(cols)}"
                )
            value_col = opts["column"]
        else:
            import pandas as pd

            numeric = [
                c
                for c in cols
                if c != time_col and pd.to_numeric(frame[c], errors="coerce").notna().any()
            ]
            if not numeric:
                raise SourceSpecError(f"csv: {self.path.name} has no numeric column")
            if len(numeric) > 1:
                raise SourceSpecError(
                    f"csv: several numeric columns ({', '.join(numeric)}); "
                    "choose one with ?column=NAME"
                )
            value_col = numeric[0]
        if opts.get("quantity", "carbon") == "price":
            self._as_price(opts.get("unit", "EUR/MWh").split("/")[0])
        elif opts.get("quantity", "carbon") != "carbon":
            raise SourceSpecError("csv: quantity must be carbon or price")
        self.unit = opts.get("unit", self.unit)
        self.kind = opts.get("kind", self.kind)
        return time_col, value_col

    def _as_price(self, currency: str) -> None:
        self.quantity, self.currency = PRICE, currency
        self.unit, self.kind, self.basis = f"{currency}/MWh", None, None


def _resolution_s(text: str) -> int:
    match = re.fullmatch(r"([0-9]{1,9})([smh]?)", text.strip())
    seconds = (
        int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)] if match else 0
    )
    if not 1 <= seconds <= 86400:
        raise SourceSpecError(
            f"csv: invalid resolution {_shown(text)}; use e.g. 30m, 1h, 900 (1s to 24h)"
        )
    return seconds


def _zone(name: str) -> str:
    """An IANA time zone name that zoneinfo knows; SourceSpecError otherwise."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        if not name or len(name) > 255 or "\x00" in name:
            raise ValueError(name)
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError, IndexError):
        raise SourceSpecError(
            f"csv: unknown time zone {_shown(name)} (e.g. UTC, Europe/Berlin)"
        ) from None
    return name


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
