"""The GPU control interface: what gridshift asks of GPUs, with units in the names.

Optional features are asked with ``supports_*`` first: energy counters need Volta or
newer, power limits need privileges.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from executors.errors import GpuControlError


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

    def energy_many_j(self, indices: list[int]) -> list[float | None]:
        """The counters of several GPUs at one moment (None where one has none)."""
        return [self.energy_j(i) if self.supports_energy_counter(i) else None for i in indices]

    # -- power limits (optional: they need privileges) ----------------------------------
    def supports_power_limit(self, index: int) -> bool:
        """Whether this process may change the GPU's power limit."""
        return False

    def power_limit_w(self, index: int) -> float:
        raise GpuControlError(f"GPU {index}: power limits are not available here")

    def default_power_limit_w(self, index: int) -> float:
        raise GpuControlError(f"GPU {index}: power limits are not available here")

    def power_limit_range_w(self, index: int) -> tuple[float, float]:
        """The (minimum, maximum) limit the GPU accepts."""
        raise GpuControlError(f"GPU {index}: power limits are not available here")

    def set_power_limit_w(self, index: int, limit_w: float) -> None:
        raise GpuControlError(f"GPU {index}: power limits are not available here")

    def devices(self) -> list[GpuInfo]:
        return [self.info(i) for i in range(self.device_count())]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend (NVML shutdown)."""
