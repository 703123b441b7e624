"""One power cap per shared GPU (issue 24's review): the lowest of its attempts' caps, on
launch, end, resume and at the daemon's start; a GPU is restored only once nobody holds
it."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from orchestrator.daemon.energy.sharedcaps import combine, settle
from orchestrator.daemon.reaper import Reaper
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Caps:
    """A recording ClusterCaps: node -> GPU -> the limit set (None: default)."""

    enabled = True

    def __init__(self) -> None:
        self.limit: dict[tuple[str, int], float | None] = {}

    def enabled_on(self, node: str) -> bool:
        return True

    def apply(self, node, gpus, cap):
        for g in gpus:
            self.limit[(node, g)] = cap

    def restore(self, node, gpus):
        for g in gpus:
            self.limit[(node, g)] = None

    def reconcile(self, held, skip=frozenset()):
        self.limit = {(n, g): c for n, gs in held.items() for g, c in gs.items()}


@pytest.fixture
def db(request, db_backend, tmp_path) -> Database:
    from tests.conftest import new_db_url

    database = Database(new_db_url(request, db_backend, tmp_path / "caps.db"))
    database.ensure_schema()
    return database


def _running(db, cap: float | None, gpus=(0,)) -> int:
    with db.write() as session:
        job = Job(state="running", user="u", uid=1000, command=["true"], workdir="/",
                  gpus_min=1, gpus_max=1, submitted_at=T0, share=True)  # fmt: skip
        session.add(job)
        session.flush()
        att = attempts.begin(session, at=T0, job_id=job.id, number=1, node="box",
                             gpu_ids=list(gpus), run_dir="", cap=cap)  # fmt: skip
        attempts.move(session, att, AttemptState.RUNNING, at=T0, started_at=T0)
        return att.id


def _end(db, att_id: int) -> None:
    with db.write() as session:
        att = session.get(Attempt, att_id)
        attempts.move(session, att, AttemptState.EXITED, at=T0, finished_at=T0)


def test_combine():
    assert combine([None, None]) is None
    assert combine([0.6, None]) == 0.6 and combine([0.8, 0.6]) == 0.6
    assert combine([1.0]) is None


def test_a_shared_gpu_keeps_the_lowest_cap_and_is_restored_only_when_empty(db):
    caps = Caps()
    host = _running(db, 0.6)
    settle(caps, db, "box", [0])
    assert caps.limit[("box", 0)] == 0.6
    newcomer = _running(db, None)  # uncapped newcomer: the host's cap stays
    settle(caps, db, "box", [0])
    assert caps.limit[("box", 0)] == 0.6
    settle(caps, db, "box", [0], without=host, plus=(0.7,))  # the host resumes at 0.7
    assert caps.limit[("box", 0)] == 0.7
    _end(db, newcomer)
    settle(caps, db, "box", [0], without=newcomer)  # the newcomer ends: the host's cap
    assert caps.limit[("box", 0)] == 0.6
    _end(db, host)
    settle(caps, db, "box", [0], without=host)
    assert caps.limit[("box", 0)] is None  # nobody left: the default


def test_reconcile_at_start_takes_the_lowest_cap_of_a_shared_gpu(db):
    _running(db, 0.6)
    _running(db, None)  # the later row used to win: the GPU left uncapped
    _running(db, 0.8, gpus=(1,))
    reaper = Reaper.__new__(Reaper)
    reaper.caps, reaper.db = Caps(), db
    reaper.executor = SimpleNamespace(unreachable_nodes=lambda: {})
    reaper.reconcile_caps()
    assert reaper.caps.limit == {("box", 0): 0.6, ("box", 1): 0.8}
