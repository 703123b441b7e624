"""``GpuControl`` through the ``nvidia-smi`` command, for GPUs this process cannot reach
with NVML: a server behind SSH (the daemon runs ``nvidia-smi`` there) and the job monitor
on that server (which runs it locally). ``run`` executes an argument list and returns its
standard output, raising ``GpuControlError`` when the command fails.

Queries use ``--query-gpu=... --format=csv,noheader,nounits``; ``[N/A]`` and ``[Not
Supported]`` mean a GPU lacks the feature. ``total_energy_consumption`` is in millijoules.
Limits are set with ``nvidia-smi -i N -pl W``, behind ``sudo -n`` where configured.

Stdlib only: this module is shipped to the servers with the job monitor.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace

from executors.errors import GpuControlError
from executors.gpu.base import GpuControl, GpuInfo

Runner = Callable[[list[str]], str]
STATUS_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "power.draw",
    "power.limit",
    "power.default_limit",
    "power.min_limit",
    "power.max_limit",
)


@dataclass(frozen=True)
class GpuStatus:
    """One GPU as ``nvidia-smi`` reports it; None where it says N/A."""

    index: int
    uuid: str
    model: str
    memory_mb: int | None
    memory_used_mb: int | None
    utilization_pct: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    power_default_w: float | None
    power_min_w: float | None
    power_max_w: float | None

    def info(self) -> GpuInfo:
        return GpuInfo(index=self.index, uuid=self.uuid, model=self.model, memory_mb=self.memory_mb)


def local_runner(argv: list[str], timeout_s: float = 30.0) -> str:
    """Run ``argv`` on this machine (the monitor's side)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpuControlError(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise GpuControlError(_failure(argv, done.returncode, done.stdout + done.stderr))
    return done.stdout


def _failure(argv: list[str], code: int, text: str) -> str:
    last = text.strip().splitlines()[-1] if text.strip() else f"exit code {code}"
    return f"{' '.join(argv[:2])}: {last}"


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def query(
    run: Runner, fields: tuple[str, ...], indices: list[int] | None = None
) -> list[list[str]]:
    """Rows of ``fields`` per GPU (all GPUs, or ``indices``)."""
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if indices is not None:
        argv += ["-i", ",".join(str(i) for i in indices)]
    rows = []
    for line in run(argv).splitlines():
        if line.strip():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != len(fields):
                raise GpuControlError(f"nvidia-smi: unexpected line {line!r}")
            rows.append(cells)
    return rows


def gpu_status(run: Runner) -> list[GpuStatus]:
    """Every GPU: model, memory, use and power limits (discovery)."""
    out = []
    for cells in query(run, STATUS_FIELDS):
        n = [_number(c) for c in cells]
        try:
            index = int(cells[0])
        except ValueError:
            raise GpuControlError(f"nvidia-smi: bad GPU index {cells[0]!r}") from None
        out.append(
            GpuStatus(
                index=index,
                uuid=cells[1],
                model=cells[2],
                memory_mb=None if n[3] is None else int(n[3]),
                memory_used_mb=None if n[4] is None else int(n[4]),
                utilization_pct=n[5],
                power_draw_w=n[6],
                power_limit_w=n[7],
                power_default_w=n[8],
                power_min_w=n[9],
                power_max_w=n[10],
            )
        )
    return out


class SmiGpuControl(GpuControl):
    kind = "nvidia-smi"

    def __init__(self, run: Runner = local_runner, sudo: bool = False) -> None:
        self._run = run
        self._sudo = sudo
        self._status: dict[int, GpuStatus] | None = None
        self._energy_ok: dict[int, bool] = {}
        self._limit_ok: bool | None = None

    def _gpus(self) -> dict[int, GpuStatus]:
        """What nvidia-smi said at first asking (limits are kept up to date as set)."""
        if self._status is None:
            self._status = {g.index: g for g in gpu_status(self._run)}
        return self._status

    def _get(self, index: int) -> GpuStatus:
        gpu = self._gpus().get(index)
        if gpu is None:
            raise GpuControlError(f"no GPU {index} (nvidia-smi lists {sorted(self._gpus())})")
        return gpu

    def device_count(self) -> int:
        return len(self._gpus())

    def info(self, index: int) -> GpuInfo:
        return self._get(index).info()

    # -- energy -------------------------------------------------------------------------
    def supports_energy_counter(self, index: int) -> bool:
        if index not in self._energy_ok:
            try:
                self._energy_ok[index] = self.energy_many_j([index])[0] is not None
            except GpuControlError:
                self._energy_ok[index] = False
        return self._energy_ok[index]

    def energy_j(self, index: int) -> float:
        value = self.energy_many_j([index])[0]
        if value is None:
            raise GpuControlError(f"GPU {index} has no energy counter")
        return value

    def energy_many_j(self, indices: list[int]) -> list[float | None]:
        """Counters of several GPUs in one call (joules; None where there is none)."""
        rows = query(self._run, ("index", "total_energy_consumption"), indices)
        by_index = {int(r[0]): _number(r[1]) for r in rows}
        return [None if by_index.get(i) is None else by_index[i] / 1000.0 for i in indices]

    # -- power limits -------------------------------------------------------------------
    def supports_power_limit(self, index: int) -> bool:
        """Tried, not guessed: setting the present limit again needs the same rights."""
        if self._limit_ok is None:
            gpu = self._get(index)
            if gpu.power_limit_w is None or gpu.power_min_w is None:
                self._limit_ok = False
            else:
                try:
                    self.set_power_limit_w(index, gpu.power_limit_w)
                    self._limit_ok = True
                except GpuControlError:
                    self._limit_ok = False
        return self._limit_ok

    def power_limit_w(self, index: int) -> float:
        return self._need(self._get(index).power_limit_w, index, "limit")

    def default_power_limit_w(self, index: int) -> float:
        return self._need(self._get(index).power_default_w, index, "default limit")

    def power_limit_range_w(self, index: int) -> tuple[float, float]:
        gpu = self._get(index)
        return (
            self._need(gpu.power_min_w, index, "minimum limit"),
            self._need(gpu.power_max_w, index, "maximum limit"),
        )

    def set_power_limit_w(self, index: int, limit_w: float) -> None:
        argv = ["nvidia-smi", "-i", str(index), "-pl", f"{limit_w:.2f}"]
        self._run(["sudo", "-n", *argv] if self._sudo else argv)
        if self._status is not None and index in self._status:
            self._status[index] = replace(self._status[index], power_limit_w=float(limit_w))

    @staticmethod
    def _need(value: float | None, index: int, what: str) -> float:
        if value is None:
            raise GpuControlError(f"GPU {index}: nvidia-smi reports no power {what}")
        return value
