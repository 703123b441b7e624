"""A file cache of fetched signals, and the fallback that uses it.

One JSON file per source spec, kind (history or forecast) and UTC day: a fetch writes
each day of the range it asked for (at most ``MAX_DAYS_PER_PUT``, from the range's
start: a provider's point far outside the range makes no file), its values replacing the
file's at the times they cover (so the day keeps the rest), and the file's mtime is set
to that fetch's time. Each write prunes the files fetched more than ``KEEP_S`` (14 days)
ago, and the files of the older layout (one per fetched range), so the folder stays
bounded: sources × kinds × the days fetched in the last two weeks.

A chain answers history from the cache without a request when the cached days cover the
range, were fetched after it ended and hold no forecast value (history that is final).
When every source of a chain fails, the newest cached data from the range's start on
is served (as far as the cached days reach), marked with its age (``meta.stale_s``);
only the files of that source and those days are read.

The cache only helps: a write that fails (a full disk, a read-only folder) is logged once
per reason and the fetched signal used all the same, and a file that cannot be read back
(cut short, garbled, nested too deep) counts as not cached."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import asdict, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd

from grid.errors import GridDataError, SourceSpecError
from grid.signal import ResampleReport, Signal, SignalMeta
from grid.sources.base import GridSource

log = logging.getLogger(__name__)
KEEP_S = 14 * 86400.0
MAX_DAYS_PER_PUT = 60
OLD_LAYOUT = re.compile(r"^(history|forecast)-[0-9a-f]{24}\.json$")
#: what a provider's parser may raise on an answer of a shape nobody foresaw (nested too
#: deep for a recursive walk, too large to hold): that source's failure, not the daemon's
PARSE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError,
                RecursionError, MemoryError)  # fmt: skip


class SignalCache:
    def __init__(self, folder: Path, keep_s: float = KEEP_S) -> None:
        self.folder = folder
        self.keep_s = keep_s

    def _path(self, spec: str, what: str, day: date) -> Path:
        digest = hashlib.sha256(spec.encode()).hexdigest()[:16]
        return self.folder / f"{what}-{digest}-{day.isoformat()}.json"

    def put(
        self,
        signal: Signal,
        what: str,
        fetched_at: datetime,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> None:
        """Store ``signal`` (its part in ``[start, end)``) by UTC day, at most
        ``MAX_DAYS_PER_PUT`` days from its start, then prune what is too old. Raises
        ``OSError`` when the folder cannot be written."""
        frame = signal.between(start, end).frame
        if not len(frame):
            return
        first_day = frame.index[0].normalize()
        frame = frame[frame.index < first_day + pd.Timedelta(days=MAX_DAYS_PER_PUT)]
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = fetched_at.timestamp()
        for day, part in frame.groupby(frame.index.normalize()):
            path = self._path(signal.meta.source, what, day.date())
            old = _read(path)
            if old is not None and old.meta.resolution_s == signal.meta.resolution_s:
                kept = old.frame[~old.frame.index.isin(part.index)]
                part = pd.concat([kept, part]).sort_index()
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(_encode(Signal(part, signal.meta), what, fetched_at)))
            os.utime(tmp, (stamp, stamp))  # the mtime is the fetch's time, for pruning
            os.replace(tmp, path)
        self.prune(fetched_at)

    def prune(self, now: datetime) -> int:
        """Remove files fetched more than ``keep_s`` before ``now``, and the older
        layout's files. Returns how many went."""
        oldest = now.timestamp() - self.keep_s
        gone = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.folder) as entries:
            for entry in entries:
                name = entry.name
                if not (name.endswith(".json") or name.endswith(".tmp")):
                    continue
                try:
                    too_old = entry.stat().st_mtime < oldest
                except FileNotFoundError:
                    continue
                if too_old or OLD_LAYOUT.match(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        gone += 1
        return gone

    def from_start(
        self, spec: str, what: str, start: datetime, end: datetime
    ) -> tuple[Signal, datetime] | None:
        """The cached data of ``spec`` from ``start`` on, up to ``end`` or as far as the
        cached days reach without a gap, and when it was fetched (the oldest of the days
        used); None when the cache does not hold ``start``. Reads only the files of
        ``spec`` for the days in ``[start, end)``."""
        parts, fetched = [], []
        day = start.astimezone(UTC).date()
        last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
        while day <= last:
            hit = _read(self._path(spec, what, day), with_time=True)
            if hit is None:
                break
            signal, at = hit
            if parts and signal.meta.resolution_s != parts[0].meta.resolution_s:
                break
            parts.append(signal)
            fetched.append(at)
            day += timedelta(days=1)
        if not parts:
            return None
        res = parts[0].meta.resolution_s
        frame = pd.concat([p.frame for p in parts]).sort_index()
        steps = frame.index.to_series().diff().dt.total_seconds().iloc[1:]
        gaps = steps[steps != res]
        if len(gaps):  # up to the first gap
            frame = frame[frame.index < gaps.index[0]]
        signal = Signal(frame, parts[0].meta)
        if signal.start is None or signal.start > start or signal.end <= start:
            return None
        signal = signal.between(start, end)
        return (signal, min(fetched)) if len(signal.frame) else None

    def final_history(self, spec: str, start: datetime, end: datetime) -> Signal | None:
        """Cached history of the whole range, fetched after the range ended and without
        forecast values (the same range is fetched once); None otherwise."""
        hit = self.from_start(spec, "history", start, end)
        if hit is None:
            return None
        signal, fetched_at = hit
        whole = signal.end is not None and signal.end >= end
        if whole and fetched_at >= end and not signal.frame["forecast"].any():
            return signal
        return None


class CachedChain:
    """Sources tried in order; a success is cached. A source that fails (an outage, a
    refused key, a malformed answer) hands over to the next one; when all fail, the cache
    answers. Only a source that cannot be used as given (``SourceSpecError``: a bad
    file or option, a key not configured) raises, being the user's to mend."""

    def __init__(
        self, sources: list[GridSource], cache: SignalCache | None, clock=lambda: datetime.now(UTC)
    ) -> None:
        if not sources:
            raise SourceSpecError("no grid source given")
        self.sources = sources
        self.cache = cache
        self.clock = clock
        self.errors: list[str] = []  # why each source failed, in the last request
        self._unwritable: str | None = None  # why the cache could not be written, if logged

    @property
    def spec(self) -> str:
        return " > ".join(s.spec for s in self.sources)

    def history(self, start: datetime, end: datetime) -> Signal:
        return self._get("history", start, end, lambda s: s.history(start, end))

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        return self._get(
            "forecast", issued_at, issued_at + horizon, lambda s: s.forecast(issued_at, horizon)
        )

    def _get(self, what: str, start: datetime, end: datetime, fetch) -> Signal:
        errors: list[str] = []
        cacheable = [s for s in self.sources if s.name != "csv"]
        if self.cache is not None and what == "history":
            for source in cacheable:
                final = self.cache.final_history(source.spec, start, end)
                if final is not None:
                    self.errors = errors
                    return final
        for source in self.sources:
            try:
                signal = fetch(source)
            except SourceSpecError:
                raise
            except GridDataError as exc:
                errors.append(str(exc))
                continue
            except PARSE_ERRORS as exc:
                errors.append(f"{source.spec}: unusable answer ({type(exc).__name__})")
                continue
            if self.cache is not None and source in cacheable:
                self._store(signal, what, start, end)
            self.errors = errors
            return signal
        self.errors = errors
        if self.cache is not None:
            for source in cacheable:
                hit = self.cache.from_start(source.spec, what, start, end)
                if hit is not None:
                    age = (self.clock() - hit[1]).total_seconds()
                    return hit[0].with_meta(stale_s=age)
        raise GridDataError("; ".join(errors) + " (and nothing cached covers the range)")

    def _store(self, signal: Signal, what: str, start: datetime, end: datetime) -> None:
        """Cache a fetched signal; a write that fails is logged (once per reason), and
        the signal is used all the same."""
        try:
            self.cache.put(signal, what, self.clock(), start, end)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            if reason != self._unwritable:
                log.warning("grid cache %s cannot be written (%s); going on without it",
                            self.cache.folder, reason)  # fmt: skip
                self._unwritable = reason
        else:
            self._unwritable = None


def _read(path: Path, with_time: bool = False):
    """The signal stored at ``path`` (and when it was fetched), or None when there is
    none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
        signal = _decode(data)
        fetched = datetime.fromisoformat(data["fetched_at"])
        if fetched.tzinfo is None:
            raise ValueError("a naive time")
    except (OSError, LookupError, *PARSE_ERRORS):
        return None
    return (signal, fetched) if with_time else signal


def _encode(signal: Signal, what: str, fetched_at: datetime) -> dict:
    meta = asdict(signal.meta)
    meta["issued_at"] = signal.meta.issued_at.isoformat() if signal.meta.issued_at else None
    meta["stale_s"] = None
    frame = signal.frame
    return {
        "kind": what,
        "fetched_at": fetched_at.isoformat(),
        "meta": meta,
        "index": [int(t) for t in frame.index.as_unit("s").asi8],
        "values": [None if pd.isna(v) else float(v) for v in frame[signal.meta.quantity]],
        "forecast": [bool(v) for v in frame["forecast"]],
    }


def _decode(data: dict) -> Signal:
    meta = dict(data["meta"])
    meta["report"] = ResampleReport(**meta["report"])
    meta["issued_at"] = datetime.fromisoformat(meta["issued_at"]) if meta["issued_at"] else None
    meta = SignalMeta(**meta)
    if type(meta.resolution_s) is not int or meta.resolution_s <= 0:
        raise ValueError(f"resolution {meta.resolution_s!r}")
    index = pd.DatetimeIndex(pd.to_datetime(data["index"], unit="s", utc=True), name="start")
    frame = pd.DataFrame(
        {
            meta.quantity: pd.Series(data["values"], index=index, dtype=float),
            "forecast": pd.Series(data["forecast"], index=index, dtype=bool),
        }
    )
    return Signal(frame, replace(meta))
