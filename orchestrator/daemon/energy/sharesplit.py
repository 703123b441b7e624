"""The part of a shared GPU's energy an attempt is charged, over time.

Pure: the spans come from the queue (``Sharing.split_for``). A partner's span is the time
both attempts were on the GPU; within it, time either one was SIGSTOPped (``--suspend
stop`` between pieces: it keeps its GPU, the other runs alone) is cut out:

- both running: each its part by the fitted model (``Span.part``);
- this one stopped, the partner running: nothing (the partner ran alone);
- this one running, the partner stopped: all of it (it ran alone);
- both stopped: half each (an idle GPU both hold).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

INF = float("inf")
Spans = tuple[tuple[float, float], ...]  # [start, end) intervals


@dataclass(frozen=True)
class Span:
    start_s: float
    end_s: float
    part: float  # this attempt's part of the GPU's energy while both run
    partner: str  # the partner's job model (its Gavel name or ``any``)
    partner_stops: Spans = ()


def stops_of(events: Iterable[tuple[float, str | None, str]]) -> Spans:
    """The intervals an attempt was stopped, from its state moves ``(t, from, to)`` in
    time order; one still stopped ends at infinity."""
    out: list[tuple[float, float]] = []
    since = None
    for t, before, after in events:
        if after == "stopped" and since is None:
            since = t
        elif before == "stopped" and after != "stopped" and since is not None:
            out.append((since, t))
            since = None
    if since is not None:
        out.append((since, INF))
    return tuple(out)


def stopped_at(stops: Spans, t: float) -> bool:
    return any(a <= t < b for a, b in stops)


def stopped_within(stops: Spans, t0: float, t1: float) -> bool:
    """Whether a stop overlaps ``[t0, t1]`` (a rate measured over it is not a speed)."""
    return any(a <= t1 and b >= t0 for a, b in stops)


def fraction(spans: list[Span], my_stops: Spans) -> Callable[[float, float], float]:
    """The share of the GPU's energy over ``[t0, t1)`` the attempt is charged."""

    def share(t0: float, t1: float) -> float:
        if t1 <= t0:
            return 1.0
        cuts = {t0, t1}
        for s in spans:
            cuts.update(x for x in (s.start_s, s.end_s) if t0 < x < t1)
            for a, b in s.partner_stops:
                cuts.update(x for x in (a, b) if t0 < x < t1)
        for a, b in my_stops:
            cuts.update(x for x in (a, b) if t0 < x < t1)
        points = sorted(cuts)
        charged = 0.0
        for a, b in itertools.pairwise(points):
            charged += (b - a) * _part_at((a + b) / 2, spans, my_stops)
        return max(0.0, min(1.0, charged / (t1 - t0)))

    return share


def _part_at(t: float, spans: list[Span], my_stops: Spans) -> float:
    span = next((s for s in spans if s.start_s <= t < s.end_s), None)
    if span is None:
        return 1.0  # alone on the GPU
    me, other = stopped_at(my_stops, t), stopped_at(span.partner_stops, t)
    if me and other:
        return 0.5
    if me:
        return 0.0
    return 1.0 if other else span.part
