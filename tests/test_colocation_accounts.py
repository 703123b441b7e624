"""Co-location's accounts and learning under hostile reports (issue 24's review): a job's
own progress reports never change the shared model; a shared GPU is charged once, also
where no counter measures it; a stopped partner pays nothing while stopped."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from orchestrator.accounting.meter import Accountant
from orchestrator.daemon.energy.sharesplit import Span, fraction, stops_of
from orchestrator.daemon.energy.sharing import Sharing
from orchestrator.planning.devices.interference import FLOOR, MIN_SPEED, Interference, _table
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Job

FIRST, SECOND = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _report(sharing: Sharing, att_id: int, t: float, done: float, spans, stops=()) -> None:
    att = SimpleNamespace(id=att_id, progress_done=done, progress_total=1000,
                          progress_at=datetime.fromtimestamp(t, UTC))  # fmt: skip
    sharing._learn(att, spans, stops)


def test_a_jobs_reports_never_change_the_model_others_are_placed_and_charged_by():
    sharing = Sharing(db=None, nodes=[])
    spans = [Span(100.0, float("inf"), 0.5, SECOND)]
    for t, done in ((50.0, 10), (90.0, 50), (110.0, 60), (150.0, 90)):
        _report(sharing, 7, t, done, spans)
    assert sharing.measured[7] == pytest.approx(0.75)  # its own, per attempt
    assert sharing.model.measured == {}  # the shared model is the fitted one
    # a crawl reported next to a victim is clamped at FLOOR and still only the attempt's own
    for t, done in ((50.0, 0), (60.0, 500), (200.0, 500.0001), (210.0, 500.0002)):
        _report(sharing, 8, t, done, spans)
    assert sharing.measured[8] == FLOOR and sharing.model.measured == {}
    _report(sharing, 9, 300.0, 5000, spans)  # more done than the total: ignored
    assert 9 not in sharing.measured


def test_an_infeasible_pair_stays_infeasible_and_observations_are_clamped():
    a, b = _table()["v100"]["infeasible"][0]
    model = Interference()
    model.observe(a, b, "v100", 1.0)
    model.observe(b, a, "v100", 1.0)
    assert model.speeds(a, b, "v100") == (0.0, 0.0)
    model.observe(FIRST, SECOND, "v100", 1e-7)
    assert model.speed(FIRST, SECOND, "v100") == FLOOR < MIN_SPEED  # no longer qualifies


def _measure(tmp_path, att_id: int, split) -> float:
    acc = Accountant(lambda t0, t1: None, lambda t0, t1: None,
                     modelled_power_w=lambda att: 200.0, split=split)  # fmt: skip
    run = tmp_path / str(att_id)
    run.mkdir()
    (run / "job.json").write_text(json.dumps({"started_at": T0.isoformat()}))
    att = SimpleNamespace(id=att_id, parts=None, gpu_ids=[0], run_dir=str(run),
                          started_at=T0, node="box")  # fmt: skip
    end = T0.timestamp() + 3600
    return acc.measure(att, end, end).energy_j / 3.6e6


def test_a_shared_gpu_with_no_power_log_is_charged_once(tmp_path):
    both = [_measure(tmp_path, i, lambda att: lambda t0, t1: 0.5) for i in (1, 2)]
    assert sum(both) == pytest.approx(0.2)  # the GPU's modelled hour, not twice
    assert _measure(tmp_path, 3, lambda att: None) == pytest.approx(0.2)  # alone: all of it


def test_time_stopped_counts_as_the_partner_alone():
    assert stops_of([(0, None, "launching"), (1, "launching", "running"),
                     (10, "running", "stopped"), (20, "stopped", "running"),
                     (30, "running", "stopped")]) == ((10, 20), (30, float("inf")))  # fmt: skip
    span = Span(0.0, 100.0, 0.5, SECOND, partner_stops=((40.0, 60.0),))
    mine = fraction([span], my_stops=((0.0, 20.0),))
    assert mine(0.0, 20.0) == pytest.approx(0.0)  # I was stopped: the partner ran alone
    assert mine(20.0, 40.0) == pytest.approx(0.5)
    assert mine(40.0, 60.0) == pytest.approx(1.0)  # the partner was stopped: I ran alone
    assert mine(100.0, 120.0) == pytest.approx(1.0)  # it ended
    assert mine(0.0, 100.0) == pytest.approx((0 + 10 + 20 + 20) / 100)
    both = fraction([Span(0.0, 10.0, 0.3, SECOND, ((0.0, 10.0),))], ((0.0, 10.0),))
    assert both(0.0, 10.0) == pytest.approx(0.5)


@pytest.fixture
def db(request, db_backend, tmp_path) -> Database:
    from tests.conftest import new_db_url

    database = Database(new_db_url(request, db_backend, tmp_path / "split.db"))
    database.ensure_schema()
    return database


def test_split_for_reads_the_stops_of_both_and_learns_nothing_across_them(db):
    at = [T0 + timedelta(seconds=s) for s in range(0, 200, 10)]
    with db.write() as session:
        atts = []
        for name in (FIRST, SECOND):
            job = Job(state="running", user="u", uid=1000, command=["true"], workdir="/",
                      gpus_min=1, gpus_max=1, submitted_at=T0, share=True, name=name)  # fmt: skip
            session.add(job)
            session.flush()
            att = attempts.begin(session, at=T0, job_id=job.id, number=1, node="box",
                                 gpu_ids=[0], run_dir="")  # fmt: skip
            attempts.move(session, att, AttemptState.RUNNING, at=T0, started_at=T0)
            atts.append(att)
        host, other = atts
        attempts.move(session, other, AttemptState.STOPPED, at=at[10], stopped_at=at[10])
        attempts.move(session, other, AttemptState.RUNNING, at=at[15], stopped_at=None)
        session.flush()
        ids = host.id, other.id
    sharing = Sharing(db, nodes=[])
    with db.read() as session:
        host = session.get(type(atts[0]), ids[0])
        part = sharing.split_for(host)
    t = T0.timestamp()
    assert part(t, t + 100) == pytest.approx(0.5)  # the fitted pair: alike here
    assert part(t + 100, t + 150) == pytest.approx(1.0)  # its partner was stopped
    assert part(t, t + 200) == pytest.approx((50 + 50 + 25) / 200)
