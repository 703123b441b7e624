"""Cluster topology: nodes, their GPUs in *buddy order*, and racks.

Buddy order lists a node's GPU indices so that every aligned block of 2, 4, 8 ... positions
holds GPUs that share the fastest link available to that many GPUs (an NVLink island, then
a PCIe switch, then a NUMA socket). It comes from declared islands, or from NVML's link
matrix (``order_from_link_levels``), or is the plain index order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeTopology:
    name: str
    order: tuple[int, ...]  # GPU indices in buddy order
    rack: str | None = None
    gpu: str | None = None  # its GPUs' type (v100, a100 ...): None, the cluster's one kind

    @property
    def gpus(self) -> int:
        return len(self.order)

    @classmethod
    def plain(
        cls, name: str, gpus: int, rack: str | None = None, gpu: str | None = None
    ) -> NodeTopology:
        return cls(name=name, order=tuple(range(gpus)), rack=rack, gpu=gpu)

    @classmethod
    def from_islands(
        cls, name: str, islands: list[list[int]], rack: str | None = None, gpu: str | None = None
    ) -> NodeTopology:
        """GPUs of one island (e.g. one NVLink domain) kept adjacent, islands in order."""
        order = [g for island in islands for g in sorted(island)]
        if len(set(order)) != len(order):
            raise ValueError(f"node {name}: a GPU appears in two islands")
        return cls(name=name, order=tuple(order), rack=rack, gpu=gpu)


@dataclass(frozen=True)
class ClusterTopology:
    nodes: tuple[NodeTopology, ...]

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")


def order_from_link_levels(levels: list[list[int]]) -> tuple[int, ...]:
    """Buddy order from a symmetric matrix of link levels between GPUs (lower is closer,
    as NVML's topology levels: 0 same board, 10 one PCIe switch, 20 several switches,
    30 host bridge, 40 same NUMA node, 50 across sockets). Recursive halving: each half
    is the group of GPUs closest to one another, so aligned blocks share the best links."""
    n = len(levels)

    def split(group: list[int]) -> list[int]:
        if len(group) <= 1:
            return group
        half = len(group) // 2
        seed = group[0]
        ranked = sorted(group, key=lambda g: (levels[seed][g], g))
        first = sorted(ranked[:half] if len(group) % 2 == 0 else ranked[: half + 1])
        rest = [g for g in group if g not in first]
        return split(first) + split(rest)

    return tuple(split(list(range(n))))
