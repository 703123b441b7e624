"""``cancel`` with no daemon serving a single-user queue: the running jobs it cancelled
are stopped at once, as the daemon would stop them (``Reaper.stop_cancelled``: SIGTERM to
the job's process group, SIGKILL after ``cancel_grace_s``), and their end is recorded as
the daemon records it (``Reaper.reap``: the attempt accounted from its power log, the job
cancelled). Only jobs on this host's nodes: an SSH server's or Slurm's wait for a daemon.
Without a daemon there is no grid signal: the attempt's energy is accounted from its whole
power log; the carbon and cost a daemon already counted (up to the attempt's
``accounted_until``) are kept, day by day, and what ran after that has none: the job's
reason says up to when carbon was counted (``KeptCarbon``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlmodel import Session, col, select

from orchestrator.accounting.meter import Accountant, Totals, job_totals
from orchestrator.daemon.ops.base import OpContext
from orchestrator.queue.models import Attempt, Job, Usage

POLL_S = 0.05
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the monitor's exit record


@dataclass
class Stopped:
    job_id: int
    ended: bool
    killed: bool
    after_s: float


def stop_now(ctx: OpContext, job_ids: list[int]) -> dict[int, Stopped]:
    """Stop the running attempts of ``job_ids`` (their cancel already requested) on this
    host; by job id, how each ended (``ended`` False: still running after SIGKILL)."""
    from orchestrator.accounting.meter import modelled_power
    from orchestrator.daemon.reaper import Reaper
    from orchestrator.nodes.backends import local_executor
    from orchestrator.nodes.inventory import resolve_nodes
    from orchestrator.queue import attempts

    settings = ctx.settings
    nodes = resolve_nodes(settings)
    local = {n.name for n in nodes if n.executor == "local"}
    with ctx.db.read() as session:
        rows = session.exec(
            select(Attempt.id, Attempt.job_id, Attempt.node)
            .where(col(Attempt.job_id).in_(job_ids))
            .where(col(Attempt.state).in_(attempts.values(attempts.LIVE)))
        ).all()
    mine = {att_id: job_id for att_id, job_id, node in rows if node in local}
    if not mine:
        return {}
    accountant = KeptCarbon(carbon=_none, price=_none, modelled_power_w=modelled_power(nodes))
    reaper = Reaper(
        db=ctx.db, executor=local_executor(), settings=settings, nodes=nodes, accountant=accountant
    )
    ids, grace_s = list(mine), settings.cancel_grace_s
    begin = time.monotonic()
    ended_s: dict[int, float] = {}
    while True:
        now = _utc_now()
        reaper.stop_cancelled(now, only=ids)  # SIGTERM first, SIGKILL once grace passed
        reaper.reap(now, only=ids)
        left = _live(ctx, ids)
        spent_s = time.monotonic() - begin
        ended_s |= {i: spent_s for i in ids if i not in left and i not in ended_s}
        if not left or spent_s > grace_s + KILL_WAIT_S:
            break
        time.sleep(POLL_S)
    accountant.say_until(ctx, [i for i in ids if i not in left])
    with ctx.db.read() as session:
        query = select(Attempt.id, Attempt.kill_sent_at).where(col(Attempt.id).in_(ids))
        killed = {att_id: at for att_id, at in session.exec(query).all()}
    return {
        job_id: Stopped(
            job_id, att_id not in left, killed[att_id] is not None, ended_s.get(att_id, spent_s)
        )
        for att_id, job_id in mine.items()
    }


class KeptCarbon(Accountant):
    """An accountant with no grid signal that keeps what one counted: energy from the
    whole power log (as a daemon's), carbon and cost as stored, per day, when the
    attempt was last accounted with them (``accounted_until``, which stays: the time up
    to which its carbon is known). Written before or after a daemon's, nothing counted
    is lost: the rows it keeps are read in the same transaction."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.until: dict[int, datetime] = {}  # attempt id: carbon counted up to

    def write(self, session: Session, att: Attempt, totals: Totals, now: datetime) -> None:
        if att.carbon_g is None or att.accounted_until is None:  # none counted
            super().write(session, att, totals, now)
            return
        until, carbon_g, cost = att.accounted_until, att.carbon_g, att.cost
        rows = session.exec(select(Usage).where(col(Usage.attempt_id) == att.id)).all()
        kept = {_day(row.day): (row.carbon_g, row.cost) for row in rows}
        super().write(session, att, totals, now)
        att.carbon_g, att.cost, att.accounted_until = carbon_g, cost, until
        session.add(att)
        for row in session.exec(select(Usage).where(col(Usage.attempt_id) == att.id)).all():
            row.carbon_g, row.cost = kept.get(_day(row.day), (0.0, None))
            session.add(row)
        session.flush()
        job_totals(session, att.job_id)
        if until < now:
            self.until[att.id] = until

    def say_until(self, ctx: OpContext, ended: list[int]) -> None:
        """Each ended attempt whose carbon is known only up to a time: its job's reason
        and its own detail say so."""
        for att_id in ended:
            until = self.until.get(att_id)
            if until is None:
                continue
            note = (
                f"carbon counted up to {until.strftime('%Y-%m-%d %H:%M:%S')} UTC (the daemon's "
                "last account; no grid signal after)"
            )
            with ctx.db.write() as session:
                att = session.get(Attempt, att_id)
                if att.accounted_until != until:  # a daemon accounted it since
                    continue
                job = session.get(Job, att.job_id)
                att.detail = f"{att.detail}; {note}" if att.detail else note
                job.reason = f"{job.reason}; {note}" if job.reason else note
                session.add(att)
                session.add(job)


def _day(day: datetime) -> float:
    return day.replace(tzinfo=day.tzinfo or UTC).timestamp()


def _live(ctx: OpContext, ids: list[int]) -> set[int]:
    from orchestrator.queue import attempts

    with ctx.db.read() as session:
        return set(
            session.exec(
                select(Attempt.id)
                .where(col(Attempt.id).in_(ids))
                .where(col(Attempt.state).in_(attempts.values(attempts.LIVE)))
            ).all()
        )


def _none(_t0: float, _t1: float) -> None:
    return None


def _utc_now():
    from orchestrator.timeparse import utc_now

    return utc_now()


def said(stopped: Stopped) -> str:
    """What ``cancel`` prints of a job stopped here."""
    how = "SIGKILL" if stopped.killed else "SIGTERM"
    if not stopped.ended:
        return f"stopping ({how} sent; still running after {stopped.after_s:.1f}s)"
    return f"cancelled (stopped by {how} after {stopped.after_s:.1f}s)"
