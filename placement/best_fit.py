"""Single-node placement by best fit: a job goes to the fullest node that can still hold
it, so whole nodes stay free for wide jobs. Within a node it takes the lowest free GPU
indices. (Buddy allocation aligned to the NVLink/PCIe topology replaces the in-node
choice later; the interface stays.)"""

from __future__ import annotations

from dataclasses import dataclass


class PlacementError(Exception):
    """A request that no node could ever satisfy."""


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    gpu_indices: tuple[int, ...]  # all GPUs of the node
    busy: frozenset[int] = frozenset()  # GPUs held by running or starting attempts

    @property
    def free(self) -> list[int]:
        return [i for i in self.gpu_indices if i not in self.busy]


@dataclass(frozen=True)
class Placement:
    node: str
    gpu_indices: tuple[int, ...]


def largest_node_gpus(nodes: list[NodeCapacity]) -> int:
    return max((len(n.gpu_indices) for n in nodes), default=0)


def place(nodes: list[NodeCapacity], gpus: int) -> Placement | None:
    """Choose GPUs for a one-node job of ``gpus`` GPUs; None when it must wait.

    Raises PlacementError when no node has that many GPUs at all. A zero-GPU job goes to
    the first node. Ties between equally full nodes go to the node listed first.
    """
    if gpus < 0:
        raise PlacementError(f"a job cannot ask for {gpus} GPUs")
    if not nodes:
        raise PlacementError("no nodes are configured")
    if gpus > largest_node_gpus(nodes):
        raise PlacementError(f"needs {gpus} GPUs; the largest node has {largest_node_gpus(nodes)}")
    fitting = [n for n in nodes if len(n.free) >= gpus]
    if not fitting:
        return None
    best = min(fitting, key=lambda n: len(n.free))  # min() keeps the first of equals
    return Placement(node=best.name, gpu_indices=tuple(best.free[:gpus]))
