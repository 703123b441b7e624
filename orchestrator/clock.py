"""Time, injected wherever it matters. UTC inside."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        """Wait ``seconds`` or until ``wake`` is set, whichever comes first."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        wake.wait(max(0.0, seconds))
