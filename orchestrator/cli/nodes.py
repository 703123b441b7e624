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
    from orchestrator.cli.render import print_json

    data = context.get(ctx).call("nodes", {"refresh": refresh})
    if as_json:
        print_json(data)
        return
    from orchestrator.cli.output.tables import Col, say, table

    columns = (
        Col("NODE"), Col("EXECUTOR", drop=3), Col("GPUS", right=True), Col("FREE", right=True),
        Col("MODEL", drop=4), Col("LIMITS W", drop=5), Col("SOURCE", drop=6),
        Col("HOST", drop=2), Col("STATE", free=True), Col("JOBS", drop=1),
    )  # fmt: skip
    rows = []
    for d in data:
        jobs = sorted({j for g in d["gpu_list"] for j in _held(g)})
        limits = sorted({g["power_limit_w"] for g in d["gpu_list"] if g["power_limit_w"]})
        state = {True: "up", False: "down", None: "-"}[d["reachable"]]
        if d["error"]:
            state = f"down: {d['error']}"
        if d.get("power", "on") != "on" or d.get("power_error"):  # right-sizing
            state = d["power"] + (f" ({d['power_error']})" if d.get("power_error") else "")
        rows.append([
            d["name"], d["executor"], str(d["gpus"]), str(d["gpus_free"]), d["gpu_model"] or "-",
            ",".join(f"{w:.0f}" for w in limits) or "-", d["gpu_source"], d["host"] or "-",
            state, ",".join(map(str, jobs)) or "-",
        ])  # fmt: skip
    table(columns, rows)
    for d in data:
        if d["shared_account"]:
            say(
                f"note: node {d['name']} runs every user's jobs as one account: they share "
                'one trust domain there (user = "{user}" runs each as its submitter)'
            )


def _held(gpu: dict) -> list:
    """The jobs on a GPU: both where two share it (``job_ids``; ``job_id`` alone from a
    daemon older than co-location)."""
    held = gpu.get("job_ids")
    if isinstance(held, list):
        return held
    return [gpu["job_id"]] if gpu.get("job_id") is not None else []
