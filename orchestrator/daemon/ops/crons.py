"""cron ls and cron rm: recurring job templates."""

from __future__ import annotations

import os

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.daemon.ops.views import iso
from orchestrator.errors import SpecError


def cron_ls(ctx: OpContext, caller: Caller, args: Args) -> list[dict]:
    """Every template, with its next occurrence, its jobs and why it is disabled or
    paused; another user's command shows its program only (as ``ls`` does), and their
    template's fault its kind only."""
    from sqlmodel import col, func, select

    from orchestrator.queue import cron
    from orchestrator.queue.models import Job
    from orchestrator.timeparse import utc_now

    now = utc_now()
    try:  # the expressions' clock times are read in the daemon's zone
        zone: str | None = str(cron.crontime.local_zone())
    except SpecError:  # an unknown TZ: each template's fault says so
        zone = None
    with ctx.db.read() as session:
        rows = cron.active(session)
        counts = dict(
            session.exec(
                select(Job.cron_id, func.count()).where(col(Job.cron_id).is_not(None))
                .group_by(Job.cron_id)
            ).all()
        )  # fmt: skip
    data = []
    for r in rows:
        spec = r.spec if isinstance(r.spec, dict) else {}
        command, fault = spec.get("command"), r.fault
        if not (ctx.privileged(caller) or r.uid == caller.uid):
            first = command[0] if isinstance(command, list) and command else str(command or "")
            command = [os.path.basename(str(first).split(" ")[0])] if first else []
            fault = fault and fault.split(":")[0]  # "paused": its reason may name paths
        data.append(
            {
                "id": r.id,
                "cron": r.cron,
                "window_s": r.window_s,
                "command": command,
                "name": spec.get("name"),
                "user": r.user,
                "last_occurrence": iso(r.last_fire),
                "next_occurrence": iso(cron.next_fire(r, now)),
                "fault": fault,
                "jobs": counts.get(r.id, 0),
                "zone": zone,
            }
        )
    return data


def cron_rm(ctx: OpContext, caller: Caller, args: Args) -> list[int]:
    """Remove templates, all or none: each must be the caller's (root may remove any)."""
    from orchestrator.queue import cron
    from orchestrator.timeparse import utc_now

    now = utc_now()
    user = caller.user
    if ctx.privileged(caller):
        from orchestrator.queue.ownership import User

        user = User(name=caller.name, uid=0)
    ids = list(dict.fromkeys(args.ints("template_ids")))
    return ctx.db.write_retrying(
        lambda session: [cron.remove(session, i, user, now).id for i in ids]
    )
