"""What backfill trusts of a running job's end (issue 23 review: findings 1, 4, 5, 6)."""

from __future__ import annotations

from orchestrator.planning.backfill import EASY, Cluster, job_key, running_end_s
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.planning.scheduler import Scheduler
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology


def test_a_job_past_its_estimate_is_unknown_not_about_to_end():
    assert running_end_s(1000.0, 60.0, "duration", 900.0) is None
    assert running_end_s(1000.0, 600.0, "duration", 100.0) == 1500.0


def test_the_labs_default_and_progress_alone_promise_nothing():
    assert running_end_s(0.0, 4 * 3600.0, "default", 0.0) is None
    assert running_end_s(0.0, 99 * 3600.0, "progress", 3600.0) is None
    assert running_end_s(0.0, 3600.0, "history", 0.0) == 3600.0


def test_progress_reports_shorten_an_end_never_lengthen_it():
    # --duration 10 h, ran 1 h; it reports 1 % done (99 h left): still 9 h, not 99 h
    assert running_end_s(0.0, 36000.0, "duration", 3600.0, 99 * 3600.0) == 32400.0
    assert running_end_s(0.0, 36000.0, "duration", 3600.0, 600.0) == 600.0


def test_a_job_told_to_checkpoint_leaves_within_its_grace():
    assert running_end_s(100.0, 36000.0, "duration", 0.0, None, 130.0) == 130.0
    assert running_end_s(100.0, None, None, 0.0, None, 130.0) == 130.0


def _liar_run(end):
    a = ClusterAllocator(ClusterTopology((NodeTopology.plain("n0", 8),)))
    a.allocate(("attempt", 1), 4)
    s = Scheduler(Fifo(), backfill=EASY)
    s.add([QueuedJob(10, 8, 0.0, duration_s=3600.0), QueuedJob(11, 4, 1.0, duration_s=600.0)])
    s.plan(5.0)
    ends = {("attempt", 1): end}
    take = lambda j, d: a.allocate(job_key(j.id), j.gpus)  # noqa: E731
    got = s.launchable(5.0, take, lambda: Cluster(a, ends))
    return [j.id for j, _, _ in got]


def test_nothing_backfills_behind_a_job_past_its_estimate():
    # the holder's promise was 60 s and it has run 900 s: its end is unknown, so a 600 s job
    # may not take the GPUs the head waits for (before: it counted as ending in 1 s)
    assert _liar_run(running_end_s(5.0, 60.0, "duration", 900.0)) == []
    assert _liar_run(running_end_s(5.0, 6000.0, "duration", 900.0)) == [11]


def test_a_queued_job_with_only_the_labs_default_run_time_promises_nothing():
    from orchestrator.planning.backfill import hold_until_s
    from orchestrator.planning.policies.base import Decision

    guess = QueuedJob(1, 4, 0.0, duration_s=4 * 3600.0, run_known=False)
    assert hold_until_s(guess, Decision(start_s=0.0), 0.0) is None
    promised = QueuedJob(1, 4, 0.0, duration_s=4 * 3600.0)
    assert hold_until_s(promised, Decision(start_s=0.0), 0.0) == 4 * 3600.0
    # a guess backfills only where it delays nobody: not into the head's GPUs
    a = ClusterAllocator(ClusterTopology((NodeTopology.plain("n0", 8),)))
    a.allocate(("attempt", 1), 4)
    s = Scheduler(Fifo(), backfill=EASY)
    s.add(
        [
            QueuedJob(10, 8, 0.0, duration_s=3600.0),
            QueuedJob(11, 4, 1.0, duration_s=60.0, run_known=False),
        ]
    )
    s.plan(5.0)
    ends = {("attempt", 1): 100.0}
    take = lambda j, d: a.allocate(job_key(j.id), j.gpus)  # noqa: E731
    assert s.launchable(5.0, take, lambda: Cluster(a, ends)) == []


def test_a_job_suspended_by_sigstop_keeps_its_gpus_through_its_pauses():
    from orchestrator.planning.backfill import CONSERVATIVE, hold_until_s
    from orchestrator.planning.policies.base import Decision

    job = QueuedJob(30, 4, 3.0, duration_s=4810.0, interruptible=True)
    plan = Decision(start_s=0.0, intervals=((0.0, 10.0), (200.0, 5000.0)))
    assert hold_until_s(job, plan, 0.0) == 10.0  # SIGTERM: it leaves at its piece's end
    assert hold_until_s(job, plan, 0.0, pieces_release=False) == 5000.0
    for mode in (EASY, CONSERVATIVE):  # behind a head due at 100, it may not pass it
        assert _behind_head(mode, job, plan, release=True) == [30], mode
        assert _behind_head(mode, job, plan, release=False) == [], mode


def _behind_head(mode, job, plan, release: bool) -> list[int]:
    a = ClusterAllocator(ClusterTopology((NodeTopology.plain("n0", 8),)))
    a.allocate(("attempt", 1), 4)
    s = Scheduler(Fifo(), backfill=mode)
    s.pieces_release = release
    s.add([QueuedJob(10, 8, 0.0, duration_s=3600.0)])
    s.plan(5.0)
    s.add_planned(job, plan)
    ends = {("attempt", 1): 100.0}
    take = lambda j, d: a.allocate(job_key(j.id), j.gpus)  # noqa: E731
    return [j.id for j, _, _ in s.launchable(5.0, take, lambda: Cluster(a, ends))]


def test_a_job_planned_for_later_is_not_delayed_by_one_behind_it_in_queue_order():
    from orchestrator.planning.backfill import CONSERVATIVE
    from orchestrator.planning.policies.base import Decision

    high = QueuedJob(20, 4, 0.0, priority=5, duration_s=1000.0)  # planned (carbon) at 50
    for mode in (EASY, CONSERVATIVE):
        for low_s, started in ((90.0, []), (40.0, [21])):  # ends after 50: not now
            a = ClusterAllocator(ClusterTopology((NodeTopology.plain("n0", 8),)))
            a.allocate(("attempt", 1), 4)
            s = Scheduler(Fifo(), backfill=mode)
            s.add([QueuedJob(10, 8, 0.0, duration_s=3600.0)])
            s.add([QueuedJob(21, 4, 2.0, duration_s=low_s)])
            s.plan(5.0)
            s.add_planned(high, Decision(start_s=50.0))
            got = _launch(s, a, {("attempt", 1): 100.0})
            assert got == started, (mode, low_s)


def _launch(s: Scheduler, a: ClusterAllocator, ends: dict) -> list[int]:
    take = lambda j, d: a.allocate(job_key(j.id), j.gpus)  # noqa: E731
    return [j.id for j, _, _ in s.launchable(5.0, take, lambda: Cluster(a, ends))]


def test_the_daemons_cluster_gives_each_running_attempt_the_end_it_may_trust(tmp_path):
    import os
    from datetime import UTC, datetime, timedelta

    from orchestrator.daemon.guard import MOVED, Suspender
    from orchestrator.daemon.sqlqueue import SqlQueue
    from orchestrator.planning.snapshot import RunEstimate
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job

    t0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
    now = t0 + timedelta(hours=1)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    ids = {}
    cases = {  # name: (--duration, progress done of 100, SIGTERM sent to checkpoint at)
        "overran": (600.0, None, None),
        "lowballs": (36000.0, 1.0, None),
        "no_duration": (None, None, None),
        "checkpointing": (36000.0, None, now - timedelta(seconds=10)),
        "moving": (36000.0, None, now - timedelta(seconds=10)),  # granted its checkpoint's 10 min
        "moved_before_restart": (36000.0, None, now - timedelta(seconds=10)),
    }
    with db.write() as session:
        for name, (duration, done, sent) in cases.items():
            job = Job(user="u", uid=os.getuid(), command=["true"], workdir="/", gpus_min=1,
                      gpus_max=1, state="running", duration_s=duration, submitted_at=t0,
                      attempts=1)  # fmt: skip
            session.add(job)
            session.flush()
            att = Attempt(job_id=job.id, number=1, state="running", node="local", gpu_ids=[0],
                          run_dir="/", started_at=t0, progress_done=done,
                          progress_total=100.0 if done else None, progress_at=now,
                          suspend_sent_at=sent)  # fmt: skip
            session.add(att)
            session.flush()
            ids[name] = (job.id, att.id)
            if name == "moved_before_restart":  # the daemon that moved it wrote its reason
                job.reason, job.checkpoint_s = f"{MOVED} 0 on local with job 1", 300.0
                session.add(job)
    known = {
        ids["lowballs"][0]: RunEstimate(360000.0, "progress", "1 % done"),
        ids["no_duration"][0]: RunEstimate(4 * 3600.0, "default", "the lab's"),
    }
    suspender = Suspender(db=db, executor=None, grace_s=30.0)
    suspender.grant(ids["moving"][1], 600.0)  # a co-location move's grace (Mover._start)
    queue = SqlQueue(db=db, dispatcher=None, reaper=None, suspender=suspender,
                     known=known)  # fmt: skip
    _, ends = queue.cluster(now.timestamp())
    end = {name: ends[("attempt", att_id)] for name, (_, att_id) in ids.items()}
    n = now.timestamp()
    assert end["overran"] is None  # before: now + 1 s
    assert end["lowballs"] == n + 36000.0 - 3600.0  # before: 99 % of 100 h
    assert end["no_duration"] is None  # the lab's 4 h is nobody's promise
    assert end["checkpointing"] == n + 20.0  # before: its --duration
    assert end["moving"] == n + 590.0  # before: n + 20 s, its grace_s, not its 10 min
    assert end["moved_before_restart"] == n + 320.0  # its checkpoint's cost + grace_s
