"""The cluster as the config declares it: nodes and their GPUs, the local node's GPUs
detected through NVML (or pretended with ``fake_gpus``)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, delete, select

from executors.gpu import GpuInfo, detect_gpus
from executors.gpu.fake import FakeGpuControl
from orchestrator.queue.checks import GpuLimit
from orchestrator.queue.models import Gpu, Node
from orchestrator.settings import NodeConfig, Settings
from placement.topology import ClusterTopology, NodeTopology, order_from_link_levels


@dataclass(frozen=True)
class ResolvedNode:
    name: str
    executor: str
    gpus: tuple[GpuInfo, ...]
    gpu_source: str  # config, nvml, fake or none
    gpu_model: str | None = None
    rack: str | None = None
    host: str | None = None
    fake: bool = False
    config: NodeConfig | None = field(default=None, compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def model_of(self, indices: list[int]) -> str | None:
        """The GPU model of these GPUs (the first one's; a node's GPUs are alike), else
        the node's configured ``gpu_model``."""
        by_index = {g.index: g.model for g in self.gpus}
        found = next((by_index[i] for i in indices if by_index.get(i)), None)
        return found or self.gpu_model


def resolve_nodes(
    settings: Settings, *, detect=detect_gpus, discovered: dict[str, list[GpuInfo]] | None = None
) -> list[ResolvedNode]:
    """The configured nodes and their GPUs: the local node's through NVML (or fakes), an
    SSH node's as ``discovered`` through nvidia-smi (at most its declared ``gpus``), or
    as declared."""
    configs = settings.nodes or [NodeConfig(name=socket.gethostname(), executor="local")]
    detected: list[GpuInfo] | None = None
    nodes = []
    for cfg in configs:
        fake_count = cfg.fake_gpus
        if fake_count is None and cfg.executor == "local":
            fake_count = settings.fake_gpus
        if fake_count is not None:
            gpus = FakeGpuControl(fake_count, model=cfg.gpu_model or "fake-gpu").devices()
            source = "fake"
        elif cfg.executor == "local":
            if detected is None:
                detected = detect()
            gpus, source = detected, ("nvml" if detected else "none")
            if cfg.gpus is not None:  # declared: use that many of the detected ones
                gpus = detected[: cfg.gpus] if detected else _declared(cfg)
                source = "nvml" if detected else "config"
        elif discovered and cfg.name in discovered:
            gpus, source = discovered[cfg.name], "nvidia-smi"
            if cfg.gpus is not None:
                gpus = gpus[: cfg.gpus]
        else:
            gpus, source = _declared(cfg), "config"
        model = cfg.gpu_model or (gpus[0].model if gpus else None)
        nodes.append(
            ResolvedNode(
                name=cfg.name,
                executor=cfg.executor,
                gpus=tuple(gpus),
                gpu_source=source,
                gpu_model=model,
                rack=cfg.rack,
                host=cfg.host,
                fake=source == "fake",
                config=cfg,
            )
        )
    return nodes


def largest_node_gpus(settings: Settings, db) -> GpuLimit | None:
    """The most GPUs one job may have (``job_gpu_limit``) as far as is known here: an SSH
    server's count as declared or as the daemon last discovered it; None while some
    server's is unknown."""
    from sqlmodel import func, select

    largest = 0
    counts: dict[str, tuple[str, int]] = {}
    with db.read() as session:
        for node in resolve_nodes(settings):
            count = node.gpu_count
            if node.executor == "ssh" and node.config is not None and node.config.gpus is None:
                count = session.exec(
                    select(func.count()).select_from(Gpu).where(Gpu.node == node.name)
                ).one()
                if not count:
                    return None
            largest = max(largest, count)
            counts[node.name] = (node.executor, count)
    return job_gpu_limit(counts)


def job_gpu_limit(counts: dict[str, tuple[str, int]]) -> GpuLimit:
    """The most GPUs one job may have (``counts``: node -> (executor, GPUs)): the largest
    node's, or every SSH server's together where there are several (a job wider than one
    server runs on whole SSH servers), with why in words."""
    largest = max((n for _, n in counts.values()), default=0)
    ssh = [n for kind, n in counts.values() if kind == "ssh" and n]
    words = f"the largest node has {largest}"
    if len(ssh) < 2 or sum(ssh) <= largest:
        return GpuLimit(largest, words)
    return GpuLimit(sum(ssh), f"{words} and the {len(ssh)} SSH servers together {sum(ssh)}")


def widest_job_gpus(nodes: list[ResolvedNode]) -> GpuLimit:
    """``job_gpu_limit`` over resolved nodes (the daemon's)."""
    return job_gpu_limit({n.name: (n.executor, n.gpu_count) for n in nodes})


def _declared(cfg: NodeConfig) -> list[GpuInfo]:
    model = cfg.gpu_model or "unknown"
    return [GpuInfo(index=i, uuid=f"{cfg.name}-gpu{i}", model=model) for i in range(cfg.gpus or 0)]


def topology(nodes: list[ResolvedNode], *, link_levels=None) -> ClusterTopology:
    """Buddy order per node: declared ``nvlink_islands``, else NVML's link matrix for a
    local node with real GPUs (``link_levels``), else the index order."""
    out = []
    for n in nodes:
        indices = [g.index for g in n.gpus]
        islands = n.config.nvlink_islands if n.config else None
        if islands:
            node = NodeTopology.from_islands(n.name, islands, rack=n.rack)
        elif n.gpu_source == "nvml" and link_levels is not None and len(indices) > 1:
            levels = link_levels(indices)
            order = order_from_link_levels(levels) if levels else tuple(range(len(indices)))
            node = NodeTopology(n.name, tuple(indices[p] for p in order), rack=n.rack)
        else:
            node = NodeTopology(n.name, tuple(indices), rack=n.rack)
        out.append(node)
    return ClusterTopology(tuple(out))


def sync_inventory(session: Session, nodes: list[ResolvedNode], now: datetime) -> None:
    """Replace the stored nodes and GPUs with ``nodes`` (the daemon does this at start);
    each GPU's power limit range as discovery last read it is kept (a server off or down
    now: the site power limit counts it by that; one that answers has it read again)."""
    ranges = ("power_min_w", "power_max_w", "power_default_w")
    kept = {(g.node, g.index): {k: getattr(g, k) for k in ranges}
            for g in session.exec(select(Gpu)).all()}  # fmt: skip
    session.exec(delete(Gpu))
    session.exec(delete(Node))
    session.flush()
    for n in nodes:
        session.add(
            Node(
                name=n.name,
                executor=n.executor,
                gpus=n.gpu_count,
                gpu_model=n.gpu_model,
                rack=n.rack,
                host=n.host,
                gpu_source=n.gpu_source,
                updated_at=now,
            )
        )
    session.flush()
    for n in nodes:
        for g in n.gpus:
            session.add(Gpu(node=n.name, index=g.index, uuid=g.uuid, model=g.model,
                            memory_mb=g.memory_mb, **kept.get((n.name, g.index), {})))  # fmt: skip
