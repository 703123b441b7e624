"""Job traces for what-if runs, read as published:

- Philly (``timestamp,duration,num_gpus,...``; absolute times, durations in seconds);
- Tiresias (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``;
  submit times in seconds from the trace's start);
- gridshift's own job specs, JSONL or CSV: ``submit`` (ISO time, or seconds from the
  trace's start), ``duration`` (``2h30m`` or seconds), ``gpus`` (``4`` or ``2-8``: the
  widest is simulated), optional ``name``, ``deadline`` (ISO) or ``within``,
  ``interruptible``, ``priority``; the submit command's sweep fields are accepted too.

A trace from another period is moved onto the grid signal by a whole number of weeks, so
every job keeps its weekday and time of day (``shift_onto``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.spec import SWEEP_FIELDS, read_json_lines
from orchestrator.timeparse import parse_duration_s

WEEK_S = 7 * 86400


@dataclass(frozen=True)
class TraceJobs:
    """Jobs in arrival order, as arrays. Times are epoch seconds (or seconds from the
    start when ``relative``); NaN deadline: none given; interruptible -1: not given."""

    submit_s: np.ndarray
    duration_s: np.ndarray
    gpus: np.ndarray
    deadline_s: np.ndarray
    interruptible: np.ndarray  # int8: 1, 0 or -1
    priority: np.ndarray
    names: tuple[str, ...] | None = None
    relative: bool = False
    source: str = ""
    shift_s: float = 0.0

    def __len__(self) -> int:
        return len(self.submit_s)

    @classmethod
    def build(cls, submit, duration, gpus, *, deadline=None, interruptible=None, priority=None,
              names=None, relative=False, source="") -> TraceJobs:  # fmt: skip
        n = len(submit)
        submit = np.asarray(submit, dtype=float)
        order = np.argsort(submit, kind="stable")

        def col(values, default, dtype):
            arr = np.full(n, default, dtype=dtype) if values is None else np.asarray(values)
            return arr.astype(dtype)[order]

        jobs = cls(
            submit_s=submit[order],
            duration_s=col(duration, 0.0, float),
            gpus=col(gpus, 1, np.int64),
            deadline_s=col(deadline, np.nan, float),
            interruptible=col(interruptible, -1, np.int8),
            priority=col(priority, 0, np.int64),
            names=tuple(names[i] for i in order) if names is not None else None,
            relative=relative,
            source=source,
        )
        jobs.check()
        return jobs

    def check(self) -> None:
        bad = np.flatnonzero(~(self.duration_s > 0))
        if len(bad):
            raise SpecError(f"{self.source}: job {int(bad[0]) + 1} has no positive duration")
        bad = np.flatnonzero(self.gpus < 1)
        if len(bad):
            raise SpecError(f"{self.source}: job {int(bad[0]) + 1} asks for no GPUs")

    def head(self, count: int) -> TraceJobs:
        """The first ``count`` jobs in arrival order."""
        return self.take(np.arange(min(count, len(self))))

    def take(self, index: np.ndarray) -> TraceJobs:
        names = tuple(self.names[i] for i in index) if self.names is not None else None
        return replace(
            self,
            submit_s=self.submit_s[index],
            duration_s=self.duration_s[index],
            gpus=self.gpus[index],
            deadline_s=self.deadline_s[index],
            interruptible=self.interruptible[index],
            priority=self.priority[index],
            names=names,
        )

    def shifted(self, by_s: float) -> TraceJobs:
        return replace(
            self,
            submit_s=self.submit_s + by_s,
            deadline_s=self.deadline_s + by_s,
            relative=False,
            shift_s=self.shift_s + by_s,
        )


def read_trace(path: str | Path) -> TraceJobs:
    """Read a trace, telling its format from its header (or the .jsonl suffix)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecError(f"no such job trace: {path}")
    if path.suffix in (".jsonl", ".ndjson", ".json"):
        return _read_specs(path, [row for _, row in read_json_lines(path)])
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read job trace {path}: {str(exc).splitlines()[0]}") from None
    cols = set(frame.columns)
    if {"timestamp", "duration", "num_gpus"} <= cols:
        return _read_philly(path, frame)
    if {"submit_time", "num_gpu", "duration"} <= cols:
        return _read_tiresias(path, frame)
    if {"submit", "duration"} <= cols:
        rows = frame.where(frame.notna(), None).to_dict("records")
        return _read_specs(path, rows)
    raise SpecError(
        f"{path.name}: unknown trace format (columns {', '.join(frame.columns)}); expected "
        "Philly (timestamp,duration,num_gpus), Tiresias (submit_time,num_gpu,duration) "
        "or job specs (submit,duration,gpus)"
    )


def _read_philly(path: Path, frame) -> TraceJobs:
    import pandas as pd

    try:
        times = pd.to_datetime(frame["timestamp"], utc=True, format="mixed")
    except (ValueError, TypeError):
        raise SpecError(f"{path.name}: column 'timestamp' does not hold times") from None
    naive = times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    submit_s = naive.astype("datetime64[ns]").astype(np.int64) / 1e9
    return TraceJobs.build(
        submit_s,
        pd.to_numeric(frame["duration"], errors="coerce").to_numpy(),
        pd.to_numeric(frame["num_gpus"], errors="coerce").fillna(0).to_numpy(),
        source=path.name,
    )


def _read_tiresias(path: Path, frame) -> TraceJobs:
    import pandas as pd

    names = None
    if "model_name" in frame.columns:
        names = tuple(str(m) for m in frame["model_name"])
    return TraceJobs.build(
        pd.to_numeric(frame["submit_time"], errors="coerce").to_numpy(),
        pd.to_numeric(frame["duration"], errors="coerce").to_numpy(),
        pd.to_numeric(frame["num_gpu"], errors="coerce").fillna(0).to_numpy(),
        names=names,
        relative=True,
        source=path.name,
    )


def _read_specs(path: Path, rows: list[dict]) -> TraceJobs:
    if not rows:
        raise SpecError(f"{path.name}: no jobs")
    known = SWEEP_FIELDS | {"submit"}
    submit, duration, gpus, deadline, inter, prio, names = [], [], [], [], [], [], []
    absolute = None
    for number, row in enumerate(rows, 1):
        where = f"{path.name} job {number}"
        unknown = set(row) - known
        if unknown:
            raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if row.get("submit") is None or row.get("duration") is None:
            raise SpecError(f"{where}: needs submit and duration")
        t, is_abs = _time_or_offset(row["submit"], where)
        if absolute is None:
            absolute = is_abs
        elif absolute != is_abs:
            raise SpecError(f"{where}: mixes absolute submit times and offsets")
        submit.append(t)
        duration.append(_seconds(row["duration"], where))
        gpus.append(_gpus(row.get("gpus", 1), where))
        if row.get("deadline") is not None and row.get("within") is not None:
            raise SpecError(f"{where}: give deadline or within, not both")
        if row.get("within") is not None:
            deadline.append(t + _seconds(row["within"], where))
        elif row.get("deadline") is not None:
            d, d_abs = _time_or_offset(row["deadline"], where)
            if d_abs != is_abs:
                raise SpecError(f"{where}: deadline and submit must both be times or offsets")
            deadline.append(d)
        else:
            deadline.append(np.nan)
        flag = row.get("interruptible")
        inter.append(-1 if flag is None else int(_flag(flag, where)))
        prio.append(int(row.get("priority") or 0))
        names.append(str(row.get("name") or ""))
    return TraceJobs.build(
        submit,
        duration,
        gpus,
        deadline=deadline,
        interruptible=inter,
        priority=prio,
        names=names,
        relative=not absolute,
        source=path.name,
    )


def _time_or_offset(value, where: str) -> tuple[float, bool]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value), False
    text = str(value).strip()
    try:
        return float(text), False
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is neither an ISO time nor seconds") from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return moment.timestamp(), True


def _seconds(value, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        try:
            seconds = float(str(value))
        except ValueError:
            try:
                seconds = parse_duration_s(str(value))
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
    if not seconds > 0:
        raise SpecError(f"{where}: a duration must be longer than zero")
    return seconds


def _gpus(value, where: str) -> int:
    text = str(value).strip()
    try:
        return int(text.rpartition("-")[2] if "-" in text[1:] else text)
    except ValueError:
        raise SpecError(f"{where}: gpus must be a count or a range like 2-8") from None


def _flag(value, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise SpecError(f"{where}: interruptible must be true or false, not {value!r}")


def shift_onto(jobs: TraceJobs, start_s: float, end_s: float) -> TraceJobs:
    """Place the trace on the signal's span ``[start_s, end_s)``.

    Offsets (a relative trace) start at the signal's start. Absolute times stay where
    they are when they fall inside the span; otherwise they move by the whole number of
    weeks that brings the trace's first job nearest the same date in one of the signal's
    years (whichever keeps most jobs inside), preserving weekday and time of day."""
    if not len(jobs):
        return jobs
    if jobs.relative:
        return jobs.shifted(start_s)
    inside = int(((jobs.submit_s >= start_s) & (jobs.submit_s < end_s)).sum())
    if inside == len(jobs):
        return jobs
    first = datetime.fromtimestamp(float(jobs.submit_s[0]), UTC)
    best, best_inside = 0.0, inside
    y0 = datetime.fromtimestamp(start_s, UTC).year
    y1 = datetime.fromtimestamp(end_s, UTC).year
    for year in range(y0 - 1, y1 + 1):
        day = min(first.day, 28) if first.month == 2 else first.day
        same_date = first.replace(year=year, day=day)
        weeks = round((same_date - first).total_seconds() / WEEK_S)
        shift = weeks * WEEK_S
        moved = jobs.submit_s + shift
        count = int(((moved >= start_s) & (moved < end_s)).sum())
        if count > best_inside:
            best, best_inside = float(shift), count
    return jobs.shifted(best) if best else jobs
