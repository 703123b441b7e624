"""Splitting a running pair (EaCO's early-stage observations): a job of two sharing one GPU
whose measured speed next to its partner would make it end after its deadline is
checkpointed and restarts alone, where that still keeps its deadline.

The rule, the simulator's (``sim.hardware.splits``) and the daemon's
(``daemon.energy.splits``): a member of a running pair splits when

- its own measured speed next to its partner is known (the daemon: a rate from its reports
  there after one alone; the simulator: ``MOVE_AFTER_S`` after the pair formed),
- it may be interrupted (``--interruptible``),
- its work left (at full speed), at that speed until its partner is expected to leave
  (``partner_end_s``; unknown: never) and at full speed after, ends after its deadline,
  and
- alone, its work left plus its checkpoint's cost at full speed ends by its deadline
  (else splitting would not save it: it stays).

Each job's measurement decides for itself alone (``to_split``): what a job reports is
untrusted, so its reports never make another job be checkpointed; a job that lies about
its own speed can only move itself, which costs it a checkpoint and gets it a GPU alone,
what it would have had without ``--share``. Its partner then runs alone at full speed.
When its partner is expected to leave is the partner's own estimate; it can only make a
job's end earlier than next to its partner throughout, so it can keep a job from being
split, never make it split.

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
    none), ``checkpoint_s`` its checkpoint's cost and ``partner_end_s`` when its partner
    is expected to leave it (None: unknown, it counts as never)."""

    job: int
    speed: float | None
    left_s: float | None
    deadline_s: float | None
    interruptible: bool
    checkpoint_s: float = 0.0
    partner_end_s: float | None = None


def ends_s(now_s: float, left_s: float, speed: float, partner_end_s: float | None) -> float:
    """When ``left_s`` of work at full speed ends, done at ``speed`` until its partner
    leaves at ``partner_end_s`` (None: never) and at full speed after."""
    if speed <= 0:
        return float("inf")
    paired_s = left_s / speed
    if partner_end_s is None or now_s + paired_s <= partner_end_s:
        return now_s + paired_s
    together_s = max(0.0, partner_end_s - now_s)
    return now_s + together_s + (left_s - together_s * speed)


def at_risk(
    now_s: float, left_s: float, speed: float, deadline_s: float, partner_end_s=None
) -> bool:
    """Whether ``left_s`` of work at full speed, done at ``speed`` (until its partner
    leaves at ``partner_end_s``, then alone), ends after the deadline."""
    return ends_s(now_s, left_s, speed, partner_end_s) > deadline_s


def saved_alone(now_s: float, left_s: float, checkpoint_s: float, deadline_s: float) -> bool:
    """Whether restarting alone (its checkpoint's cost lost, then full speed) ends by the
    deadline."""
    return now_s + left_s + checkpoint_s <= deadline_s


def should_split(member: Member, now_s: float) -> bool:
    """The rule, for one member of a pair, by its own measured speed."""
    m = member
    if not m.interruptible or m.speed is None or m.left_s is None or m.deadline_s is None:
        return False
    if not at_risk(now_s, m.left_s, m.speed, m.deadline_s, m.partner_end_s):
        return False  # in time next to its partner
    return saved_alone(now_s, m.left_s, m.checkpoint_s, m.deadline_s)


def to_split(members: Iterable[Member], now_s: float) -> list[int]:
    """The jobs of running pairs to checkpoint and restart alone: each by its own
    measurement only (a job's reports never move its partner)."""
    return [m.job for m in members if should_split(m, now_s)]
