"""Splitting a running pair (EaCO's early-stage observations): a job of two sharing one GPU
whose measured speed next to its partner would make it end after its deadline is
checkpointed and restarts alone, where that still keeps its deadline.

The rule, the simulator's (``sim.hardware.splits``) and the daemon's
(``daemon.energy.splits``): a member of a running pair splits when

- its own measured speed next to its partner is known (the daemon: a rate from its reports
  there after one alone; the simulator: ``MOVE_AFTER_S`` after the pair formed),
- it may be interrupted (``--interruptible``),
- its work left (at full speed), at that speed, ends after its deadline, and
- alone, its work left plus its checkpoint's cost at full speed ends by its deadline
  (else splitting would not save it: it stays).

Each job's measurement decides for itself alone (``to_split``): what a job reports is
untrusted, so its reports never make another job be checkpointed; a job that lies about
its own speed can only move itself, which costs it a checkpoint and gets it a GPU alone,
what it would have had without ``--share``. Its partner then runs alone at full speed.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """One job of a running pair, as its own observations show it: ``speed`` is its
    measured speed next to its partner (a share of its speed alone; None: not measured
    yet), ``left_s`` its work left at full speed (None: unknown), ``deadline_s`` (None:
    none) and ``checkpoint_s`` its checkpoint's cost."""

    job: int
    speed: float | None
    left_s: float | None
    deadline_s: float | None
    interruptible: bool
    checkpoint_s: float = 0.0


def at_risk(now_s: float, left_s: float, speed: float, deadline_s: float) -> bool:
    """Whether ``left_s`` of work at full speed, done at ``speed``, ends after the
    deadline."""
    return speed <= 0 or now_s + left_s / speed > deadline_s


def saved_alone(now_s: float, left_s: float, checkpoint_s: float, deadline_s: float) -> bool:
    """Whether restarting alone (its checkpoint's cost lost, then full speed) ends by the
    deadline."""
    return now_s + left_s + checkpoint_s <= deadline_s


def should_split(member: Member, now_s: float) -> bool:
    """The rule, for one member of a pair, by its own measured speed."""
    m = member
    if not m.interruptible or m.speed is None or m.left_s is None or m.deadline_s is None:
        return False
    if not at_risk(now_s, m.left_s, m.speed, m.deadline_s):
        return False  # in time next to its partner
    return saved_alone(now_s, m.left_s, m.checkpoint_s, m.deadline_s)


def to_split(members: Iterable[Member], now_s: float) -> list[int]:
    """The jobs of running pairs to checkpoint and restart alone: each by its own
    measurement only (a job's reports never move its partner)."""
    return [m.job for m in members if should_split(m, now_s)]
