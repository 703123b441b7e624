"""The notes of jobs that wait for a right-sized server to wake (``show``'s ``why:``,
``ls`` PLAN, ``wait_reason`` "wake"), written on the jobs' rows as any plan note is
(``Job.plan_note``). The daemon's right-sizing says which jobs wait for which server and
why (``daemon.energy.levers.Levers.wake_notes``); this writes what changed, and clears a
note it wrote once the job no longer waits for that server (it started, was cancelled or
held, or the server answers): the note is the daemon's word, never a user's."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlmodel import select

from orchestrator.queue.db import Database
from orchestrator.queue.models import Job
from orchestrator.queue.states import JobState

WAITING = (JobState.QUEUED.value, JobState.PLANNED.value)


@dataclass
class WakeNotes:
    written: dict[int, str] = field(default_factory=dict)  # job id -> the note written

    def write(self, db: Database, notes: dict[int, str]) -> set[int]:
        """Each job's note of ``notes`` where its row says otherwise; a note written before
        and not in ``notes`` any more cleared (unless another took its place). Returns
        the jobs of ``notes`` that no longer wait (for the caller to forget)."""
        ids = sorted(set(notes) | set(self.written))
        if not ids:
            return set()
        query = select(Job.id, Job.state, Job.plan_note).where(Job.id.in_(ids))  # type: ignore[attr-defined]
        with db.read() as session:
            rows = {i: (state, note) for i, state, note in session.exec(query).all()}
        unseen = (None, None)
        gone = {j for j in notes if rows.get(j, unseen)[0] not in WAITING}
        todo = {j: n for j, n in notes.items() if j not in gone and rows[j][1] != n}
        stale = {j: n for j, n in self.written.items()
                 if (j not in notes or j in gone) and rows.get(j, unseen)[1] == n}  # fmt: skip
        self.written = {j: n for j, n in notes.items() if j not in gone and j not in todo}
        if not todo and not stale:
            return gone
        with db.write() as session:
            for job_id, note in stale.items():
                row = session.get(Job, job_id)
                if row is not None and row.plan_note == note:  # no other note took its place
                    row.plan_note = None
                    session.add(row)
            for job_id, note in todo.items():
                row = session.get(Job, job_id)
                if row is not None and row.state in WAITING:
                    row.plan_note = note
                    session.add(row)
                    self.written[job_id] = note
        return gone
