"""hold, release, edit, restart and states (for ``wait``): pueue's verbs, as requests
(``orchestrator.queue.changes``). Each job must be the caller's; root and the daemon's
user may change every job."""

from __future__ import annotations

from typing import Any

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.errors import SpecError

#: What ``states`` answers about any job (``ls`` shows as much of everyone's).
FINISHED = ("completed", "failed", "cancelled", "lost")


def acting_user(ctx: OpContext, caller: Caller):
    """The caller as the store checks them: the daemon's own user acts as root does."""
    from orchestrator.queue.ownership import User

    return User(name=caller.name, uid=0) if ctx.privileged(caller) else caller.user


def _ids(args: Args) -> list[int]:
    ids = args.ints("job_ids")
    if not ids:
        raise SpecError("give at least one job id")
    return ids


def hold(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.queue import changes
    from orchestrator.timeparse import utc_now

    done = changes.hold(ctx.db, _ids(args), user=acting_user(ctx, caller), now=utc_now())
    return {"results": [[i, r] for i, r in done]}


def release(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.queue import changes
    from orchestrator.timeparse import utc_now

    done = changes.release(ctx.db, _ids(args), user=acting_user(ctx, caller), now=utc_now())
    return {"results": [[i, r] for i, r in done]}


def _type_check(ctx: OpContext):
    """``submit``'s check of a job's GPU type and its width in that type's GPUs, for one
    spec, against the cluster as it is read now (before the change's transaction)."""
    from orchestrator.daemon.energy.gputypes import check_types, cluster_types

    held = cluster_types(ctx.settings, ctx.db)
    return lambda spec: check_types([spec], held)


def restart(ctx: OpContext, caller: Caller, args: Args) -> dict:
    from orchestrator.nodes.inventory import largest_node_gpus
    from orchestrator.queue import changes
    from orchestrator.timeparse import utc_now

    largest = largest_node_gpus(ctx.settings, ctx.db)
    done = changes.restart(ctx.db, _ids(args), user=acting_user(ctx, caller), now=utc_now(),
                           largest_node_gpus=largest, check=_type_check(ctx))  # fmt: skip
    return {"jobs": [{"id": new, "restart_of": old, "note": note} for old, new, note in done]}


def edit(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """``changes``: the fields as ``submit`` takes them (strings, an integer priority)."""
    from orchestrator.nodes.inventory import largest_node_gpus
    from orchestrator.queue import changes
    from orchestrator.timeparse import utc_now

    job_id = args.get("job_id", int)
    fields = args.get("changes", dict, {})
    if job_id is None:
        raise SpecError("malformed request: give job_id")
    largest = largest_node_gpus(ctx.settings, ctx.db)
    return changes.edit(ctx.db, job_id, fields, user=acting_user(ctx, caller), now=utc_now(),
                        largest_node_gpus=largest, check=_type_check(ctx))  # fmt: skip


def states(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Each job's state and, once it ended, its exit code (its reason to its owner only);
    None for a job that is not there (never, or removed by ``clean``). One short read."""
    from sqlmodel import col, select

    from orchestrator.queue.models import Job

    ids = _ids(args)
    with ctx.db.read() as session:
        rows = session.exec(
            select(Job.id, Job.state, Job.exit_code, Job.reason, Job.uid).where(
                col(Job.id).in_(ids)
            )
        ).all()
    seen: dict[int, Any] = {i: None for i in ids}
    for job_id, state, exit_code, reason, uid in rows:
        mine = ctx.privileged(caller) or uid == caller.uid
        seen[job_id] = {
            "state": state,
            "exit_code": exit_code if state in FINISHED else None,
            "reason": reason if mine and state in FINISHED else None,
        }
    return {"jobs": [[i, seen[i]] for i in dict.fromkeys(ids)]}
