"""``gridshift nodes``: the nodes, their GPUs and which job holds each."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context


def nodes(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable keys).")] = False,
) -> None:
    """List nodes and GPUs from the config (local GPUs detected through NVML, or faked)."""
    from sqlmodel import col, select

    from orchestrator.cli.render import console, print_json
    from orchestrator.inventory import resolve_nodes
    from orchestrator.models import Attempt

    c = context.get(ctx)
    resolved = resolve_nodes(c.settings)
    holders: dict[tuple[str, int], int] = {}
    with c.db.read() as session:
        for att in session.exec(
            select(Attempt).where(col(Attempt.state).in_(["launching", "running"]))
        ):
            for gpu in att.gpu_ids:
                holders[(att.node, gpu)] = att.job_id
    data = []
    for n in resolved:
        gpus = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mb": g.memory_mb,
                "job_id": holders.get((n.name, g.index)),
            }
            for g in n.gpus
        ]
        busy = sum(1 for g in gpus if g["job_id"] is not None)
        data.append(
            {
                "name": n.name,
                "executor": n.executor,
                "gpus": n.gpu_count,
                "gpus_busy": busy,
                "gpus_free": n.gpu_count - busy,
                "gpu_model": n.gpu_model,
                "gpu_source": n.gpu_source,
                "rack": n.rack,
                "host": n.host,
                "gpu_list": gpus,
            }
        )
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NODE", "EXECUTOR", "GPUS", "FREE", "MODEL", "SOURCE", "RACK", "HOST", "JOBS"):
        table.add_column(column)
    for d in data:
        jobs = sorted({g["job_id"] for g in d["gpu_list"] if g["job_id"] is not None})
        table.add_row(
            d["name"],
            d["executor"],
            str(d["gpus"]),
            str(d["gpus_free"]),
            d["gpu_model"] or "-",
            d["gpu_source"],
            d["rack"] or "-",
            d["host"] or "-",
            ",".join(map(str, jobs)) or "-",
        )
    console().print(table)
