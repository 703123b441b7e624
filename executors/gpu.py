"""The GPU control boundary: what gridshift asks of GPUs, with units in the names.

``NvmlGpuControl`` talks to NVML through ``pynvml`` (package ``nvidia-ml-py``);
``FakeGpuControl`` stands in on machines without GPUs (laptops, CI) and in tests.
Optional features are asked with ``supports_*`` first: energy counters need Volta or
newer, power limits need privileges.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_mb: int | None = None
    pci_bus_id: str | None = None


class GpuControl(ABC):
    """One host's GPUs. Indices are NVML's (PCI bus order)."""

    kind: str = "abstract"

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def info(self, index: int) -> GpuInfo: ...

    @abstractmethod
    def supports_energy_counter(self, index: int) -> bool: ...

    @abstractmethod
    def energy_j(self, index: int) -> float:
        """Energy the GPU consumed since the driver loaded, in joules (monotonic)."""

    def devices(self) -> list[GpuInfo]:
        return [self.info(i) for i in range(self.device_count())]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend (NVML shutdown)."""


class FakeGpuControl(GpuControl):
    """Pretend GPUs. With ``power_w`` set each draws that constant power, so energy
    counters advance with the wall clock (used to exercise the accounting path);
    without it the fake has no energy counters and energy stays unmeasured."""

    kind = "fake"

    def __init__(
        self, count: int, model: str = "fake-gpu", power_w: float | None = None, clock=time.time
    ) -> None:
        self._count = count
        self._model = model
        self._power_w = power_w
        self._clock = clock

    def device_count(self) -> int:
        return self._count

    def info(self, index: int) -> GpuInfo:
        self._check(index)
        return GpuInfo(index=index, uuid=f"GPU-fake-{index:04d}", model=self._model)

    def supports_energy_counter(self, index: int) -> bool:
        self._check(index)
        return self._power_w is not None

    def energy_j(self, index: int) -> float:
        from executors.errors import GpuControlError

        self._check(index)
        if self._power_w is None:
            raise GpuControlError("fake GPUs without power_w have no energy counter")
        return self._power_w * self._clock()

    def _check(self, index: int) -> None:
        if not 0 <= index < self._count:
            from executors.errors import GpuControlError

            raise GpuControlError(f"no GPU {index} (this host has {self._count})")


def gpu_control_for(backend: str) -> GpuControl | None:
    """Build the control named by a launch spec's ``gpu_backend``: ``nvml``,
    ``fake``, ``fake:<power_w>`` or ``none``."""
    if backend == "none":
        return None
    if backend == "nvml":
        from executors.nvml import NvmlGpuControl

        return NvmlGpuControl()
    if backend.startswith("fake"):
        _, _, power = backend.partition(":")
        return FakeGpuControl(count=1024, power_w=float(power) if power else None)
    raise ValueError(f"unknown GPU backend {backend!r}")


def detect_link_levels(indices: list[int]) -> list[list[int]] | None:
    """NVML's link-level matrix between these GPUs of this host; None without NVML."""
    from executors.errors import GpuControlError

    try:
        from executors.nvml import NvmlGpuControl

        ctl = NvmlGpuControl()
    except GpuControlError:
        return None
    try:
        return ctl.link_levels(indices)
    finally:
        ctl.close()


def detect_gpus() -> list[GpuInfo]:
    """This host's GPUs through NVML; empty when there is no driver or no GPU."""
    from executors.errors import GpuControlError

    try:
        from executors.nvml import NvmlGpuControl

        ctl = NvmlGpuControl()
    except GpuControlError:
        return []
    try:
        return ctl.devices()
    finally:
        ctl.close()
