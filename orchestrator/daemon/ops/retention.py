"""clean: remove finished jobs' rows, run directories and logs (``queue.retention``)."""

from __future__ import annotations

import logging
import math
from datetime import timedelta

from orchestrator.daemon.ops.base import Args, Caller, OpContext
from orchestrator.daemon.ops.views import iso
from orchestrator.errors import SpecError

log = logging.getLogger(__name__)


def clean(ctx: OpContext, caller: Caller, args: Args) -> dict:
    """The caller's jobs that finished more than ``older_than_s`` ago (root's and the
    daemon's user's: everyone's): their rows in one transaction, then their files.
    ``dry_run``: only what would go."""
    from orchestrator.queue import retention
    from orchestrator.timeparse import utc_now

    older_than_s = args.get("older_than_s", float) if isinstance(
        args.raw.get("older_than_s"), float
    ) else args.get("older_than_s", int)  # fmt: skip
    dry_run = bool(args.get("dry_run", bool, False))
    if older_than_s is None or not math.isfinite(older_than_s) or older_than_s < 0:
        raise SpecError("malformed request: older_than_s must be a finite number >= 0")
    try:
        before = utc_now() - timedelta(seconds=older_than_s)
    except OverflowError:
        raise SpecError(f"--older-than {older_than_s:g}s reaches before year 1") from None
    uid = None if ctx.privileged(caller) else caller.uid

    def rows(session):
        ids = retention.finished_before(session, before, uid)
        return (retention.describe if dry_run else retention.remove)(session, ids)

    if dry_run:
        with ctx.db.read() as session:
            done = rows(session)
    else:
        done = ctx.db.write_retrying(rows)
    settings, freed, skipped = ctx.settings, 0, []
    run_dirs = logs = 0
    for run_dir in done.run_dirs:
        if not retention.is_run_dir(settings.runs_dir, run_dir):
            skipped.append(f"{run_dir}: not a run directory in {settings.runs_dir}, left alone")
            continue
        size = _files(retention.remove_run_dir, settings.runs_dir, run_dir, dry_run, skipped)
        if size is not None:
            run_dirs, freed = run_dirs + 1, freed + size
    for job_id in done.job_ids:
        name = settings.log_path(job_id).name
        size = _files(retention.remove_log, settings.logs_dir, name, dry_run, skipped)
        if size is not None:
            logs, freed = logs + 1, freed + size
    if done.job_ids and not dry_run:
        log.info("clean by %s: %d job(s) finished before %s removed", caller.name,
                 len(done.job_ids), iso(before))  # fmt: skip
    return {
        "dry_run": dry_run,
        "before": iso(before),
        "jobs": done.job_ids,
        "attempts": done.attempts,
        "events": done.events,
        "run_dirs": run_dirs,
        "logs": logs,
        "bytes": freed,
        "skipped": skipped,
    }


def _files(remove, folder, name: str, dry_run: bool, skipped: list[str]) -> int | None:
    """One file or tree removed, or None; what could not be is said in ``skipped`` (its
    rows are gone: the next clean does not see it again, so it is said now)."""
    try:
        return remove(folder, name, dry_run=dry_run)
    except OSError as exc:
        skipped.append(f"{name}: {exc.strerror or exc}")
        return None
