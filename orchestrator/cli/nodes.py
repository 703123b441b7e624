"""``gridshift nodes``: the nodes, their GPUs and which job holds each."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import context


def nodes(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable keys).")] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Ask the SSH servers now (nvidia-smi over SSH).")
    ] = False,
) -> None:
    """List nodes and GPUs: local GPUs detected through NVML (or faked), SSH servers' as
    the daemon last discovered them (``--refresh``: asked now), with their power limits."""
    from sqlmodel import col, select

    from orchestrator import sshnodes
    from orchestrator.cli.render import console, print_json
    from orchestrator.inventory import resolve_nodes
    from orchestrator.models import Attempt, Gpu, Node

    c = context.get(ctx)
    resolved = resolve_nodes(c.settings)
    live: dict = {}
    if refresh:
        links = sshnodes.build_links(c.settings.nodes)
        try:
            live = sshnodes.discover(links)
        finally:
            for link in links.values():
                link.close()
    holders: dict[tuple[str, int], int] = {}
    with c.db.read() as session:
        for att in session.exec(
            select(Attempt).where(col(Attempt.state).in_(["launching", "running", "stopped"]))
        ):
            for gpu in att.gpu_ids:
                holders[(att.node, gpu)] = att.job_id
        stored = {n.name: n for n in session.exec(select(Node)).all()}
        stored_gpus: dict[str, list[Gpu]] = {}
        for g in session.exec(select(Gpu).order_by(Gpu.node, Gpu.index)).all():
            stored_gpus.setdefault(g.node, []).append(g)
    keys = _gpu_keys()
    data = []
    for n in resolved:
        row, reachable, last_seen, error = stored.get(n.name), None, None, None
        gpu_rows: list[dict] = [
            {"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mb": g.memory_mb}
            for g in n.gpus
        ]
        source = n.gpu_source
        if n.executor == "ssh":
            got = live.get(n.name)
            if isinstance(got, list):
                reachable, error = True, None
                gpu_rows = [{k: getattr(g, k) for k in keys} for g in got]
                source = "nvidia-smi"
            else:
                if row is not None:
                    reachable, error = row.reachable, row.error
                    last_seen = row.last_seen.isoformat() if row.last_seen else None
                if isinstance(got, str):
                    reachable, error = False, got
                if stored_gpus.get(n.name) and row is not None and row.gpu_source == "nvidia-smi":
                    gpu_rows = [{k: getattr(g, k) for k in keys} for g in stored_gpus[n.name]]
                    source = "nvidia-smi"
        gpus = []
        for g in gpu_rows:
            full = dict.fromkeys(keys)
            full.update(g)
            full["job_id"] = holders.get((n.name, g["index"]))
            gpus.append(full)
        busy = sum(1 for g in gpus if g["job_id"] is not None)
        data.append(
            {
                "name": n.name,
                "executor": n.executor,
                "gpus": len(gpus),
                "gpus_busy": busy,
                "gpus_free": len(gpus) - busy,
                "gpu_model": n.gpu_model or (gpus[0]["model"] if gpus else None),
                "gpu_source": source,
                "rack": n.rack,
                "host": n.host,
                "reachable": reachable,
                "last_seen": last_seen,
                "error": error,
                "gpu_list": gpus,
            }
        )
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NODE", "EXECUTOR", "GPUS", "FREE", "MODEL", "LIMITS W", "SOURCE", "HOST",
                   "STATE", "JOBS"):  # fmt: skip
        table.add_column(column)
    for d in data:
        jobs = sorted({g["job_id"] for g in d["gpu_list"] if g["job_id"] is not None})
        limits = sorted({g["power_limit_w"] for g in d["gpu_list"] if g["power_limit_w"]})
        state = {True: "up", False: "down", None: "-"}[d["reachable"]]
        if d["error"]:
            state = f"down: {d['error']}"
        table.add_row(
            d["name"],
            d["executor"],
            str(d["gpus"]),
            str(d["gpus_free"]),
            d["gpu_model"] or "-",
            ",".join(f"{w:.0f}" for w in limits) or "-",
            d["gpu_source"],
            d["host"] or "-",
            state,
            ",".join(map(str, jobs)) or "-",
        )
    console().print(table)


def _gpu_keys() -> tuple[str, ...]:
    from orchestrator.sshnodes import LIVE_FIELDS

    return ("index", "uuid", "model", "memory_mb", *LIVE_FIELDS)
