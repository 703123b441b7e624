"""Pretend GPUs, for machines without any (laptops, CI) and for tests.

Each fake draws ``power_w`` (when given) or its power limit, whichever is lower, so its
energy counter advances with the wall clock and a power cap shows in what it measures.
Without ``power_w`` it has no energy counter and energy stays unmeasured.

Power limits live in memory, or with ``state_path`` in a JSON file that every process
using the fakes shares (the daemon sets limits, the job monitors read energy): the file
keeps each GPU's limit changes, so a counter read in any process integrates the limit that
held at each moment, and a limit outlives a daemon killed with SIGKILL, as a real GPU's
does. Writers hold an exclusive ``flock`` on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from executors.errors import GpuControlError
from executors.gpu.base import GpuControl, GpuInfo

MAX_LIMIT_W = 300.0  # the fake's board limit, also its default
MIN_LIMIT_W = 100.0


class FakeGpuControl(GpuControl):
    kind = "fake"

    def __init__(
        self,
        count: int,
        model: str = "fake-gpu",
        power_w: float | None = None,
        clock=time.time,
        state_path: str | Path | None = None,
    ) -> None:
        self._count = count
        self._model = model
        self._power_w = power_w
        self._clock = clock
        self._path = Path(state_path) if state_path else None
        self._memory: dict[str, list[list[float]]] = {}  # GPU -> [[since, limit_w], ...]

    def device_count(self) -> int:
        return self._count

    def info(self, index: int) -> GpuInfo:
        self._check(index)
        return GpuInfo(index=index, uuid=f"GPU-fake-{index:04d}", model=self._model)

    def supports_energy_counter(self, index: int) -> bool:
        self._check(index)
        return self._power_w is not None

    def energy_j(self, index: int) -> float:
        """∫ min(power_w, limit) dt from the epoch: the limit's history in the state."""
        self._check(index)
        if self._power_w is None:
            raise GpuControlError("fake GPUs without power_w have no energy counter")
        now, power = self._clock(), self._power_w
        energy = power * now
        changes = self._changes().get(str(index), [])
        for k, (since, limit) in enumerate(changes):
            until = changes[k + 1][0] if k + 1 < len(changes) else now
            if until > since and limit < power:
                energy -= (power - limit) * (min(until, now) - since)
        return energy

    # -- power limits -------------------------------------------------------------------
    def supports_power_limit(self, index: int) -> bool:
        self._check(index)
        return True

    def power_limit_w(self, index: int) -> float:
        self._check(index)
        changes = self._changes().get(str(index))
        return changes[-1][1] if changes else MAX_LIMIT_W

    def default_power_limit_w(self, index: int) -> float:
        self._check(index)
        return MAX_LIMIT_W

    def power_limit_range_w(self, index: int) -> tuple[float, float]:
        self._check(index)
        return MIN_LIMIT_W, MAX_LIMIT_W

    def set_power_limit_w(self, index: int, limit_w: float) -> None:
        self._check(index)
        if not MIN_LIMIT_W - 1e-6 <= limit_w <= MAX_LIMIT_W + 1e-6:
            raise GpuControlError(
                f"GPU {index}: limit {limit_w:.0f} W is outside {MIN_LIMIT_W:.0f}-"
                f"{MAX_LIMIT_W:.0f} W"
            )
        with self._locked() as state:
            history = state.setdefault(str(index), [])
            if not history or history[-1][1] != limit_w:
                history.append([self._clock(), float(limit_w)])

    # -- the shared state ---------------------------------------------------------------
    def _changes(self) -> dict[str, list[list[float]]]:
        if self._path is None:
            return self._memory
        try:
            return json.loads(self._path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:  # written by rename: never half-written
            raise GpuControlError(f"fake GPU state {self._path}: {exc}") from None

    @contextlib.contextmanager
    def _locked(self):
        if self._path is None:
            yield self._memory
            return
        lock = os.open(f"{self._path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._changes()
            yield state
            tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self._path)
        finally:
            os.close(lock)

    def _check(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise GpuControlError(f"no GPU {index} (this host has {self._count})")
