"""Retention (``gridshift clean``): finished jobs' rows, and their run directories and logs
removed without following a link out of the queue's own folders.

What goes: the job, its attempts, both kinds of events, its dependency rows. What stays:
the per-day usage rows (the ledger carbon budgets add up: a budget must not forget what
was spent when jobs are cleaned; ``report``, which lists jobs, covers the jobs that
remain) and the calibration learnt from the job's runs.

A job is kept while an unfinished job waits on it, or while one of its attempts is not
final (e.g. orphaned on a server that is away: it must be fenced first). A finished job
that stays while a job it waited on goes gets an event saying so (``DROPPED``), which
``restart`` of it reads (``dropped_waits``): its copy cannot wait on a removed job.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, or_
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from orchestrator.queue.attempts import FINAL as ATTEMPT_FINAL
from orchestrator.queue.models import Attempt, AttemptEvent, Dependency, Event, Job
from orchestrator.queue.states import FINAL

#: The event on a job that stays when a job it waited on is removed.
DROPPED = "no longer waits on job {}: removed by clean"
_DROPPED = re.compile(r"no longer waits on job ([0-9]+): removed by clean")
_CHUNK = 500  # ids per IN (...): well under SQLite's limit on bound parameters
_RUN_DIR = re.compile(r"attempt-[0-9]+")


@dataclass
class Cleaned:
    job_ids: list[int] = field(default_factory=list)
    attempts: int = 0
    events: int = 0
    run_dirs: list[str] = field(default_factory=list)  # where the attempts ran (this host)


def finished_before(session: Session, before: datetime, uid: int | None) -> list[int]:
    """Ids of the jobs that finished before ``before`` (``uid``'s only, unless None) and
    may go."""
    waiting = aliased(Job)
    blocked = (
        select(Dependency.after_id)
        .join(waiting, col(waiting.id) == col(Dependency.job_id))
        .where(col(waiting.state).not_in([s.value for s in FINAL]))
    )
    unsettled = select(Attempt.job_id).where(
        col(Attempt.state).not_in([s.value for s in ATTEMPT_FINAL])
    )
    query = (
        select(Job.id)
        .where(col(Job.state).in_([s.value for s in FINAL]))
        .where(func.coalesce(col(Job.finished_at), col(Job.submitted_at)) < before)
        .where(col(Job.id).not_in(blocked))
        .where(col(Job.id).not_in(unsettled))
    )
    if uid is not None:
        query = query.where(col(Job.uid) == uid)
    return list(session.exec(query.order_by(col(Job.id))).all())


def describe(session: Session, job_ids: list[int]) -> Cleaned:
    """What removing these jobs removes (nothing is changed)."""
    out = Cleaned(job_ids=list(job_ids))
    for ids in _chunks(job_ids):
        out.attempts += _count(session, Attempt, Attempt.job_id, ids)
        out.events += _count(session, Event, Event.job_id, ids)
        out.events += _count(session, AttemptEvent, AttemptEvent.job_id, ids)
        out.run_dirs += session.exec(
            select(Attempt.run_dir).where(col(Attempt.job_id).in_(ids), col(Attempt.run_dir) != "")
        ).all()
    return out


def remove(session: Session, job_ids: list[int]) -> Cleaned:
    """Delete these jobs' rows in the caller's transaction (all or none)."""
    out = describe(session, job_ids)
    _note_dropped(session, job_ids)
    for ids in _chunks(job_ids):
        attempt_ids = select(Attempt.id).where(col(Attempt.job_id).in_(ids))
        session.exec(delete(AttemptEvent).where(col(AttemptEvent.attempt_id).in_(attempt_ids)))
        session.exec(delete(AttemptEvent).where(col(AttemptEvent.job_id).in_(ids)))
        session.exec(delete(Attempt).where(col(Attempt.job_id).in_(ids)))
        session.exec(delete(Event).where(col(Event.job_id).in_(ids)))
        session.exec(
            delete(Dependency).where(
                or_(col(Dependency.job_id).in_(ids), col(Dependency.after_id).in_(ids))
            )
        )
        session.exec(delete(Job).where(col(Job.id).in_(ids)))
    return out


def _note_dropped(session: Session, job_ids: list[int]) -> None:
    """An event on each job that stays and waited on one of ``job_ids``."""
    from orchestrator.timeparse import utc_now

    going, now = set(job_ids), utc_now()
    for ids in _chunks(job_ids):
        rows = session.exec(
            select(Dependency.job_id, Dependency.after_id, Job.state)
            .join(Job, col(Job.id) == col(Dependency.job_id))
            .where(col(Dependency.after_id).in_(ids))
        ).all()
        for job_id, after_id, state in rows:
            if job_id not in going:
                session.add(Event(job_id=job_id, at=now, from_state=state, to_state=state,
                                  reason=DROPPED.format(after_id), actor="clean"))  # fmt: skip


def dropped_waits(session: Session, job_id: int) -> list[int]:
    """The jobs ``job_id`` waited on that ``clean`` removed (``DROPPED``)."""
    reasons = session.exec(
        select(Event.reason).where(Event.job_id == job_id).where(Event.actor == "clean")
    ).all()
    return sorted({int(m.group(1)) for r in reasons if r and (m := _DROPPED.fullmatch(r))})


def _count(session: Session, table, column, ids: list[int]) -> int:
    return session.exec(select(func.count()).select_from(table).where(col(column).in_(ids))).one()


def _chunks(ids: list[int]) -> Iterable[list[int]]:
    for i in range(0, len(ids), _CHUNK):
        yield ids[i : i + _CHUNK]


# -- files ----------------------------------------------------------------------------
def remove_run_dir(runs_dir: Path, run_dir: str, *, dry_run: bool) -> int | None:
    """Bytes freed by removing an attempt's run directory; None when it is not one of
    ``runs_dir``'s (``attempt-N`` right inside it: anything else is left alone). Never
    through a link: the directory is reached from ``runs_dir``'s descriptor, a link in
    its place is removed as a link, and the tree is removed by descriptors
    (``shutil.rmtree`` with ``dir_fd``), which never follows one."""
    if not is_run_dir(runs_dir, run_dir):
        return None
    return _in_dir(runs_dir, Path(run_dir).name, dry_run, tree=True)


def is_run_dir(runs_dir: Path, run_dir: str) -> bool:
    path = Path(run_dir)
    return bool(run_dir) and path.parent == runs_dir and bool(_RUN_DIR.fullmatch(path.name))


def remove_log(logs_dir: Path, name: str, *, dry_run: bool) -> int | None:
    """Bytes freed by removing a job's log from ``logs_dir`` (a link is removed as a
    link); None when there is none."""
    return _in_dir(logs_dir, name, dry_run, tree=False)


def _in_dir(folder: Path, name: str, dry_run: bool, *, tree: bool) -> int | None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if tree and stat.S_ISDIR(st.st_mode):
            size = _tree_size(name, dir_fd)
            if not dry_run:
                shutil.rmtree(name, dir_fd=dir_fd)
            return size
        if not dry_run:
            os.unlink(name, dir_fd=dir_fd)  # a link goes, never what it names
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    finally:
        os.close(dir_fd)


def _tree_size(name: str, dir_fd: int) -> int:
    total = 0
    for _root, _dirs, files, fd in os.fwalk(name, dir_fd=dir_fd, follow_symlinks=False):
        for f in files:
            st = os.stat(f, dir_fd=fd, follow_symlinks=False)
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total
