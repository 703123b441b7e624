"""Performance and power models of a training job: how fast and how hungry it is on n GPUs
at a power cap of fraction f of the GPU's maximum limit, and so the time and energy to
finish its remaining work in any configuration. Pure functions; no I/O after loading the
fitted curves (``power_curves.json``, made by ``orchestrator.planning.perffit``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from orchestrator.planning.devices.typenames import type_of

CURVES = Path(__file__).with_name("power_curves.json")
ALIASES = {  # the fitted types (canonical names: ``devices.typenames``)
    "rtx6000": ("rtx 6000", "rtx6000", "quadro rtx 6000"),
    "a40": ("a40",),
    "v100": ("v100",),
    "p100": ("p100",),
}
# types with no fitted curve: the generic shape at their board limit (A100 SXM4; one of a
# K80's two GPUs)
BOARD_LIMIT_W = {"a100": 400.0, "k80": 150.0}


@dataclass(frozen=True)
class PowerCurve:
    """Normalised throughput and power of one GPU type against the cap fraction f."""

    gpu: str
    max_limit_w: float
    min_limit_w: float
    tput_k: float
    tput_f0: float
    power_poly: tuple[float, ...]
    fitted: bool = True  # False for the generic curve used for unknown GPU types

    @property
    def min_fraction(self) -> float:
        return self.min_limit_w / self.max_limit_w

    def clamp(self, f: float) -> float:
        if not 0 < f <= 1:
            raise ValueError(f"power-cap fraction must be in (0, 1], not {f}")
        return max(f, self.min_fraction)

    def throughput_fraction(self, f: float) -> float:
        """Throughput at cap fraction f relative to full power (1.0 at f = 1)."""
        f = self.clamp(f)
        k, f0 = self.tput_k, self.tput_f0
        return (1 - math.exp(-k * (f - f0))) / (1 - math.exp(-k * (1 - f0)))

    def power_w(self, f: float) -> float:
        """Average draw of one busy GPU at cap fraction f, in watts (never above the cap)."""
        f = self.clamp(f)
        normalised = sum(
            c * f ** (len(self.power_poly) - 1 - i) for i, c in enumerate(self.power_poly)
        )
        return min(normalised, f) * self.max_limit_w

    def with_max_limit(self, max_limit_w: float) -> PowerCurve:
        scale = max_limit_w / self.max_limit_w
        return PowerCurve(
            self.gpu,
            max_limit_w,
            self.min_limit_w * scale,
            self.tput_k,
            self.tput_f0,
            self.power_poly,
            self.fitted,
        )


@cache
def _curves() -> dict[str, PowerCurve]:
    data = json.loads(CURVES.read_text())["gpus"]
    curves = {
        gpu: PowerCurve(
            gpu,
            c["max_limit_w"],
            c["min_limit_w"],
            c["tput_k"],
            c["tput_f0"],
            tuple(c["power_poly"]),
        )
        for gpu, c in data.items()
    }
    n = len(curves)
    mean = lambda attr: sum(getattr(c, attr) for c in curves.values()) / n  # noqa: E731
    curves["generic"] = PowerCurve(
        "generic",
        300.0,
        300.0 * mean("min_fraction"),
        mean("tput_k"),
        mean("tput_f0"),
        tuple(sum(c.power_poly[i] for c in curves.values()) / n for i in range(3)),
        fitted=False,
    )
    return curves


def curve_for(gpu_model: str | None, max_limit_w: float | None = None) -> PowerCurve:
    """The fitted curve for a GPU model name (``"Tesla V100-SXM2-32GB"`` → v100; whole
    words: a Quadro P1000 is no P100), else the generic one (the mean of the fitted
    curves), at the board limit of a known type without a fit (an A100: 400 W, named
    ``a100``). ``max_limit_w`` (from NVML) rescales it."""
    gpu, curves = type_of(gpu_model), _curves()
    chosen = curves[gpu] if gpu in ALIASES else curves["generic"]
    if gpu in BOARD_LIMIT_W:
        chosen = replace(chosen.with_max_limit(BOARD_LIMIT_W[gpu]), gpu=gpu)
    return chosen.with_max_limit(max_limit_w) if max_limit_w else chosen


DEFAULT_EFFICIENCY = 0.9  # speed-up per doubling of GPUs, where nothing was measured


def scaled_speedup(n: int, efficiency: float = DEFAULT_EFFICIENCY) -> float:
    """Speed-up on ``n`` GPUs at a per-doubling ``efficiency``: n · efficiency^log2(n)."""
    return n * efficiency ** math.log2(n)


@dataclass(frozen=True)
class JobModel:
    """One job. Its work is ``total_work`` units (steps; 1.0 = the whole job when only a
    duration is known), done in ``full_duration_s`` on ``ref_gpus`` GPUs at full power.

    Scaling with GPU count: a measured ``throughput_table`` (GPU count → work per second
    at full power, interpolated linearly between counts), else a per-doubling
    ``efficiency``: speed-up(n) = n · efficiency^log2(n) (1.0 is linear scaling)."""

    full_duration_s: float
    ref_gpus: int
    curve: PowerCurve
    total_work: float = 1.0
    efficiency: float = DEFAULT_EFFICIENCY
    throughput_table: dict[int, float] | None = field(default=None, hash=False)
    gpu_idle_w: float | None = None  # default: 20 % of the maximum limit
    host_w_per_gpu: float = 50.0  # CPU, memory, fans: a node's share per GPU in use
    pue: float = 1.0  # facility overhead (cooling ...)
    power_scale: float = 1.0  # measured draw / the curve's, from NVML samples

    def speedup(self, n: int) -> float:
        if n <= 0:
            raise ValueError("a job runs on at least one GPU")
        if self.throughput_table:
            return self._table(n) / self._table(1)
        return scaled_speedup(n, self.efficiency)

    def _table(self, n: int) -> float:
        table = dict(sorted(self.throughput_table.items()))
        if n in table:
            return table[n]
        counts = list(table)
        lo = max((c for c in counts if c < n), default=counts[0])
        hi = min((c for c in counts if c > n), default=counts[-1])
        if lo == hi:
            return table[lo] * n / lo  # beyond the table: linear from its edge
        return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)

    def throughput(self, n: int, f: float = 1.0) -> float:
        """Work units per second on n GPUs at cap fraction f."""
        per_gpu_full = self.total_work / self.full_duration_s / self.speedup(self.ref_gpus)
        return per_gpu_full * self.speedup(n) * self.curve.throughput_fraction(f)

    def power_w(self, n: int, f: float = 1.0) -> float:
        """Facility power while running: GPUs at the cap's draw plus host share, × PUE."""
        gpu_w = self.curve.power_w(f) * self.power_scale
        return (n * (gpu_w + self.host_w_per_gpu)) * self.pue

    def idle_power_w(self, n: int) -> float:
        idle = self.gpu_idle_w if self.gpu_idle_w is not None else 0.2 * self.curve.max_limit_w
        return n * (idle + self.host_w_per_gpu) * self.pue

    def time_s(self, remaining_work: float, n: int, f: float = 1.0) -> float:
        return remaining_work / self.throughput(n, f)

    def energy_j(self, remaining_work: float, n: int, f: float = 1.0) -> float:
        return self.power_w(n, f) * self.time_s(remaining_work, n, f)

    def calibrated(self, measured_throughput: float, n: int, f: float) -> JobModel:
        """The same model scaled so that it predicts ``measured_throughput`` at (n, f)."""
        factor = measured_throughput / self.throughput(n, f)
        return replace(self, full_duration_s=self.full_duration_s / factor)

    def with_power_scale(self, power_scale: float) -> JobModel:
        """The same model with GPU power scaled to what NVML measured."""
        return replace(self, power_scale=power_scale)


@dataclass(frozen=True)
class ClusterPower:
    """Power the cluster draws besides its running jobs: idle GPUs, and nodes that are on
    (a node with every GPU idle can be powered down, CE-DLA's right-sizing)."""

    node_idle_w: float = 150.0  # CPUs, memory, fans, network of a node that is on
    gpu_idle_w: float = 50.0
    pue: float = 1.0

    def idle_power_w(self, nodes_on: int, idle_gpus_on: int) -> float:
        return (nodes_on * self.node_idle_w + idle_gpus_on * self.gpu_idle_w) * self.pue
