"""nodes: the nodes, their GPUs (as discovered), power limits, reachability and which
job holds each GPU. Every member sees them (``squeue`` shows as much)."""

from __future__ import annotations

from orchestrator.daemon.ops.base import Args, Caller, OpContext


def nodes(ctx: OpContext, caller: Caller, args: Args) -> list[dict]:
    """What ``nodes --json`` prints; ``refresh`` asks the SSH servers now."""
    from sqlmodel import col, select

    from orchestrator.nodes import ssh as sshnodes
    from orchestrator.nodes.inventory import resolve_nodes
    from orchestrator.queue.attempts import ON_GPU, AttemptState, parts_of, values
    from orchestrator.queue.models import Attempt, Gpu, Node

    refresh = bool(args.get("refresh", bool, False))
    resolved = resolve_nodes(ctx.settings)
    # the jobs on each GPU, the first to hold it first: two where jobs share one
    holders: dict[tuple[str, int], list[int]] = {}
    with ctx.db.read() as session:
        for att in session.exec(
            select(Attempt)
            .where(col(Attempt.state).in_(values([AttemptState.LAUNCHING, *ON_GPU])))
            .order_by(col(Attempt.id))
        ):
            for node, gpus in parts_of(att):  # a job across servers: each part's
                for gpu in gpus:
                    held = holders.setdefault((node, gpu), [])
                    if att.job_id not in held:
                        held.append(att.job_id)
        stored = {n.name: n for n in session.exec(select(Node)).all()}
        stored_gpus: dict[str, list[Gpu]] = {}
        for g in session.exec(select(Gpu).order_by(Gpu.node, Gpu.index)).all():
            stored_gpus.setdefault(g.node, []).append(g)
    live: dict = {}
    if refresh:  # a server right-sizing powered off is not asked (it cannot answer)
        asked = [c for c in ctx.settings.nodes if _answers(stored.get(c.name))]
        links = sshnodes.build_links(asked, home=ctx.settings.home)
        try:
            live = sshnodes.discover(links)
        finally:
            for link in links.values():
                link.close()
    keys = _gpu_keys()
    configs = {cfg.name: cfg for cfg in ctx.settings.nodes}
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
            held = holders.get((n.name, g["index"]), [])
            # job_id: the job that holds it (the first, where two share it); job_ids: all
            full["job_id"], full["job_ids"] = (held[0] if held else None), held
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
                # one account for every user's jobs there: one trust domain (SSH nodes)
                "shared_account": sshnodes.shared_account(configs[n.name])
                if n.name in configs
                else None,
                "reachable": reachable,
                "last_seen": last_seen,
                "error": error,
                # right-sizing: on, off, waking, powering off, wake failed (with why)
                **_power(row),
                "gpu_list": gpus,
            }
        )
    return data


def _gpu_keys() -> tuple[str, ...]:
    from orchestrator.nodes.ssh import LIVE_FIELDS

    return ("index", "uuid", "model", "memory_mb", *LIVE_FIELDS)


def _answers(row) -> bool:
    """Whether a server may answer: not powered off by right-sizing (one powering off may
    still answer, as the daemon's own restart asks it)."""
    from orchestrator.planning.devices.rightsizing import OFF

    return row is None or row.power_state != OFF


def _power(row) -> dict:
    since = row.power_since if row is not None else None
    return {
        "power": (row.power_state if row is not None else None) or "on",
        "power_since": since.isoformat() if since else None,
        "power_error": row.power_error if row is not None else None,
    }
