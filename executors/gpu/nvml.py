"""``GpuControl`` on NVML (``pynvml`` from ``nvidia-ml-py``). NVML errors become
``GpuControlError`` here and nowhere else."""

from __future__ import annotations

import contextlib

from executors.errors import GpuControlError
from executors.gpu.base import GpuControl, GpuInfo


class NvmlGpuControl(GpuControl):
    kind = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise GpuControlError("pynvml is not installed (package nvidia-ml-py)") from exc
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuControlError(f"NVML unavailable: {exc}") from exc
        self._energy_support: dict[int, bool] = {}
        self._limit_support: dict[int, bool] = {}

    def _handle(self, index: int):
        try:
            return self._nvml.nvmlDeviceGetHandleByIndex(index)
        except self._nvml.NVMLError as exc:
            raise GpuControlError(f"GPU {index}: {exc}") from exc

    def device_count(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as exc:
            raise GpuControlError(f"NVML device count: {exc}") from exc

    def info(self, index: int) -> GpuInfo:
        nv, handle = self._nvml, self._handle(index)
        try:
            name = nv.nvmlDeviceGetName(handle)
            uuid = nv.nvmlDeviceGetUUID(handle)
            memory_mb = int(nv.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
            pci = nv.nvmlDeviceGetPciInfo(handle).busId
        except nv.NVMLError as exc:
            raise GpuControlError(f"GPU {index}: {exc}") from exc
        return GpuInfo(
            index=index,
            uuid=_text(uuid),
            model=_text(name),
            memory_mb=memory_mb,
            pci_bus_id=_text(pci),
        )

    def supports_energy_counter(self, index: int) -> bool:
        if index not in self._energy_support:
            try:
                self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle(index))
                self._energy_support[index] = True
            except self._nvml.NVMLError:  # NOT_SUPPORTED before Volta
                self._energy_support[index] = False
        return self._energy_support[index]

    def energy_j(self, index: int) -> float:
        try:  # millijoules since the driver was last loaded
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle(index)) / 1000.0
        except self._nvml.NVMLError as exc:
            raise GpuControlError(f"GPU {index} energy counter: {exc}") from exc

    # -- power limits (NVML works in milliwatts; setting needs root) ----------------------
    def supports_power_limit(self, index: int) -> bool:
        """Tried, not guessed: set the limit to what it is. NO_PERMISSION (not root) and
        NOT_SUPPORTED (the board has no settable limit) both say no."""
        if index not in self._limit_support:
            handle = self._handle(index)
            try:
                current = self._nvml.nvmlDeviceGetPowerManagementLimit(handle)
                self._nvml.nvmlDeviceSetPowerManagementLimit(handle, current)
                self._limit_support[index] = True
            except self._nvml.NVMLError:
                self._limit_support[index] = False
        return self._limit_support[index]

    def power_limit_w(self, index: int) -> float:
        return self._milliwatts(index, "nvmlDeviceGetPowerManagementLimit") / 1000.0

    def default_power_limit_w(self, index: int) -> float:
        return self._milliwatts(index, "nvmlDeviceGetPowerManagementDefaultLimit") / 1000.0

    def power_limit_range_w(self, index: int) -> tuple[float, float]:
        low, high = self._milliwatts(index, "nvmlDeviceGetPowerManagementLimitConstraints")
        return low / 1000.0, high / 1000.0

    def set_power_limit_w(self, index: int, limit_w: float) -> None:
        try:
            self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle(index), round(limit_w * 1000))
        except self._nvml.NVMLError as exc:
            raise GpuControlError(f"GPU {index}: cannot set power limit: {exc}") from exc

    def power_w(self, index: int) -> float:
        """The board's present draw."""
        return self._milliwatts(index, "nvmlDeviceGetPowerUsage") / 1000.0

    def _milliwatts(self, index: int, call: str):
        try:
            return getattr(self._nvml, call)(self._handle(index))
        except self._nvml.NVMLError as exc:
            raise GpuControlError(f"GPU {index}: {call}: {exc}") from exc

    def link_levels(self, indices: list[int]) -> list[list[int]] | None:
        """NVML topology levels between GPUs (0 same board, 10 one PCIe switch, 20 several
        switches, 30 host bridge, 40 NUMA node, 50 system); None where unsupported."""
        nv = self._nvml
        handles = [self._handle(i) for i in indices]
        try:
            return [
                [
                    0 if a is b else int(nv.nvmlDeviceGetTopologyCommonAncestor(a, b))
                    for b in handles
                ]
                for a in handles
            ]
        except nv.NVMLError:
            return None

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
