"""Power caps on this host's GPUs, through ``GpuControl`` (Zeus's split: the job monitors
measure, the daemon acts).

A cap is a fraction of the GPU's maximum limit, clamped to the range the board accepts.
Each GPU goes back to its default limit when its job ends or the daemon stops; a daemon
that starts (after a crash too) sets every GPU to what the running jobs' plans say and the
rest back to their defaults. Where limits cannot be set (not root, or no settable limit)
the daemon says so once at start and plans without caps.

``ClusterCaps`` holds one ``PowerCaps`` per node: NVML (or the fakes) for the local node,
``nvidia-smi`` over SSH for each server.
"""

from __future__ import annotations

import logging

from executors.errors import ExecutorError, HostUnreachable
from executors.gpu import GpuControl

log = logging.getLogger(__name__)


class PowerCaps:
    def __init__(self, ctl: GpuControl | None, gpu_count: int, wanted: bool = True) -> None:
        self.ctl = ctl
        self.gpu_count = gpu_count
        self.enabled = False
        self.reason: str | None = None
        self.park_low = False  # under a site power limit: a GPU left goes to its lowest
        self.unreachable = False  # the server did not answer the probe (site limit: later)
        if not wanted:
            self.reason = "power caps are turned off (daemon.power_caps = false)"
        elif ctl is None or gpu_count == 0:
            self.reason = "no GPU control on this host"
        else:
            try:
                self.enabled = ctl.supports_power_limit(0)
            except ExecutorError as exc:
                self.reason = str(exc)
                self.unreachable = isinstance(exc, HostUnreachable)
            if not self.enabled and self.reason is None:
                self.reason = (
                    "setting GPU power limits needs privileges this daemon lacks (run it as "
                    "root) or GPUs that support them"
                )

    def apply(self, gpus: list[int], cap: float | None) -> float | None:
        """Cap ``gpus`` at ``cap`` of their maximum limit (None or 1.0: their default).
        Returns the limit set on the first, in watts, or None when nothing was set."""
        if not self.enabled or not gpus:
            return None
        if cap is None or cap >= 1.0 - 1e-9:
            self.restore(gpus)
            return None
        watts = None
        for i in gpus:
            low, high = self.ctl.power_limit_range_w(i)
            limit = min(high, max(low, cap * high))
            if abs(self.ctl.power_limit_w(i) - limit) > 0.5:
                self.ctl.set_power_limit_w(i, limit)
            watts = limit if watts is None else watts
        return watts

    def restore(self, gpus) -> None:
        if not self.enabled:
            return
        for i in gpus:
            try:
                if self.park_low:
                    default = self.ctl.power_limit_range_w(i)[0]
                else:
                    default = self.ctl.default_power_limit_w(i)
                if abs(self.ctl.power_limit_w(i) - default) > 0.5:
                    self.ctl.set_power_limit_w(i, default)
            except ExecutorError as exc:  # logged; the next start tries again
                log.warning("GPU %s: cannot restore the default power limit: %s", i, exc)

    def reconcile(self, held: dict[int, float | None]) -> None:
        """Every GPU to its running job's cap (``held``: GPU -> cap), the rest to default."""
        if not self.enabled:
            return
        for i in range(self.gpu_count):
            if i not in held:
                self.restore([i])
        for i, cap in held.items():
            if 0 <= i < self.gpu_count:  # a running job's GPU this host no longer has: left
                self.apply([i], cap)


class ClusterCaps:
    """Power caps on every node's GPUs."""

    def __init__(self, by_node: dict[str, PowerCaps]) -> None:
        self.by_node = by_node

    @property
    def enabled(self) -> bool:
        return any(c.enabled for c in self.by_node.values())

    @property
    def reason(self) -> str | None:
        off = [f"{n}: {c.reason}" for n, c in self.by_node.items() if not c.enabled]
        return "; ".join(dict.fromkeys(off)) or None

    def enabled_on(self, node: str) -> bool:
        caps = self.by_node.get(node)
        return caps is not None and caps.enabled

    def apply(self, node: str, gpus: list[int], cap: float | None) -> float | None:
        caps = self.by_node.get(node)
        return caps.apply(gpus, cap) if caps is not None else None

    def restore(self, node: str, gpus) -> None:
        caps = self.by_node.get(node)
        if caps is not None:
            caps.restore(gpus)

    def reconcile(self, held: dict[str, dict[int, float | None]], skip=frozenset()) -> None:
        """Each node's GPUs to its running jobs' caps (``held``: node -> GPU -> cap), the
        rest to default; nodes in ``skip`` (unreachable) are left for later. Local nodes
        share one host's GPUs (and one ``PowerCaps``)."""
        groups: dict[int, tuple[PowerCaps, dict[int, float | None], list[str]]] = {}
        for node, caps in self.by_node.items():
            if node not in skip:
                entry = groups.setdefault(id(caps), (caps, {}, []))
                entry[1].update(held.get(node, {}))
                entry[2].append(node)
        for caps, merged, names in groups.values():
            try:
                caps.reconcile(merged)
            except Exception as exc:  # a server that went away: logged, retried at start
                log.warning("node %s: cannot set power limits: %s", ",".join(names), exc)
