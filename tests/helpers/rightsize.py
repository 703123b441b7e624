"""A ``RightSizer`` on a real store, with stand-ins for the servers' answers (the
right-sizing tests')."""

from __future__ import annotations

import itertools
import time

from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology


def _sizer(tmp_path, argv_off, argv_on, probe=lambda _n: None, use=(0, 0.0), **extra):
    from orchestrator.daemon.energy.rightsizing import RightSizer
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Gpu, Node
    from orchestrator.settings.nodes import NodeConfig

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    cfg = dict(executor="ssh", host="h", gpus=2, power_off=argv_off, power_on=argv_on,
               idle_off_after="1s", wake="1s", wake_timeout="2s",
               power_timeout="1s")  # fmt: skip
    configs = [
        NodeConfig(name="a", **{**cfg, **extra}),
        NodeConfig(name="b", executor="ssh", host="h2", gpus=2),
    ]
    from datetime import UTC, datetime

    with db.write() as session:
        for c in configs:
            session.add(Node(name=c.name, executor="ssh", gpus=2, gpu_source="config",
                             updated_at=datetime.now(UTC), reachable=True,
                             last_seen=datetime.now(UTC)))  # fmt: skip
    with db.write() as session:  # what discovery found: GPUs unused (or ``use``)
        for c in configs:
            for i in range(2):
                session.add(Gpu(node=c.name, index=i, uuid=f"{c.name}{i}", model="A100",
                                memory_used_mb=use[0], utilization_pct=use[1],
                                power_draw_w=380))  # fmt: skip
    sizer = RightSizer.build(configs, {}, db)
    sizer.probe, sizer.ask_idle = probe, lambda _n: None
    ids = itertools.count()  # answers with a new boot_id each time: it booted again
    sizer.boot = lambda n: None if probe(n) is not None else f"boot-{next(ids)}"
    alloc = ClusterAllocator(
        ClusterTopology((NodeTopology.plain("a", 2), NodeTopology.plain("b", 2)))
    )
    return sizer, alloc, db


def _row(db, name):
    from orchestrator.queue.models import Node

    with db.read() as session:
        row = session.get(Node, name)
        return row.power_state, row.power_error


def _settle(sizer, alloc, now_s, state, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while sizer.nodes["a"].state != state:
        assert time.monotonic() < deadline, sizer.nodes["a"]
        time.sleep(0.05)
        sizer.step(alloc, [], now_s)
