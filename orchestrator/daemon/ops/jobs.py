"""submit, cancel, ls, show and logs: the queue's requests."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.daemon.ops.views import iso, job_dict
from orchestrator.errors import GridshiftError, PermissionDenied, SpecError

CHUNK = 1 << 20  # log bytes per answer


def submit(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Queue jobs, all or none (or a cron template). The caller's CLI sends its working
    directory and environment (as Slurm's ``--export=ALL``); the user is the caller."""
    from orchestrator.nodes.inventory import largest_node_gpus
    from orchestrator.queue import store
    from orchestrator.queue.spec import build_spec, submitter_env
    from orchestrator.timeparse import utc_now

    jobs, cwd = args.get("jobs", list, []), args.get("cwd", str)
    env = submitter_env(args.get("env", dict, {}))
    lines, source = args.ints("lines"), args.get("file", str)
    if cwd is None or not os.path.isabs(cwd) or not all(isinstance(j, dict) for j in jobs):
        raise SpecError("malformed request: give cwd (absolute) and jobs (objects)")
    now = utc_now()
    if (cron := args.get("cron", str)) is not None:
        return _add_cron(ctx, caller, jobs[0], cron, args.get("window", str, ""), now, env)
    specs = []
    for i, raw in enumerate(jobs):
        try:
            specs.append(build_spec(raw, now=now, cwd=cwd, base_env=env, check_workdir=False))
        except GridshiftError as exc:
            if source is None:
                raise
            where = lines[i] if i < len(lines) else i + 1
            raise SpecError(f"{source}:{where}: {exc}") from None
    if not specs:
        raise SpecError(f"{source or 'the request'} holds no job specs")
    largest = largest_node_gpus(ctx.settings, ctx.db)
    from orchestrator.daemon.energy.gputypes import check_requested

    # a submit file's refusals name the line, as its specs' own errors do
    labels = None if source is None else [
        f"{source}:{lines[i] if i < len(lines) else i + 1}: " for i in range(len(specs))
    ]  # fmt: skip
    check_requested(specs, ctx.settings, ctx.db, labels)
    made = store.submit(ctx.db, specs, user=caller.user, now=now, largest_node_gpus=largest,
                        labels=labels)  # fmt: skip
    from orchestrator.daemon.ops.outlook import outlooks

    with ctx.db.read() as session:
        said = outlooks(session, ctx.settings, made, now)
    return {"jobs": [{"id": j.id, "state": j.state} | said[j.id] for j in made]}


def _add_cron(ctx, caller, raw: dict, cron: str, window: str, now, env) -> dict:
    from orchestrator.queue import cron as crons
    from orchestrator.timeparse import local_zone, parse_duration_s

    window_s = crons.check_window(parse_duration_s(window))
    local_zone()  # occurrences are read in it: an unknown TZ is the caller's one line
    if not isinstance(raw.get("workdir"), str) or not os.path.isabs(raw["workdir"]):
        raise SpecError("malformed request: a cron job's workdir must be absolute")
    from types import SimpleNamespace

    from orchestrator.daemon.energy.gputypes import check_requested
    from orchestrator.nodes.inventory import largest_node_gpus
    from orchestrator.queue.checks import too_wide
    from orchestrator.queue.spec import parse_gpu_type, parse_gpus

    gpus_min, _ = parse_gpus(raw.get("gpus", 1))
    if (why := too_wide(gpus_min, largest_node_gpus(ctx.settings, ctx.db))) is not None:
        raise SpecError(why)  # as a plain submit: every occurrence would be refused
    wants = SimpleNamespace(gpu_type=parse_gpu_type(raw.get("gpu_type")), gpus_min=gpus_min)
    check_requested([wants], ctx.settings, ctx.db)  # as a plain submit: some node has it
    row = ctx.db.write_retrying(
        lambda session: crons.add(session, raw, cron, window_s, caller.user, now, env)
    )
    upcoming = crons.next_fire(row, now)
    return {"cron_id": row.id, "next": iso(upcoming)}


def cancel(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Cancel jobs, all or none: each must be the caller's (root may cancel any)."""
    from orchestrator.queue import store
    from orchestrator.timeparse import utc_now

    user = caller.user if caller.uid != ctx.owner_uid else _as_root(caller)
    outcome = store.cancel(ctx.db, args.ints("job_ids"), user=user, now=utc_now())
    stopping = [job_id for job_id, result in outcome if result == "stopping"]
    no_daemon = bool(stopping) and not ctx.daemon_running()
    results = [[job_id, result] for job_id, result in outcome]
    if no_daemon and not ctx.shared:  # this process stops them, now (``stopnow``)
        from orchestrator.daemon.ops.stopnow import said, stop_now

        stopped = stop_now(ctx, stopping)
        results = [[i, said(stopped[i]) if i in stopped else r] for i, r in results]
    return {
        "results": results,
        "no_daemon": no_daemon and any(r == "stopping" for _, r in results),
        "grace_s": ctx.settings.cancel_grace_s,
    }


def _as_root(caller: Caller):
    """The daemon's own user may change every job of its queue."""
    from orchestrator.queue.ownership import User

    return User(name=caller.name, uid=0)


def ls(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """Every user's jobs, filtered (``ops.listing``)."""
    from orchestrator.daemon.ops.listing import ls as listed

    return listed(ctx, caller, args)


def show(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """One of the caller's jobs in full: spec, state, times, runs and history."""
    from orchestrator.queue import store
    from orchestrator.timeparse import utc_now

    job_id = _job_id(args)
    with ctx.db.read() as session:
        from orchestrator.daemon.ops.listing import has_budget, runtimes, unfinished

        job = store.get_job(session, job_id)
        _check_owner(ctx, caller, job)
        deps = store.dependencies(session, [job_id])
        data = job_dict(
            job, deps[job_id], str(ctx.settings.log_path(job_id)),
            store.latest_progress(session, [job_id]).get(job_id),
            waits_for=unfinished(session, deps).get(job_id),
            runtime_s=runtimes(session, [job], utc_now()).get(job_id),
            budgeted=has_budget(session, ctx.settings),
        )  # fmt: skip
        events = store.events(session, job_id)
        runs = store.attempts(session, job_id)
        from orchestrator.daemon.ops.outlook import estimate_keys

        data |= estimate_keys(session, ctx.settings, job)
    ran = [_run(a) for a in runs]
    # a start its deadline forced beyond the budget: what it was expected to spend
    forced = [r for r in ran if r["forced_g"] is not None]
    data["forced_g"] = round(sum(r["forced_g"] for r in forced), 3) if forced else None
    data["forced_kwh"] = round(sum(r["forced_kwh"] for r in forced), 6) if forced else None
    data["runs"] = ran
    data["events"] = [
        {"at": iso(e.at), "from": e.from_state, "to": e.to_state, "reason": e.reason,
         "actor": e.actor}
        for e in events
    ]  # fmt: skip
    return data


def _run(a) -> dict[str, Any]:
    slurm = a.handle and "slurm_job_id" in a.handle["data"]
    return {
        "attempt": a.number,
        "state": a.state,
        "node": a.node,
        "gpu_ids": list(a.gpu_ids),
        # a job across servers: each part's node and GPUs, by rank (None: one node)
        "parts": [{"node": p["node"], "gpu_ids": list(p["gpu_ids"])} for p in a.parts]
        if a.parts
        else None,
        "cap": a.cap,
        "started_at": iso(a.started_at),
        "finished_at": iso(a.finished_at),
        "exit_code": a.exit_code,
        "energy_kwh": None if a.energy_j is None else a.energy_j / 3.6e6,
        "energy_modelled": a.energy_modelled,
        "carbon_g": a.carbon_g,
        "cost": a.cost,
        "slurm": _slurm(a.handle) if slurm else None,
        "forced_g": None if a.forced_g is None else round(a.forced_g, 3),
        "forced_kwh": None if a.forced_wh is None else round(a.forced_wh / 1e3, 6),
        "backfilled_until": iso(a.backfilled_until),
    }


def _slurm(handle: dict) -> dict:
    """What Slurm says of an attempt now (squeue, then sacct): state, exit code, times."""
    from executors.errors import ExecutorError
    from orchestrator.nodes.backends import slurm_job

    job_id = handle["data"]["slurm_job_id"]
    try:
        job = slurm_job(job_id)
    except ExecutorError as exc:
        return {"job_id": job_id, "error": str(exc)}
    if job is None:
        return {"job_id": job_id, "error": "Slurm does not know this job any more"}
    return {
        "job_id": job_id,
        "state": job.state,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "started_at": iso(job.started_at),
        "ended_at": iso(job.ended_at),
        "energy_j": job.energy_j,
    }


def logs(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """A block of one of the caller's job logs: ``source`` (an index into the places its
    attempts wrote to; the last by default) from ``offset`` on. ``data`` is None while the
    file does not exist."""
    from orchestrator.queue import store

    job_id, offset = _job_id(args), args.get("offset", int, 0)
    with ctx.db.read() as session:
        job = store.get_job(session, job_id)
        _check_owner(ctx, caller, job)
        state = job.state
    sources, live = _sources(ctx, job_id)
    index = args.get("source", int, len(sources) - 1)
    if not 0 <= index < len(sources) or offset < 0:
        raise SpecError("malformed request: no such log source or offset")
    node, path, account = sources[index]
    block = (
        _read_local(path, offset) if not node else _read_remote(ctx, node, path, offset, account)
    )
    data = None if block is None else base64.b64encode(block).decode()
    size = _size(path) if not node else None  # for ``logs -n``: where the tail begins
    return {"state": state, "sources": len(sources), "live": live, "data": data, "size": size}


def _size(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _job_id(args: Args) -> int:
    job_id = args.get("job_id", int)
    if job_id is None:
        raise SpecError("malformed request: give job_id")
    return job_id


def _check_owner(ctx: OpContext, caller: Caller, job) -> None:
    if not ctx.privileged(caller) and job.uid != caller.uid:
        raise PermissionDenied(
            f"job {job.id} belongs to {job.user}; only they or root may see its details"
        )


def _sources(ctx: OpContext, job_id: int) -> tuple[list[tuple[str, str, str | None]], list[int]]:
    """Where the job's output is: this host's log, or each SSH server it ran on (with the
    account it ran as), in the order of its attempts (a job across servers: each part's
    own log, by rank); and which of them the last attempt writes to (``logs -f``). A
    server's log path is worked out here, never taken from what the server answered:
    that is the job's to forge."""
    from sqlmodel import select

    from orchestrator.daemon.launchspec import part_log_path
    from orchestrator.nodes.ssh import ssh_target
    from orchestrator.queue.models import Attempt

    with ctx.db.read() as session:
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
        ).all()
    ssh_nodes = {n.name: n for n in ctx.settings.nodes if n.executor == "ssh"}
    keys: list[tuple[str, str, str | None]] = []
    live: list[int] = []
    last = attempts[-1].number if attempts else None
    for number, node, data, rank in _runs(attempts):  # a job across servers: each part's
        name = Path(part_log_path(f"{job_id}.log", job_id, rank)).name
        if node in ssh_nodes:
            target = ssh_target(ssh_nodes[node])
            account = data.get("account")
            account = account if isinstance(account, str) and target.per_user else None
            if account is not None:
                target = target.for_account(account)
            key = (node, target.remote_path("logs", name), account)
        else:
            key = ("", str(ctx.settings.log_path(job_id).with_name(name)), None)
        if key not in keys:
            keys.append(key)
        if number == last and keys.index(key) not in live:
            live.append(keys.index(key))
    if not keys:
        return [("", str(ctx.settings.log_path(job_id)), None)], [0]
    return keys, live


def _runs(attempts) -> list[tuple[int, str, dict, int]]:
    """(attempt number, node, its handle's data, rank) of each attempt (rank 0), or of
    each part of one."""
    out = []
    for att in attempts:
        data = (att.handle or {}).get("data", {})
        data = data if isinstance(data, dict) else {}
        parts = data.get("parts") if isinstance(data.get("parts"), list) else None
        if not att.parts:
            out.append((att.number, att.node, data, 0))
            continue
        if not parts or len(parts) != len(att.parts):
            parts = [{}] * len(att.parts)  # not launched (yet): each part's own log all the same
        for rank, (part, handle) in enumerate(zip(att.parts, parts, strict=True)):
            part_data = handle.get("data") if isinstance(handle, dict) else None
            part_data = part_data if isinstance(part_data, dict) else {}
            out.append((att.number, str(part["node"]), part_data, rank))
    return out


def _read_local(path: str, offset: int) -> bytes | None:
    """Never through a symlink: the log is the daemon's to open, whoever asks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise PermissionDenied(f"cannot read {path}: permission denied") from None
    except OSError as exc:
        raise GridshiftError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        return fh.read(CHUNK)


def _read_remote(
    ctx: OpContext, node: str, path: str, offset: int, account: str | None
) -> bytes | None:
    """Read as the account the job ran as (a ``{user}`` node's submitter), never as the
    daemon's: the server's side opens it without following links."""
    from orchestrator.nodes import ssh as sshnodes

    cfg = next(n for n in ctx.settings.nodes if n.name == node)
    link = sshnodes.build_links([cfg], home=ctx.settings.home)[node]
    reader = link.for_account(account) if account is not None else link
    try:
        return reader.read(path, offset)
    finally:
        if reader is not link:
            reader.close()
        link.close()
