"""Idle energy on the live daemon: what the cluster draws besides its jobs.

At every pass, each local or SSH node that is on draws, beside its jobs' GPUs (whose
energy each attempt's power log measures):

- each GPU no job holds: the node's ``gpu_idle_w``, else its measured idle draw, else
  50 W. Measured: on this host, through NVML's energy counters (the median over the GPUs
  no job held at two readings in a row, 10 s apart, of their energy between them over the
  time); on an SSH server, through ``nvidia-smi`` (the median ``power.draw`` the last
  discovery read on the GPUs no job holds);
- the server's own draw (``node_idle_w``, default 150 W: CPUs, memory, fans), its
  share for each GPU no job holds (× free GPUs / its GPUs: a powered-on idle server's
  whole draw; the busy GPUs' share is counted nowhere: jobs' energy is their GPUs' alone);

all times the PUE (the node's ``pue``, else ``[daemon] pue``, default 1.0), as the
simulator counts it (``sim.power``). A server that is off (right-sizing) or whose wake
failed draws nothing; one waking or powering off counts as on. The draw found at one
pass holds until the next: each stretch between passes is counted in memory and written
to the ``idle_usage`` ledger (per node and UTC hour, a stretch over several hours adding
to each hour's row, with its carbon from the daemon's signal; rows written before revision
0013 are per UTC day, under the day's 00:00) every ``FLUSH_EVERY_S``, in the same
transaction that moves the node's ``idle_until``, before which nothing is added again: a
daemon killed at any point counts each stretch at most once (and loses at most its last
10 s). Time no daemon watched (before its first pass, or a stretch between passes longer
than ``MAX_STRETCH_S``) is not counted. Slurm nodes are not counted: the partition's idle
machines are Slurm's (and its power saving's) business.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from orchestrator.planning.budgets import J_PER_KWH
from orchestrator.queue.db import Database
from orchestrator.settings.nodes import NodeConfig

DEFAULT_GPU_IDLE_W = 50.0  # planning.perfmodel.ClusterPower's
DEFAULT_HOST_IDLE_W = 150.0
MAX_STRETCH_S = 300.0  # longer: nobody watched (the daemon was down)
MEASURE_EVERY_S = 60.0  # how often the measured idle draws are read again
COUNT_EVERY_S = 10.0  # how often this host's idle GPUs' energy counters are read
FLUSH_EVERY_S = 10.0  # how often what was counted is written (a crash loses at most this)
JOB_KEYS = ("attempt", "job")  # allocator keys of what jobs hold


@dataclass
class IdleMeter:
    db: Database
    nodes: dict[str, str]  # name -> executor
    configs: dict[str, NodeConfig]
    pue: float = 1.0
    carbon: Callable[[float, float], float | None] = lambda _a, _b: None
    off: Callable[[str], bool] = lambda _name: False  # right-sizing: the server is off
    local_ctl: object = None  # executors.gpu GpuControl of this host's GPUs (local nodes)
    _counters: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    _pending: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    _last_s: float | None = None  # the last pass
    _flushed_s: float | None = None
    _watts: dict[str, float] = field(default_factory=dict)  # the draw since the last pass
    _measured: dict[str, float] = field(default_factory=dict)
    _measured_at: float = -1e18
    _counted_at: float = -1e18

    def draw_w(self, name: str, gpus: int, busy: int, facility: bool = True) -> float:
        """A node's idle draw now: its free GPUs and their share of the server's own, × its
        PUE (``facility=False``: IT power, no PUE)."""
        if self.nodes.get(name) not in ("local", "ssh") or self.off(name):
            return 0.0
        cfg = self.configs.get(name)
        gpu_w = cfg.gpu_idle_w if cfg is not None and cfg.gpu_idle_w is not None else None
        if gpu_w is None:
            gpu_w = self._measured.get(name, DEFAULT_GPU_IDLE_W)
        host_w = cfg.node_idle_w if cfg is not None else DEFAULT_HOST_IDLE_W
        pue = cfg.pue if cfg is not None and cfg.pue is not None else self.pue
        pue = pue if facility else 1.0
        free = max(0, gpus - busy)
        return (free * gpu_w + (host_w * free / gpus if gpus else host_w)) * pue

    def step(self, alloc, now_s: float) -> None:
        """Account the stretch since the last pass at the draw found then; find the draw
        from now on."""
        if alloc is None:
            return
        if now_s - self._measured_at >= MEASURE_EVERY_S:
            self._measured, self._measured_at = self._measure(alloc), now_s
        if now_s - self._counted_at >= COUNT_EVERY_S:  # reading counters costs: not each pass
            self._measured.update(self._counted(alloc, now_s))
            self._counted_at = now_s
        busy: dict[str, int] = {}
        for key, held in alloc.allocations().items():
            if isinstance(key, tuple) and key and key[0] in JOB_KEYS:
                for node, gpus in held.parts:
                    busy[node] = busy.get(node, 0) + len(gpus)
        watts = {
            name: self.draw_w(name, len(alloc.gpus_of(name)), busy.get(name, 0))
            for name in alloc.node_names
            if name in self.nodes
        }
        if self._last_s is not None:  # the stretch since the last pass, at its draw
            start_s = max(self._last_s, now_s - MAX_STRETCH_S)
            for name, w in self._watts.items():
                if w > 0 and now_s > start_s:
                    self._pending.setdefault(name, []).append((start_s, now_s, w))
        self._watts, self._last_s = watts, now_s
        if self._flushed_s is None:
            self._flushed_s = now_s
        if now_s - self._flushed_s >= FLUSH_EVERY_S:
            self.flush(now_s)

    def flush(self, now_s: float) -> None:
        """Write what was counted in memory since the last flush: each stretch no earlier
        than the node's ``idle_until`` (never counted twice), which moves to its end in
        the same transaction."""
        from orchestrator.queue.models import IdleUsage, Node

        pending, self._pending, self._flushed_s = self._pending, {}, now_s
        if not pending:
            return
        with self.db.write() as session:
            for name, stretches in pending.items():
                row = session.get(Node, name)
                if row is None:
                    continue
                floor = row.idle_until.timestamp() if row.idle_until else -1e18
                for a0, b0, w in stretches:
                    for a, b in _hours(max(a0, floor), b0):
                        hour = datetime.fromtimestamp(a, UTC).replace(minute=0, second=0,
                                                                      microsecond=0)  # fmt: skip
                        usage = session.get(IdleUsage, (name, hour)) or IdleUsage(
                            node=name, hour=hour, energy_j=0.0, carbon_g=0.0
                        )
                        usage.energy_j += w * (b - a)
                        integral = self.carbon(a, b)
                        if integral is None or usage.carbon_g is None:
                            usage.carbon_g = None
                        else:
                            usage.carbon_g += w * integral / J_PER_KWH
                        session.add(usage)
                end_s = max(b for _, b, _ in stretches)
                if end_s > floor:
                    row.idle_until = datetime.fromtimestamp(end_s, UTC)
                    session.add(row)

    def _measure(self, alloc) -> dict[str, float]:
        """Each SSH server's idle GPU draw as its last discovery measured it: the median
        ``power.draw`` of the GPUs no job holds now and that discovery saw unused (a GPU
        running work gridshift did not start is not idle; a sanity bound: 0 to 2 kW)."""
        from sqlmodel import col, select

        from orchestrator.nodes.idleask import gpu_use
        from orchestrator.queue.models import Gpu

        ssh = [n for n, ex in self.nodes.items() if ex == "ssh" and n in alloc.node_names]
        if not ssh:
            return {}
        out: dict[str, float] = {}
        with self.db.read() as session:
            rows = session.exec(select(Gpu).where(col(Gpu.node).in_(ssh))).all()
        for name in ssh:
            free = set(alloc.free_on(name))
            draws = [g.power_draw_w for g in rows if g.node == name and g.index in free
                     and gpu_use(g.memory_used_mb, g.utilization_pct) is None
                     and g.power_draw_w is not None and 0 <= g.power_draw_w <= 2000]  # fmt: skip
            if draws:
                out[name] = float(statistics.median(draws))
        return out

    def _counted(self, alloc, now_s: float) -> dict[str, float]:
        """This host's idle GPU draw from NVML's energy counters: for each GPU free now and
        at the last pass (at least a second ago), its energy between the two over the
        time; their median per node. Nothing where the GPUs have no counter."""
        ctl, out = self.local_ctl, {}
        if ctl is None:
            return out
        from executors.errors import ExecutorError

        for name in (n for n, ex in self.nodes.items() if ex == "local" and n in alloc.node_names):
            free = sorted(alloc.free_on(name))
            try:
                if not free or not ctl.supports_energy_counter(free[0]):
                    continue
                now_j = ctl.energy_many_j(free)
            except ExecutorError:
                continue
            draws = []
            for gpu, e in zip(free, now_j, strict=True):
                last = self._counters.get((name, gpu))
                if e is not None and last is not None and now_s - last[0] >= 1.0:
                    w = (e - last[1]) / (now_s - last[0])
                    if 0 <= w <= 2000:
                        draws.append(w)
            self._counters = {k: v for k, v in self._counters.items() if k[0] != name}
            self._counters |= {(name, g): (now_s, e) for g, e in zip(free, now_j, strict=True)
                               if e is not None}  # fmt: skip
            if draws:
                out[name] = float(statistics.median(draws))
        return out


def _hours(a: float, b: float):
    """``[a, b]`` cut at UTC hours."""
    while a < b:
        start = datetime.fromtimestamp(a, UTC)
        next_hour = (start + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
        end = min(b, next_hour.timestamp())
        yield a, end
        a = end
