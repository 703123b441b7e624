"""A file cache of fetched signals, and the fallback that uses it.

Each fetched range is one JSON file under the cache folder, keyed by source spec and
range, so the same range is fetched once. When every source of a chain fails, the newest
cached signal that covers the range is served, marked with its age (``meta.stale_s``)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

from grid.errors import GridDataError, SourceSpecError
from grid.signal import ResampleReport, Signal, SignalMeta
from grid.sources.base import GridSource


class SignalCache:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, spec: str, what: str, start: datetime, end: datetime) -> Path:
        key = f"{spec}|{what}|{start.isoformat()}|{end.isoformat()}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return self.folder / f"{what}-{digest}.json"

    def get(
        self, spec: str, what: str, start: datetime, end: datetime
    ) -> tuple[Signal, datetime] | None:
        path = self._path(spec, what, start, end)
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return _decode(data), datetime.fromisoformat(data["fetched_at"])

    def put(
        self, signal: Signal, what: str, start: datetime, end: datetime, fetched_at: datetime
    ) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(signal.meta.source, what, start, end)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_encode(signal, fetched_at)))
        os.replace(tmp, path)

    def newest_covering(
        self, spec: str, what: str, start: datetime, end: datetime
    ) -> tuple[Signal, datetime] | None:
        best = None
        for path in self.folder.glob(f"{what}-*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if data["meta"]["source"] != spec:
                continue
            signal = _decode(data)
            if signal.start and signal.start <= start and signal.end and signal.end >= end:
                fetched = datetime.fromisoformat(data["fetched_at"])
                if best is None or fetched > best[1]:
                    best = (signal.between(start, end), fetched)
        return best


class CachedChain:
    """Sources tried in order; a success is cached; when all fail, the cache answers."""

    def __init__(
        self, sources: list[GridSource], cache: SignalCache | None, clock=lambda: datetime.now(UTC)
    ) -> None:
        if not sources:
            raise SourceSpecError("no grid source given")
        self.sources = sources
        self.cache = cache
        self.clock = clock
        self.errors: list[str] = []

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
        self.errors = []
        cacheable = [s for s in self.sources if s.name != "csv"]
        if self.cache is not None and what == "history":
            for source in cacheable:
                hit = self.cache.get(source.spec, what, start, end)
                if hit is not None:
                    return hit[0]
        for source in self.sources:
            try:
                signal = fetch(source)
            except SourceSpecError:
                raise
            except GridDataError as exc:
                self.errors.append(str(exc))
                continue
            if self.cache is not None and source in cacheable:
                self.cache.put(signal, what, start, end, self.clock())
            return signal
        if self.cache is not None:
            for source in cacheable:
                hit = self.cache.newest_covering(source.spec, what, start, end)
                if hit is not None:
                    age = (self.clock() - hit[1]).total_seconds()
                    return hit[0].with_meta(stale_s=age)
        raise GridDataError("; ".join(self.errors) + " (and nothing cached covers the range)")


def _encode(signal: Signal, fetched_at: datetime) -> dict:
    meta = asdict(signal.meta)
    meta["issued_at"] = signal.meta.issued_at.isoformat() if signal.meta.issued_at else None
    frame = signal.frame
    return {
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
    index = pd.DatetimeIndex(pd.to_datetime(data["index"], unit="s", utc=True), name="start")
    frame = pd.DataFrame(
        {
            meta.quantity: pd.Series(data["values"], index=index, dtype=float),
            "forecast": pd.Series(data["forecast"], index=index, dtype=bool),
        }
    )
    return Signal(frame, replace(meta))
