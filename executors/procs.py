"""Process identity on Linux: a pid plus its start time, so a recycled pid is never
mistaken for the process we started."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessId:
    """A process as the kernel knows it: pid and start time (clock ticks since boot)."""

    pid: int
    start_ticks: int

    def to_dict(self) -> dict[str, int]:
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> ProcessId:
        return cls(pid=int(data["pid"]), start_ticks=int(data["start_ticks"]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    return raw[raw.rindex(")") + 2 :].split()


def identify(pid: int) -> ProcessId | None:
    """The identity of a live pid, or None when no such process exists."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return ProcessId(pid=pid, start_ticks=int(fields[19]))


def self_id() -> ProcessId:
    ident = identify(os.getpid())
    assert ident is not None
    return ident


def is_alive(proc: ProcessId) -> bool:
    """True when the very process (same pid, same start time) still runs (zombies are dead)."""
    fields = _stat_fields(proc.pid)
    if fields is None:
        return False
    state, start_ticks = fields[0], int(fields[19])
    return start_ticks == proc.start_ticks and state not in ("Z", "X", "x")
