"""The deadline guard when its victim's SIGTERM reaches nothing (the daemon's
``Suspender.checkpoint`` is False for a job whose monitor has not started it yet, or an
SSH job whose start record cannot be believed): the pass gives up until the next one,
instead of reaping, planning and launching again for every round on the same victim."""

from __future__ import annotations

from collections import Counter

from orchestrator.planning.onepass import Pass, Running
from orchestrator.planning.policies.base import Decision, QueuedJob

HEAD = QueuedJob(id=1, gpus=4, submitted_s=0.0, duration_s=3600.0, deadline_s=3700.0)
VICTIM = QueuedJob(id=2, gpus=4, submitted_s=0.0, duration_s=3600.0, interruptible=True)


class _Scheduler:
    def __init__(self, calls: Counter) -> None:
        self.calls = calls

    def blocked_latest_start_s(self):
        return 100.0  # the head must start now

    def blocked(self):
        return HEAD

    def decision_of(self, _job_id):
        return Decision(100.0)

    def launch_out_of_order(self, _job_id, _allocate):
        self.calls["launch_out_of_order"] += 1

    def launchable(self, _now_s, _allocate, _cluster=None):
        return []

    def next_start_s(self):
        return None


class _State:
    slot_s, max_defer_s = 900.0, 86400.0

    def __init__(self, delivered: bool) -> None:
        self.calls: Counter = Counter()
        self.delivered = delivered

    def suspend_due(self, _now_s):
        pass

    def reap(self, _now_s):
        self.calls["reap"] += 1

    def admit(self, _now_s):
        pass

    def plan(self, _now_s):
        self.calls["plan"] += 1
        return _Scheduler(self.calls)

    def allocate(self, *_args):
        return None

    def launch(self, *_args):
        pass

    def running(self, _now_s):
        # a victim with hours of slack, checkpointing only once its SIGTERM was heard
        heard = self.delivered and self.calls["checkpoint"] > 0
        return [Running(("attempt", 9), VICTIM, 600.0, heard)]

    def make_room(self, _width, movable, _gpu_type=None):
        return list(movable)

    def checkpoint(self, _run, _now_s):
        self.calls["checkpoint"] += 1
        return self.delivered

    def next_due_s(self, _now_s):
        return None


def test_a_sigterm_that_reached_nothing_ends_the_guard_for_this_pass():
    state = _State(delivered=False)
    Pass(state).tick(100.0)
    assert state.calls["checkpoint"] == 1, state.calls
    assert state.calls["launch_out_of_order"] == 0 and state.calls["plan"] <= 2, state.calls


def test_a_heard_sigterm_makes_room_once():
    state = _State(delivered=True)
    pass_ = Pass(state)
    pass_.tick(100.0)
    assert state.calls["checkpoint"] == 1 and pass_.guard_suspensions == 1, state.calls
    assert state.calls["launch_out_of_order"] == 1, "the head is tried once room is made"
