"""GPU control: the interface (``base``), its backends and the factory that picks one.

- ``nvml``: ``NvmlGpuControl`` talks to NVML through ``pynvml`` (package ``nvidia-ml-py``);
- ``smi``: ``SmiGpuControl`` runs the ``nvidia-smi`` command (on servers reached over SSH);
- ``fake``: ``FakeGpuControl`` stands in on machines without GPUs (laptops, CI) and in tests.

The backends import ``base`` only; this module imports them lazily, when asked for one
(as Zeus's ``zeus.device.gpu`` does), so there is no import circle and no backend's
library is loaded before it is needed.
"""

from __future__ import annotations

from executors.gpu.base import GpuControl, GpuInfo

__all__ = ["GpuControl", "GpuInfo", "detect_gpus", "detect_link_levels", "gpu_control_for"]


def gpu_control_for(backend: str) -> GpuControl | None:
    """Build the control named by a launch spec's ``gpu_backend``: ``nvml``, ``smi`` (the
    ``nvidia-smi`` command, on servers reached over SSH), ``fake``,
    ``fake:<power_w>``, ``fake:<power_w>@<state file>`` (fakes whose power limits persist
    in that file, shared by the daemon and the job monitors) or ``none``."""
    if backend == "none":
        return None
    if backend == "nvml":
        from executors.gpu.nvml import NvmlGpuControl

        return NvmlGpuControl()
    if backend == "smi":
        from executors.gpu.smi import SmiGpuControl

        return SmiGpuControl()
    if backend.startswith("fake"):
        from executors.gpu.fake import FakeGpuControl

        _, _, rest = backend.partition(":")
        power, _, state = rest.partition("@")
        return FakeGpuControl(
            count=1024, power_w=float(power) if power else None, state_path=state or None
        )
    raise ValueError(f"unknown GPU backend {backend!r}")


def detect_link_levels(indices: list[int]) -> list[list[int]] | None:
    """NVML's link-level matrix between these GPUs of this host; None without NVML."""
    from executors.errors import GpuControlError

    try:
        from executors.gpu.nvml import NvmlGpuControl

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
        from executors.gpu.nvml import NvmlGpuControl

        ctl = NvmlGpuControl()
    except GpuControlError:
        return []
    try:
        return ctl.devices()
    finally:
        ctl.close()
