"""The discrete-event core: a heap of (time, priority, sequence, action), SimPy-sized.

``schedule`` an action at a time; ``step`` runs every action due at the next time and
advances ``now`` there; ``run`` steps until the heap is empty or a time limit, calling
``after`` once per distinct time (the simulator's ``tick``). Cancelled events stay in the
heap and are skipped when they surface. ``now`` is the simulated clock: the simulated
executor and the simulator read it, never the wall clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Event:
    __slots__ = ("action", "at")

    def __init__(self, at: float, action: Callable[[], None] | None) -> None:
        self.at, self.action = at, action


class EventLoop:
    def __init__(self, start_s: float = 0.0) -> None:
        self.now = float(start_s)
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def schedule(
        self, at: float, action: Callable[[], None] | None = None, priority: int = 1
    ) -> Event:
        """Run ``action`` at ``at`` (never in the past); lower ``priority`` runs first among
        events at one time, then the order of scheduling. No action: a plain wake-up."""
        at = max(float(at), self.now)
        event = Event(at, action)
        self._seq += 1
        heapq.heappush(self._heap, (at, priority, self._seq, event))
        return event

    def cancel(self, event: Event) -> None:
        event.action = None
        event.at = -1.0  # marks it dead

    def peek(self) -> float | None:
        heap = self._heap
        while heap and heap[0][3].at < 0:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def step(self) -> float | None:
        """Run every event at the next time. Returns that time, None when empty."""
        at = self.peek()
        if at is None:
            return None
        self.now = at
        heap = self._heap
        while heap and heap[0][0] == at:
            event = heapq.heappop(heap)[3]
            if event.at >= 0 and event.action is not None:
                event.action()
        return at

    def run(self, until: float | None = None, after: Callable[[float], None] | None = None):
        while True:
            at = self.peek()
            if at is None or (until is not None and at > until):
                break
            self.step()
            if after is not None:
                after(at)
        if until is not None:
            self.now = max(self.now, until)

    def __len__(self) -> int:
        return len(self._heap)
