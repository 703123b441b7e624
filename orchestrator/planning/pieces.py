"""What an attempt runs: the piece of its job's plan a start falls in (its GPUs, its cap,
when it ends)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from orchestrator.planning.policies.base import Commitment, Decision, QueuedJob


def piece_index(decision: Decision, now_s: float) -> int:
    """The interval of ``decision`` a start at ``now_s`` runs in."""
    for k, (_, b) in enumerate(decision.intervals or ()):
        if b > now_s + 1e-6:
            return k
    return max(0, len(decision.intervals or ()) - 1)


def width_of(view: QueuedJob, decision: Decision, now_s: float) -> int:
    """The GPUs a start at ``now_s`` runs on: its piece's, within the job's range."""
    gpus = decision.piece_config(piece_index(decision, now_s))[0]
    return min(gpus, view.max_gpus or view.gpus) if gpus else view.gpus


def piece_cap_until(
    decision: Decision | None, now_s: float
) -> tuple[float | None, datetime | None]:
    """The cap of the piece a start at ``now_s`` runs in (None: uncapped), and when that
    piece ends if more follow (the job is suspended then)."""
    if decision is None:
        return None, None
    k = piece_index(decision, now_s)
    cap = decision.piece_config(k)[1]
    until = None
    if decision.intervals and k < len(decision.intervals) - 1:
        until = datetime.fromtimestamp(decision.intervals[k][1], UTC)
    return (cap if cap < 1.0 - 1e-9 else None), until


class _Running(Protocol):
    job: QueuedJob
    decision: Decision
    gpus: int
    power_w: float
    end_s: float  # the end of the piece it runs in (or of its run)


def held_pieces(run: _Running, now_s: float) -> list[Commitment]:
    """What a running attempt holds: its GPUs and watts to the end of the piece it runs in,
    and in each later piece of its plan (left out, the planner gave those away and the
    job's next piece found no room)."""
    decision, pieces = run.decision, run.decision.intervals or ()
    out = [Commitment(run.job.id, run.gpus, run.power_w, now_s, run.end_s)]
    for k in range(piece_index(decision, now_s) + 1, len(pieces)):
        gpus, _, watts = decision.piece_config(k)
        out.append(Commitment(run.job.id, gpus or run.gpus, watts or run.power_w, *pieces[k]))
    return out
