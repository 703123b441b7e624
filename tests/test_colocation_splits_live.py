"""Pair splits on the live daemon (``daemon.energy.splits``) on a real store: a paired job
whose own measured speed puts it past its deadline is told to checkpoint with the split
reason, its partner never is (whatever the other reports); once requeued it runs alone;
and a daemon restarted meanwhile still gives it its checkpoint's grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlmodel import select

from orchestrator.daemon.energy.sharing import Sharing
from orchestrator.daemon.energy.splits import Splitter
from orchestrator.daemon.guard import MOVED, SPLIT, Suspender
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.models import Attempt, Event, Job
from tests.test_colocation_moves_guards import HEAD, NOW, _node, _run, _stamp
from tests.test_colocation_moves_guards import db as db  # the fixture

H = 3600.0
TIGHT = {"deadline": NOW + timedelta(hours=1.5)}  # 1 h of its 2 h left: 2 h at half speed


def _splitter(db, told=None, **kw):
    def checkpoint(att, now):
        told.append(att.job_id)
        _stamp(db, att.id, suspend_sent_at=now)  # as the suspender stamps it
        return True

    graces = {}
    splitter = Splitter(Sharing(db, nodes=[_node()]), checkpoint, 300.0,
                        grace=graces.__setitem__, grace_s=30.0, **kw)  # fmt: skip
    return splitter, graces


def _measure(splitter, att_id, speed, from_s=None):
    """Its measured speed next to the partner it has, as its reports gave it (the rate's
    stretch from ``from_s``; default: now, after its partner started)."""
    splitter.sharing.measured[att_id] = speed
    splitter.sharing.measured_from[att_id] = NOW.timestamp() if from_s is None else from_s


def _job_of(db, att_id):
    with db.read() as session:
        return session.get(Job, session.get(Attempt, att_id).job_id)


def test_the_job_whose_measured_speed_misses_its_deadline_is_split_not_its_partner(db):
    slow = _run(db, "box", [0], job=TIGHT)
    partner = _run(db, "box", [0], job=TIGHT)  # at the slow one's speed it would miss too
    told = []
    splitter, graces = _splitter(db, told)
    _measure(splitter, slow, 0.5)  # its own reports: half its speed alone
    _measure(splitter, partner, 0.9)  # 1 h 7 min: in time
    assert splitter.step(NOW.timestamp()) == [_job_of(db, slow).id]
    assert told == [_job_of(db, slow).id] and splitter.splits == 1
    assert graces == {slow: 330.0}  # its checkpoint's cost plus the lab's grace
    job = _job_of(db, slow)
    assert job.reason.startswith(SPLIT) and "SIGTERM to checkpoint" in job.reason
    with db.read() as session:
        events = session.exec(select(Event).where(Event.job_id == job.id)).all()
    assert [e.reason for e in events if e.actor == "daemon"][-1] == job.reason
    assert splitter.sharing.notes[job.id].startswith(SPLIT)  # the requeue's reason
    assert splitter.step(NOW.timestamp() + 60) == [] and len(told) == 1  # once per attempt


@pytest.mark.parametrize(
    "case",
    [
        {"speed": 0.8},  # 1 h 15 min: in time
        {"job": {"interruptible": False}},
        {"job": {"deadline": NOW + timedelta(minutes=62)}},  # alone it would miss it too
        {"att": {"term_sent_at": NOW}},  # told to stop already
        {"speed": None},  # no rate next to its partner yet
    ],
    ids=["in-time", "not-interruptible", "alone-misses-too", "leaving", "not-measured"],
)
def test_no_split(db, case):
    att = _run(db, "box", [0], job=TIGHT | case.get("job", {}), att=case.get("att"))
    _run(db, "box", [0])
    told = []
    splitter, _ = _splitter(db, told)
    if case.get("speed", 0.5) is not None:
        _measure(splitter, att, case.get("speed", 0.5))
    assert splitter.step(NOW.timestamp()) == [] and told == []


@pytest.mark.parametrize("free", [True, False])
def test_a_split_needs_a_gpu_free_now_and_one_at_a_time(db, free):
    """Alone it keeps its deadline only if it restarts now: with no GPU free in the
    pass's allocator, no split; with one, one split, and no other until it has left its
    GPU (review: one free GPU justified a split per pass, each waiting after the first)."""
    slow = [_run(db, "box", [0], job=TIGHT), _run(db, "box", [1], job=TIGHT)]
    _run(db, "box", [0], job={"duration_s": 36000.0})
    _run(db, "box", [1], job={"duration_s": 36000.0})
    told = []
    room = SimpleNamespace(fits_now=lambda k, gpu_type=None: free)
    splitter, _ = _splitter(db, told, alloc=lambda: room)
    for att in slow:
        _measure(splitter, att, 0.5)
    assert len(splitter.step(NOW.timestamp())) == (1 if free else 0)
    assert splitter.step(NOW.timestamp() + 60) == []  # the first one still checkpoints:
    assert len(told) == (1 if free else 0)  # nothing holds the GPU it will take yet
    first = next((a for a in slow if _job_of(db, a).id in told), None)
    if first is not None:
        _requeue_and_restart(db, first, 2)  # it left, restarted alone: the next may go
        assert len(splitter.step(NOW.timestamp() + 600)) == 1 and len(told) == 2


def test_no_split_while_a_job_due_waits_for_gpus(db):
    """It would restart behind that job: alone, it would not keep its deadline then."""
    slow = _run(db, "box", [0], job=TIGHT)
    _run(db, "box", [0], job={"duration_s": 36000.0})
    told = []
    splitter, _ = _splitter(db, told, waiting=lambda: HEAD)
    _measure(splitter, slow, 0.5)
    assert splitter.step(NOW.timestamp()) == [] and told == []
    splitter.waiting = lambda: None
    assert splitter.step(NOW.timestamp()) == [_job_of(db, slow).id]


def test_a_job_lying_about_its_speed_moves_only_itself(db):
    """The liar reports a crawl: it alone is checkpointed (a GPU alone, what it would have
    had without --share); its partner, on a deadline its own speed keeps, runs on."""
    liar = _run(db, "box", [0], job={"deadline": NOW + timedelta(hours=2)})
    honest = _run(db, "box", [0], job=TIGHT)  # unmeasured: nobody's reports move it
    told = []
    splitter, _ = _splitter(db, told)
    # 1 h left each; LM next to LM: 0.67 predicted, so its partner leaves in 1 h 30 min
    _measure(splitter, liar, 0.5)  # it says: 45 min done by then, ends at 1 h 45
    assert splitter.step(NOW.timestamp()) == [] and told == []
    _measure(splitter, liar, 0.3)  # it says: ends at 2 h 3 min: past; alone in time
    assert splitter.step(NOW.timestamp()) == [_job_of(db, liar).id]
    assert told == [_job_of(db, liar).id] and _job_of(db, honest).id not in told


@pytest.mark.parametrize("partner_s, split", [(7200.0, False), (36000.0, True)])
def test_a_partner_about_to_leave_keeps_a_job_from_a_split(db, partner_s, split):
    """Next to a partner that leaves in 1 h 30 min (its --duration less the time it ran,
    at the model's 0.67), a job at half speed ends at 1 h 45 min, alone after: in time
    for 1 h 48 min; next to one running 13 h 30 min more, at 2 h: past it."""
    slow = _run(db, "box", [0], job={"deadline": NOW + timedelta(minutes=108)})
    _run(db, "box", [0], job={"duration_s": partner_s})
    told = []
    splitter, _ = _splitter(db, told)
    _measure(splitter, slow, 0.5)
    assert bool(splitter.step(NOW.timestamp())) is split


def _requeue_and_restart(db, att_id, gpu):
    """The split attempt exits 0 and is requeued; the job restarts (attempt 2) on ``gpu``."""
    then = NOW + timedelta(minutes=5)
    with db.write() as session:
        att = session.get(Attempt, att_id)
        attempts.move(session, att, AttemptState.EXITED, at=then)
        att.finished_at = then
        session.add(att)
        new = attempts.begin(session, at=then, job_id=att.job_id, number=2, node="box",
                             gpu_ids=[gpu], run_dir="")  # fmt: skip
        attempts.move(session, new, AttemptState.RUNNING, at=then, started_at=then)
        return new.id


@pytest.mark.parametrize("split", [True, False])
def test_once_requeued_a_split_job_runs_alone_in_its_next_attempt(db, split):
    slow = _run(db, "box", [0], job=TIGHT)
    partner = _run(db, "box", [0])
    told = []
    splitter, _ = _splitter(db, told)
    if split:
        _measure(splitter, slow, 0.5)
        assert splitter.step(NOW.timestamp()) == [_job_of(db, slow).id]
    again = _requeue_and_restart(db, slow, 1)
    with db.write() as session:  # its partner ends: only the restarted job runs alone
        attempts.move(session, session.get(Attempt, partner), AttemptState.EXITED, at=NOW)
    sharing = splitter.sharing
    newcomer = Job(id=99, name="LM", share=True, uid=1000, attempts=0, duration_s=H,
                   user="u", command=["x"], workdir="/", gpus_min=1, gpus_max=1)  # fmt: skip
    later = NOW.timestamp() + 600
    placed = sharing.place(newcomer, 1, later)
    assert placed == (None if split else ("box", [1])), "a split job is joined again"
    if split:  # the split's reason is spent: a later suspension is no split
        splitter.step(later)
        assert _job_of(db, slow).id not in sharing.notes and not splitter.told
    assert [a.id for a, _ in sharing._alone({"box": _node()})] == ([] if split else [again])


def test_a_daemon_restarted_gives_a_split_job_its_checkpoints_grace():
    suspender = Suspender(db=None, executor=None, grace_s=30.0, checkpoint_s=600.0)
    split = f"{SPLIT} (job 2): at 50% of its speed alone it would end after its deadline"
    assert suspender.kill_after_s(7, 300.0, split) == 330.0
    assert suspender.kill_after_s(7, None, split) == 630.0  # the lab's cost
    assert suspender.kill_after_s(7, 300.0, f"{MOVED} 0 on box with job 2") == 330.0
    assert suspender.kill_after_s(7, 300.0, "its planned piece ended") == 30.0


@pytest.mark.parametrize("from_h, split", [(-2.0, False), (0.0, True)])
def test_a_speed_measured_next_to_an_earlier_partner_splits_nothing(db, from_h, split):
    """Review: a speed measured next to one partner was used against the next. The rate's
    stretch must begin after the partner it has now started (1 h ago here)."""
    slow = _run(db, "box", [0], job=TIGHT)
    _run(db, "box", [0], job={"duration_s": 36000.0})
    told = []
    splitter, _ = _splitter(db, told)
    _measure(splitter, slow, 0.5, NOW.timestamp() + from_h * H)
    assert bool(splitter.step(NOW.timestamp())) is split


def test_a_partner_past_its_duration_has_an_unknown_end(db):
    """Review: a partner that ran past its --duration counted as leaving now, every pass,
    so the job at risk was judged alone and never split; its end is unknown instead."""
    slow = _run(db, "box", [0], job=TIGHT)
    _run(db, "box", [0], job={"duration_s": 1800.0})  # ran 1 h of its 30 min
    told = []
    splitter, _ = _splitter(db, told)
    _measure(splitter, slow, 0.5)
    assert splitter.step(NOW.timestamp()) == [_job_of(db, slow).id]


@pytest.mark.parametrize("delivered", [True, False])
def test_the_split_reason_is_written_before_the_sigterm(db, delivered):
    """Review: the reason (which gives a restarted daemon's guard its checkpoint's grace)
    was written after the signal: a daemon dying in between left the job only the lab's
    grace. Written first now; put back when the signal is not delivered."""
    slow = _run(db, "box", [0], job=TIGHT)
    _run(db, "box", [0], job={"duration_s": 36000.0})
    before, seen = _job_of(db, slow).reason, []

    def checkpoint(att, now):
        seen.append(_job_of(db, att.id).reason)
        return delivered

    splitter = Splitter(Sharing(db, nodes=[_node()]), checkpoint, 300.0, grace_s=30.0)
    _measure(splitter, slow, 0.5)
    splitter.step(NOW.timestamp())
    assert seen and seen[0].startswith(SPLIT)
    assert _job_of(db, slow).reason == (seen[0] if delivered else before)


@pytest.mark.parametrize("again_stepped_before", [False, True], ids=["restart", "lease-back"])
def test_another_daemons_split_still_checkpointing_keeps_a_second_one_back(
    db, again_stepped_before
):
    """One at a time across daemons: the split another one sent (its job still running,
    told to checkpoint, its reason the split's) counts until that job has left, for a
    daemon started after it (restart) and for one that had already served and takes the
    lease back (review: ``told`` was only in memory, then read back once at the first
    step; either way a second job could be split at once, both waiting for one GPU)."""
    slow = [_run(db, "box", [0], job=TIGHT), _run(db, "box", [1], job=TIGHT)]
    _run(db, "box", [0], job={"duration_s": 36000.0})
    _run(db, "box", [1], job={"duration_s": 36000.0})
    told = []
    again, _ = _splitter(db, told)
    if again_stepped_before:  # it served first (nothing measured yet), then stood by
        assert again.step(NOW.timestamp() - 10) == []
    first, _ = _splitter(db, told)
    for att in slow:
        _measure(first, att, 0.5)
    assert len(first.step(NOW.timestamp())) == 1
    for att in slow:
        _measure(again, att, 0.5)
    assert again.step(NOW.timestamp() + 60) == [] and len(told) == 1
    gone = next(a for a in slow if _job_of(db, a).id in told)
    _requeue_and_restart(db, gone, 2)  # it left: the next may go
    assert len(again.step(NOW.timestamp() + 600)) == 1 and len(told) == 2


def test_a_job_measured_at_a_crawl_is_judged_at_it_not_at_half_speed(db):
    """Its speed from its own reports (``Sharing._learn``), 0.2 next to its partner: at
    that speed its hour left takes 5 h, past its deadline in 2.5 h (alone: 1 h 5 min). Its
    measurement was clamped at ``MIN_SPEED`` (0.5: 2 h, in time), so a pair really at 0.2
    was never split; the floor is now ``FLOOR``, a split it causes being its own."""
    from orchestrator.daemon.energy.sharesplit import Span

    slow = _run(db, "box", [0], job={"deadline": NOW + timedelta(hours=2.5)})
    _run(db, "box", [0], job={"duration_s": 36000.0})  # its partner stays 9 h more
    told = []
    splitter, _ = _splitter(db, told)
    t_pair = NOW.timestamp() - H  # both started an hour ago
    spans = [Span(t_pair, float("inf"), 0.5, "LM")]
    reports = (
        (t_pair - 200, 0.0),
        (t_pair - 100, 10.0),  # alone: 0.1 per s
        (NOW.timestamp() - 1800, 100.0),
        (NOW.timestamp() - 600, 124.0),
    )  # 0.02 per s
    for t, done in reports:
        att = SimpleNamespace(id=slow, progress_done=done, progress_total=1000,
                              progress_at=datetime.fromtimestamp(t, UTC))  # fmt: skip
        splitter.sharing._learn(att, spans)
    assert splitter.sharing.measured[slow] == pytest.approx(0.2)
    assert splitter.step(NOW.timestamp()) == [_job_of(db, slow).id] == told
