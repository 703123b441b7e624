"""Hand a plan to Slurm (``gridshift plan --submit``): gridshift decides when and how wide,
Slurm runs each job at its planned start.

Each queued job in the plan is submitted now with ``sbatch --begin`` at its planned start
(as a ``submitted`` attempt; the job is ``planned`` until Slurm starts it, and the daemon
follows it from there). A job handed over before that has not started yet is moved to its
new planned start with ``scontrol update StartTime=`` when the plan changed. A plan made
of several pieces (an interruptible job run in low-carbon windows) is handed over as its
first piece's start: Slurm runs it to its end.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import col, select

from executors.base import Handle
from orchestrator.errors import SpecError
from orchestrator.nodes.inventory import resolve_nodes
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt
from orchestrator.queue.ownership import User
from orchestrator.settings import Settings

MOVE_AFTER_S = 60.0  # a planned start that moved less than this stays where it is


def handed_over(db: Database) -> dict[int, Attempt]:
    """Jobs handed to Slurm that have not started: job id -> its submitted attempt."""
    with db.read() as session:
        rows = session.exec(
            select(Attempt).where(col(Attempt.state) == AttemptState.SUBMITTED)
        ).all()
    return {a.job_id: a for a in rows}


def slurm_nodes(nodes) -> list:
    slurm = [n for n in nodes if n.executor == "slurm"]
    if not slurm:
        raise SpecError(
            '--submit hands the plan to Slurm: configure a node with executor = "slurm"'
        )
    return slurm


def hand_over(
    settings: Settings, db: Database, rows: list[dict], now: datetime, user: User
) -> list[dict]:
    from orchestrator.daemon.dispatch import Dispatcher
    from orchestrator.nodes import backends

    nodes = resolve_nodes(settings)
    slurm = slurm_nodes(nodes)
    router = backends.route(
        backends.slurm_executors(settings, db.safe_url), default=backends.local_executor()
    )
    dispatcher = Dispatcher(settings=settings, db=db, executor=router, nodes=nodes, user=user)
    pending = handed_over(db)
    out = []
    for row in rows:
        begin = max(datetime.fromisoformat(row["start"]).astimezone(UTC), now)
        entry = {"id": row["id"], "start": begin.isoformat(), "gpus": row["gpus"]}
        att = pending.get(row["id"])
        if att is not None:
            entry["action"] = _move(db, router, att, begin)
        else:
            node = next((n for n in slurm if n.gpu_count >= row["gpus"]), None)
            if node is None:
                entry["action"] = "skipped: no Slurm node has that many GPUs"
            elif dispatcher.hand_over(row["id"], node.name, row["gpus"], begin, now):
                entry["action"] = "submitted"
                att = handed_over(db).get(row["id"])
            else:
                entry["action"] = "not submitted: see gridshift show"
        if att is not None:
            entry["slurm_job_id"] = att.handle.get("data", {}).get("slurm_job_id")
        out.append(entry)
    return out


def _move(db: Database, router, att: Attempt, begin: datetime) -> str:
    """Move a handed-over job to its new start, when it moved by a minute or more."""
    handle = Handle.from_dict(att.handle)
    planned = handle.data.get("begin_at")
    if planned and abs(datetime.fromisoformat(planned).timestamp() - begin.timestamp()) < (
        MOVE_AFTER_S
    ):
        return "unchanged"
    if not router.reschedule(handle, begin):
        return "started already"
    with db.write() as session:
        row = session.get(Attempt, att.id)
        row.handle = {**row.handle, "data": {**handle.data, "begin_at": begin.isoformat()}}
        session.add(row)
    return "moved"
