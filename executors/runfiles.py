"""Files in an attempt's run directory: the contract between executor and monitor.

``spec.json`` (written before the monitor starts), ``claim`` (created exactly once, with
O_EXCL: either by the monitor, ``started <pid> <ticks>``, or by a recovering daemon,
``abandoned``), ``job.json`` (the job's pid and start time) and ``exit.json`` (exit code,
end time, energy) and ``power.log`` (energy samples over the run, where GPUs count it).
JSON files are written to a temporary name, synced, then renamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SPEC, CLAIM, JOB, EXIT, PROGRESS = "spec.json", "claim", "job.json", "exit.json", "progress"
POWER = "power.log"


def write_json(path: Path, data: dict[str, Any], mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:  # never half-written (rename), but be safe
        return None


def try_claim(run_dir: Path, text: str) -> bool:
    """Create the claim file holding ``text``, atomically with its content (a finished
    temporary file is hard-linked into place). False when someone claimed first."""
    tmp = run_dir / f".claim.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, run_dir / CLAIM)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def read_claim(run_dir: Path) -> str | None:
    try:
        return (run_dir / CLAIM).read_text()
    except FileNotFoundError:
        return None


def parse_progress(text: str) -> tuple[float, float | None] | None:
    """A job's progress report: ``"DONE TOTAL"``, ``"DONE/TOTAL"``, ``"DONE"`` or JSON
    ``{"done": D, "total": T}``. None when it is empty or unreadable (a job may be in the
    middle of writing it)."""
    text = text.strip()
    if not text:
        return None
    try:
        if text.startswith("{"):
            data = json.loads(text)
            done, total = float(data["done"]), data.get("total")
            return done, None if total is None else float(total)
        parts = text.replace("/", " ").split()
        done = float(parts[0])
        total = float(parts[1]) if len(parts) > 1 else None
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if done < 0 or (total is not None and total <= 0):
        return None
    return done, total


def read_power_log(path: Path, offset: int = 0) -> tuple[list[tuple[float, float]], int]:
    """Samples ``(t_s, joules since start)`` from byte ``offset`` on, and the offset after
    the last whole line (a line being written is left for the next read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    samples = []
    for line in data[:end].splitlines():
        parts = line.split()
        if len(parts) == 2:
            samples.append((float(parts[0]), float(parts[1])))
    return samples, offset + end
