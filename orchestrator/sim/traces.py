"""Job traces for what-if runs, read as published:

- Philly (``timestamp,duration,num_gpus,...``; absolute times, durations in seconds);
- Tiresias (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``;
  submit times in seconds from the trace's start);
- gridshift's own job specs, JSONL or CSV: ``submit`` (ISO time, or seconds from the
  trace's start), ``duration`` (``2h30m`` or seconds), ``gpus`` (``4`` or ``2-8``: the
  widest is simulated), optional ``name``, ``deadline`` (ISO) or ``within``,
  ``interruptible``, ``priority``, ``gpu_type``; the submit command's sweep fields too;
  ``after``: the rows (numbered from 1) it waits for, earlier rows of the same trace
  (``3``, ``[1, 2]`` or, in a CSV, ``"1 2"``), as ``submit --after``.

A trace from another period is moved onto the grid signal by a whole number of weeks, so
every job keeps its weekday and time of day (``shift_onto``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.queue import checks
from orchestrator.queue.spec import SWEEP_FIELDS, parse_gpu_type, read_json_lines
from orchestrator.timeparse import (
    MAX_DURATION_S,
    MAX_DURATION_TEXT,
    check_seconds,
    parse_duration_s,
)

WEEK_S = 7 * 86400
#: Times a trace may hold: absolute ones from 1970 to 2200 (epoch seconds), offsets from
#: the trace's start up to ten years. Durations: at most one year (``timeparse``).
EARLIEST_S, LATEST_S = 0.0, 7_258_118_400.0
MAX_OFFSET_S = 10 * 365 * 86400.0


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
    gpu_types: tuple[str | None, ...] | None = None  # per job: the GPU type it asked for
    relative: bool = False
    source: str = ""
    shift_s: float = 0.0
    # Per job, the indexes (in arrival order) of the jobs it waits for; None: no waits.
    after: tuple[tuple[int, ...], ...] | None = None

    def __len__(self) -> int:
        return len(self.submit_s)

    @classmethod
    def build(cls, submit, duration, gpus, *, deadline=None, interruptible=None, priority=None,
              names=None, relative=False, source="", after=None,
              gpu_types=None) -> TraceJobs:  # fmt: skip
        n = len(submit)
        submit = np.asarray(submit, dtype=float)
        gpus = np.asarray(gpus, dtype=float)  # before the cast: 1e30 is no int64
        bad = np.flatnonzero(~((gpus >= 1) & (gpus <= checks.MAX_GPUS)))
        if len(bad):
            raise SpecError(
                f"{source}: job {int(bad[0]) + 1} asks for {gpus[bad[0]]:g} GPUs "
                f"(1 to {checks.MAX_GPUS})"
            )
        order = np.argsort(submit, kind="stable")

        def col(values, default, dtype):
            arr = np.full(n, default, dtype=dtype) if values is None else np.asarray(values)
            return arr.astype(dtype)[order]

        waits = None
        if after is not None and any(after):
            position = np.empty(n, dtype=np.int64)
            position[order] = np.arange(n)
            waits = tuple(tuple(int(position[r]) for r in after[i]) for i in order)

        jobs = cls(
            submit_s=submit[order],
            duration_s=col(duration, 0.0, float),
            gpus=col(gpus, 1, np.int64),
            deadline_s=col(deadline, np.nan, float),
            interruptible=col(interruptible, -1, np.int8),
            priority=col(priority, 0, np.int64),
            names=tuple(names[i] for i in order) if names is not None else None,
            gpu_types=tuple(gpu_types[i] for i in order) if gpu_types is not None else None,
            relative=relative,
            source=source,
            after=waits,
        )
        jobs.check()
        return jobs

    def check(self) -> None:
        """Every value finite and in range: durations above zero and at most one year,
        times inside ``EARLIEST_S .. LATEST_S`` (offsets: ``0 .. MAX_OFFSET_S``), a given
        deadline no earlier than the job could end."""
        bad = np.flatnonzero(~(self.duration_s > 0))
        if len(bad):
            raise SpecError(f"{self.source}: job {int(bad[0]) + 1} has no positive duration")
        bad = np.flatnonzero(~(self.duration_s <= MAX_DURATION_S))
        if len(bad):
            raise SpecError(
                f"{self.source}: job {int(bad[0]) + 1} runs longer than {MAX_DURATION_TEXT}"
            )
        bad = np.flatnonzero(self.gpus < 1)
        if len(bad):
            raise SpecError(f"{self.source}: job {int(bad[0]) + 1} asks for no GPUs")
        low, high = (0.0, MAX_OFFSET_S) if self.relative else (EARLIEST_S, LATEST_S)
        bad = np.flatnonzero(~((self.submit_s >= low) & (self.submit_s <= high)))
        if len(bad):
            span = "0 to ten years after the start" if self.relative else "1970 to 2200"
            raise SpecError(
                f"{self.source}: job {int(bad[0]) + 1} is submitted at {self.submit_s[bad[0]]:g}: "
                f"times must lie in {span}"
            )
        given = ~np.isnan(self.deadline_s)
        early = given & ~(self.deadline_s >= self.submit_s + self.duration_s)
        bad = np.flatnonzero(early)
        if len(bad):
            raise SpecError(
                f"{self.source}: job {int(bad[0]) + 1}: its deadline comes before it could end"
            )
        bad = np.flatnonzero(given & ~(self.deadline_s - self.submit_s <= MAX_DURATION_S))
        if len(bad):
            raise SpecError(
                f"{self.source}: job {int(bad[0]) + 1}: its deadline is more than "
                f"{MAX_DURATION_TEXT} after its submission"
            )

    def head(self, count: int) -> TraceJobs:
        """The first ``count`` jobs in arrival order."""
        return self.take(np.arange(min(count, len(self))))

    def take(self, index: np.ndarray) -> TraceJobs:
        names, types = (None if v is None else tuple(v[i] for i in index)
                        for v in (self.names, self.gpu_types))  # fmt: skip
        after = None
        if self.after is not None:  # a wait on a job left out is dropped (see the caller)
            new = {int(old): k for k, old in enumerate(index)}
            after = tuple(tuple(new[d] for d in self.after[i] if d in new) for i in index)
            after = after if any(after) else None
        return replace(
            self,
            submit_s=self.submit_s[index],
            duration_s=self.duration_s[index],
            gpus=self.gpus[index],
            deadline_s=self.deadline_s[index],
            interruptible=self.interruptible[index],
            priority=self.priority[index],
            names=names,
            gpu_types=types,
            after=after,
        )

    def without_dependants(self, keep: np.ndarray) -> np.ndarray:
        """``keep`` less every job that waits (directly or not) for one it leaves out: a
        dependant of a job that never runs never runs either."""
        keep = np.asarray(keep, dtype=bool).copy()
        if self.after is None:
            return keep
        changed = True
        while changed:
            changed = False
            for i in np.flatnonzero(keep):
                if any(not keep[d] for d in self.after[i]):
                    keep[i], changed = False, True
        return keep

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
        return _read_specs(path, [row for _, row in read_json_lines(path)], strict=True)
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype={"gpu_type": object, "name": object})  # "" -> None
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


def _read_specs(path: Path, rows: list[dict], strict: bool = False) -> TraceJobs:
    """Job specs; ``strict``: JSON's types kept (a CSV's cells are numbers or text)."""
    if not rows:
        raise SpecError(f"{path.name}: no jobs")
    known = SWEEP_FIELDS | {"submit", "after"}
    submit, duration, gpus, deadline, inter, prio, names, types = [], [], [], [], [], [], [], []
    after: list[tuple[int, ...]] = []
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
        gpus.append(_gpus(row.get("gpus", 1), where, strict))
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
        inter.append(-1 if flag is None else int(_flag(flag, where, strict)))
        prio.append(_priority(row.get("priority"), where, strict))
        names.append("" if row.get("name") is None else _text(row["name"], where, strict))
        after.append(_after(row.get("after"), number, len(rows), where))
        types.append(parse_gpu_type(row.get("gpu_type"), f"{where}: "))
    return TraceJobs.build(
        submit,
        duration,
        gpus,
        deadline=deadline,
        interruptible=inter,
        priority=prio,
        names=names,
        gpu_types=types,
        relative=not absolute,
        source=path.name,
        after=after,
    )


def _after(value, number: int, count: int, where: str) -> tuple[int, ...]:
    """The 0-based rows a row waits for: earlier rows of the trace, by number from 1
    (so no row waits for itself or, through others, for a later one: no cycles)."""
    if value is None or value == "" or (isinstance(value, float) and np.isnan(value)):
        return ()
    items = value if isinstance(value, list) else [value]
    if isinstance(value, str):
        items = value.replace(",", " ").split()
    out = []
    for item in items:
        if isinstance(item, float) and item.is_integer():  # a CSV's number column
            item = int(item)
        if isinstance(item, bool) or not (
            isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit())
        ):
            raise SpecError(f"{where}: after {item!r} is no row number (1, 2, ...)")
        row = int(item)
        if not 1 <= row <= count:
            raise SpecError(f"{where}: after {row}: no job {row} in the trace")
        if row == number:
            raise SpecError(f"{where}: after {row}: a job cannot wait for itself")
        if row > number:
            raise SpecError(f"{where}: after {row}: a job waits only for earlier rows")
        out.append(row - 1)
    return tuple(sorted(set(out)))


def _time_or_offset(value, where: str) -> tuple[float, bool]:
    if isinstance(value, bool):
        raise SpecError(f"{where}: {value!r} is neither an ISO time nor seconds")
    if isinstance(value, int | float):
        return _finite(value, where), False
    text = str(value).strip()
    try:
        return _finite(float(text), where), False
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
        return moment.timestamp(), True
    except (ValueError, OverflowError):
        raise SpecError(
            f"{where}: {checks.shown(text)} is neither an ISO time nor seconds"
        ) from None


def _finite(value: float, where: str) -> float:
    try:
        return checks.number(value, "time")
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _seconds(value, where: str) -> float:
    try:
        if isinstance(value, bool):
            raise SpecError(f"a duration must be a number or text such as 2h, not {value!r}")
        if isinstance(value, int | float):
            return check_seconds(checks.number(value, "duration"), value)
        try:
            seconds = float(str(value))
        except ValueError:
            return parse_duration_s(str(value))
        return check_seconds(seconds, value)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _gpus(value, where: str, strict: bool) -> int:
    if strict and isinstance(value, int) and not isinstance(value, bool):
        return value  # its range: ``TraceJobs.build``
    if isinstance(value, float) and value.is_integer() and not strict:
        return int(value)
    text = str(value).strip()
    if (strict and not isinstance(value, str)) or len(text) > 40:
        raise SpecError(f"{where}: gpus must be a count or a range like 2-8")
    try:
        return int(text.rpartition("-")[2] if "-" in text[1:] else text)
    except ValueError:
        raise SpecError(f"{where}: gpus must be a count or a range like 2-8") from None


def _priority(value, where: str, strict: bool) -> int:
    if value is None:
        return 0
    if not strict and isinstance(value, float) and value.is_integer():
        value = int(value)
    elif not strict and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip()) if len(value.strip()) <= 25 else value
    try:
        return checks.integer(value, "priority")
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _text(value, where: str, strict: bool) -> str:
    try:
        return checks.text(value if strict else str(value), "name", limit=256)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _flag(value, where: str, strict: bool = False) -> bool:
    if isinstance(value, bool):
        return value
    if strict:
        raise SpecError(f"{where}: interruptible must be true or false, not {value!r}")
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "0", "false", "no"):
        return text in ("1", "true", "yes")
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
