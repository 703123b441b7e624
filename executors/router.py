"""One executor per node behind the executor interface: the daemon holds a ``NodeRouter``
and stays unaware of which node runs where. Handles carry their node's name; a handle
without one (stored by an older daemon) belongs to the local executor."""

from __future__ import annotations

from datetime import datetime

from executors import gang
from executors.base import Executor, Handle, LaunchSpec, PollResult
from executors.errors import LaunchError


class NodeRouter(Executor):
    name = "router"

    def __init__(self, by_node: dict[str, Executor], default: Executor) -> None:
        self.by_node = by_node
        self.default = default

    def _for(self, node: str | None) -> Executor:
        return self.by_node.get(node or "", self.default)

    def _of(self, handle: Handle) -> Executor:
        return self._for(handle.data.get("node"))

    def _do_launch(self, spec: LaunchSpec) -> Handle:
        handle = self._for(spec.node).launch(spec)
        if spec.node is not None and handle.data.get("node") is None:
            handle = Handle(handle.attempt_id, handle.run_dir, {**handle.data, "node": spec.node})
        return handle

    def _do_poll(self, handle: Handle) -> PollResult:
        if gang.is_gang(handle):  # a job across servers: each part on its node's
            return gang.poll(self.poll, self.signal, handle)
        return self._of(handle).poll(handle)

    def _do_signal(self, handle: Handle, sig: int) -> bool:
        if gang.is_gang(handle):
            return gang.signal(self.signal, handle, sig)
        return self._of(handle).signal(handle, sig)

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        if gang.is_gang(handle):  # rank 0's report
            return self.progress(gang.parts(handle)[0])
        return self._of(handle).progress(handle)

    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None:
        return self._for(node).recover(attempt_id, run_dir, node)

    def launch_parts(self, specs: list[LaunchSpec], run_dir: str) -> Handle:
        if not specs or not specs[0].command:
            raise LaunchError("a job across servers needs its parts and a command")
        return gang.launch(self.launch, self.fence, specs, run_dir)

    def recover_parts(
        self, attempt_id: int, run_dir: str, nodes: list[str], interruptible: bool
    ) -> Handle | None:
        if len(nodes) == 1:
            return self.recover(attempt_id, run_dir, nodes[0])
        return gang.recover(self.recover, self.fence, attempt_id, run_dir, nodes, interruptible)

    def _backends(self) -> list[Executor]:
        out: list[Executor] = [self.default]
        for ex in self.by_node.values():
            if all(ex is not seen for seen in out):
                out.append(ex)
        return out

    def refresh(self, handles: list[Handle]) -> None:
        handles = [p for h in handles for p in (gang.parts(h) if gang.is_gang(h) else [h])]
        for ex in self._backends():
            ex.refresh([h for h in handles if self._of(h) is ex])

    def unreachable_nodes(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for ex in self._backends():
            out.update(ex.unreachable_nodes())
        return out

    def fence(self, handle: Handle) -> bool:
        if gang.is_gang(handle):  # each part on its node's executor
            return gang.fence(self.fence, handle)
        return self._of(handle).fence(handle)

    def foreign_gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ex in self._backends():
            out.update(ex.foreign_gpus())
        return out

    def reschedule(self, handle: Handle, begin_at: datetime) -> bool:
        return self._of(handle).reschedule(handle, begin_at)

    def release(self, handle: Handle) -> None:
        self._of(handle).release(handle)

    def withdraw(self, handle: Handle) -> None:
        self._of(handle).withdraw(handle)

    def close(self) -> None:
        for ex in self._backends():
            ex.close()
