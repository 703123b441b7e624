"""The NVML boundary against a stand-in ``pynvml`` module (this machine has no GPU):
units (millijoules to joules), unsupported counters, and error translation."""

from __future__ import annotations

import sys
import types

import pytest

from executors.errors import GpuControlError
from executors.gpu import gpu_control_for
from executors.gpu.fake import FakeGpuControl


class _NVMLError(Exception):
    pass


def _fake_pynvml(energy_mj: dict[int, int | None], init_fails: bool = False):
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _NVMLError

    def init():
        if init_fails:
            raise _NVMLError("Driver Not Loaded")

    def energy(handle):
        value = energy_mj[handle]
        if value is None:
            raise _NVMLError("Not Supported")
        return value

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(energy_mj)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 1024**3)
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"0000:0{h}:00.0")
    # two PCIe switches: {0, 2} and {1, 3}; across them the host bridge
    mod.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10 if a % 2 == b % 2 else 30
    return mod


def test_energy_counter_in_joules_and_unsupported_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({0: 123_456, 1: None}))
    from executors.gpu.nvml import NvmlGpuControl

    ctl = NvmlGpuControl()
    assert ctl.device_count() == 2
    assert ctl.supports_energy_counter(0) and ctl.energy_j(0) == pytest.approx(123.456)
    assert not ctl.supports_energy_counter(1)
    with pytest.raises(GpuControlError, match="energy counter"):
        ctl.energy_j(1)
    info = ctl.info(0)
    assert info.model == "NVIDIA H100 80GB HBM3" and info.memory_mb == 80 * 1024


def test_no_driver_is_a_gpu_control_error_and_detection_finds_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({}, init_fails=True))
    from executors.gpu import detect_gpus
    from executors.gpu.nvml import NvmlGpuControl

    with pytest.raises(GpuControlError, match="NVML unavailable"):
        NvmlGpuControl()
    assert detect_gpus() == []


def test_fake_gpus():
    ctl = FakeGpuControl(2, power_w=50, clock=lambda: 10.0)
    assert [g.index for g in ctl.devices()] == [0, 1] and ctl.energy_j(1) == 500
    assert not FakeGpuControl(1).supports_energy_counter(0)
    with pytest.raises(GpuControlError):
        ctl.info(2)
    assert gpu_control_for("none") is None
    with pytest.raises(ValueError):
        gpu_control_for("rocm")


def test_link_levels_give_the_buddy_order(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({0: 1, 1: 1, 2: 1, 3: 1}))
    from executors.gpu import detect_link_levels
    from orchestrator.nodes.inventory import ResolvedNode, topology

    levels = detect_link_levels([0, 1, 2, 3])
    assert levels[0] == [0, 30, 10, 30]
    node = ResolvedNode(
        name="box", executor="local", gpus=tuple(FakeGpuControl(4).devices()), gpu_source="nvml"
    )
    (topo,) = topology([node], link_levels=detect_link_levels).nodes
    assert topo.order == (0, 2, 1, 3), "GPUs on one switch form an aligned pair"


def test_power_limits_in_watts_and_no_permission_means_unsupported(monkeypatch):
    mod = _fake_pynvml({0: 1, 1: 1})
    limits = {0: 300_000, 1: 300_000}
    allowed = {0: True, 1: False}  # GPU 1: as for a daemon that is not root

    def set_limit(handle, mw):
        if not allowed[handle]:
            raise _NVMLError("Insufficient Permissions")
        limits[handle] = mw

    mod.nvmlDeviceGetPowerManagementLimit = lambda h: limits[h]
    mod.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: 300_000
    mod.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: (100_000, 350_000)
    mod.nvmlDeviceSetPowerManagementLimit = set_limit
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    from executors.gpu.nvml import NvmlGpuControl
    from orchestrator.nodes.powercaps import PowerCaps

    ctl = NvmlGpuControl()
    assert ctl.supports_power_limit(0) and not ctl.supports_power_limit(1)
    assert ctl.power_limit_range_w(0) == (100.0, 350.0)
    caps = PowerCaps(ctl, 1)
    assert caps.apply([0], 0.5) == 175.0 and limits[0] == 175_000  # of the maximum limit
    caps.restore([0])
    assert limits[0] == 300_000, "back to the default, not the maximum"
    with pytest.raises(GpuControlError, match="cannot set power limit"):
        ctl.set_power_limit_w(1, 200)
