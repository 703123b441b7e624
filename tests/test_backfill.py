"""Backfill behind a blocked head (``orchestrator.planning.backfill``): the pure core on
the shared ``Scheduler`` and the cluster's allocator, and the simulator with it."""

from __future__ import annotations

import heapq
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.planning.backfill import (
    CONSERVATIVE,
    EASY,
    MAX_RESERVATIONS,
    STRICT,
    Cluster,
    check_backfill,
    hold_until_s,
    job_key,
)
from orchestrator.planning.policies.base import Decision, QueuedJob
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.planning.scheduler import Scheduler
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology


def _cluster(sizes: list[int]) -> ClusterAllocator:
    nodes = tuple(NodeTopology.plain(f"n{i}", s) for i, s in enumerate(sizes))
    return ClusterAllocator(ClusterTopology(nodes))


def _strict_start(alloc: ClusterAllocator, ends: dict, now: float, width: int) -> float:
    """When a blocked head starts under strict order: nothing else starts before it, so
    at the first running job's end after which it fits."""
    shadow = ClusterAllocator(alloc.topology)
    for key, a in alloc.allocations().items():
        for node, gpus in a.parts:
            shadow.hold(key, node, gpus)
    for end, key in sorted((e, k) for k, e in ends.items()):
        shadow.free(key)
        if shadow.allocate(("head",), width) is not None:
            return max(now, end)
    raise AssertionError("a head that never fits")


def _run(mode: str, sizes: list[int], jobs: list[tuple[int, int, int]]):
    """A small what-if run on the pure parts (jobs: submit, width, duration). Returns
    each job's start, and the latest start strict order allowed it from the first time it
    was the blocked head."""
    alloc = _cluster(sizes)
    sched = Scheduler(Fifo(), backfill=mode)
    ends: dict = {}  # key -> end
    events = sorted({s for s, _, _ in jobs})
    heapq.heapify(events)
    start: dict[int, float] = {}
    promised: dict[int, float] = {}
    pending = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], i))
    while events:
        now = heapq.heappop(events)
        while events and events[0] == now:
            heapq.heappop(events)
        for key in [k for k, e in ends.items() if e <= now]:
            alloc.free(key)
            del ends[key]
        arrived = [i for i in pending if jobs[i][0] <= now]
        pending = [i for i in pending if jobs[i][0] > now]
        sched.add(
            QueuedJob(i, jobs[i][1], float(jobs[i][0]), duration_s=float(jobs[i][2]))
            for i in arrived
        )
        sched.plan(now)

        def allocate(job: QueuedJob, decision: Decision):
            return alloc.allocate(job_key(job.id), job.gpus)

        for job, _, _ in sched.launchable(now, allocate, lambda: Cluster(alloc, dict(ends))):
            start[job.id] = now
            ends[job_key(job.id)] = now + job.duration_s
            heapq.heappush(events, now + job.duration_s)
        head = sched.blocked()
        if head is not None and head.id not in promised:
            promised[head.id] = _strict_start(alloc, ends, now, head.gpus)
    assert len(start) == len(jobs)
    return start, promised


JOBS = st.lists(
    st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(1, 30)), min_size=1, max_size=14
)
SIZES = st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(sizes=SIZES, jobs=JOBS, mode=st.sampled_from([EASY, CONSERVATIVE]))
def test_no_head_starts_later_than_strict_order_would_have_started_it(sizes, jobs, mode):
    total = sum(sizes)
    jobs = [(s, min(w, total), d) for s, w, d in jobs]
    start, promised = _run(mode, sizes, jobs)
    for job_id, latest in promised.items():
        assert start[job_id] <= latest, (job_id, start, promised)


def test_narrow_jobs_run_in_the_gap_and_the_wide_one_at_its_reservation():
    # 8 GPUs: a 4-GPU job for 10 h; then an 8-GPU head; then 2-GPU jobs of 1 h (fits the
    # gap), 20 h (would hold GPUs past the head's reservation) and 6 h (ends just then)
    jobs = [(0, 4, 10), (1, 8, 1), (2, 2, 1), (3, 2, 20), (4, 2, 6)]
    start, promised = _run(EASY, [8], jobs)
    assert promised[1] == 10  # the head's reservation: job 0's end
    assert start == {0: 0, 1: 10, 2: 2, 3: 11, 4: 4}
    strict, _ = _run(STRICT, [8], jobs)
    assert strict == {0: 0, 1: 10, 2: 11, 3: 11, 4: 11}
    conservative, _ = _run(CONSERVATIVE, [8], jobs)
    assert conservative == start


def test_a_long_job_passes_the_head_only_on_gpus_the_head_does_not_need():
    # per node: a 4-GPU head waits for node n0 (10 h); a 50 h 2-GPU job on n1 (2 GPUs,
    # too small for the head) delays nobody
    start, promised = _run(EASY, [4, 2], [(0, 4, 10), (1, 4, 1), (2, 2, 50)])
    assert promised == {1: 10} and start == {0: 0, 1: 10, 2: 2}
    # two 4-GPU nodes: the head is promised n1 at 5 h, when the 2-GPU job there ends; a
    # 50 h job on n1's other 2 GPUs would push it to n0 at 10 h: it waits for its turn
    start, promised = _run(EASY, [4, 4], [(0, 4, 10), (0, 2, 5), (1, 4, 1), (2, 2, 50)])
    assert promised[2] == 5 and start == {0: 0, 1: 0, 2: 5, 3: 6}


def test_a_job_whose_run_time_nobody_knows_backfills_only_where_it_delays_nobody():
    alloc = _cluster([4, 4])
    alloc.allocate(("attempt", 1), 4)  # n0... or n1: a whole node, for 10 h
    sched = Scheduler(Fifo(), backfill=EASY)
    head = QueuedJob(1, 8, 0.0, duration_s=3600.0)
    unknown = QueuedJob(2, 2, 0.0)  # no duration
    short = QueuedJob(3, 2, 0.0, duration_s=600.0)
    sched.add([head, unknown, short])
    sched.plan(0.0)
    cluster = Cluster(alloc, {("attempt", 1): 36000.0})
    got = sched.launchable(0.0, lambda j, d: alloc.allocate(job_key(j.id), j.gpus), lambda: cluster)
    assert [j.id for j, _, _ in got] == [3]  # the unknown one would hold the head's GPUs
    # a running job whose end nobody knows: no reservation, so nothing passes the head
    alloc2 = _cluster([4, 4])
    alloc2.allocate(("attempt", 1), 4)
    sched2 = Scheduler(Fifo(), backfill=EASY)
    sched2.add([head, replace(short, id=4)])
    sched2.plan(0.0)
    got = sched2.launchable(
        0.0, lambda j, d: alloc2.allocate(job_key(j.id), j.gpus), lambda: Cluster(alloc2, {})
    )
    assert got == []


def test_hold_until_follows_the_plan():
    job = QueuedJob(1, 2, 0.0, duration_s=100.0)
    assert hold_until_s(job, Decision(0.0), 10.0) == 110.0
    assert hold_until_s(job, Decision(0.0, end_s=300.0), 10.0) == 310.0  # capped: longer
    pieces = Decision(0.0, intervals=((0.0, 50.0), (80.0, 200.0)))
    assert hold_until_s(job, pieces, 10.0) == 50.0  # suspended at its piece's end
    assert hold_until_s(QueuedJob(2, 1, 0.0), Decision(0.0), 10.0) is None


def test_backfill_names():
    assert check_backfill(" EASY ") == EASY
    with pytest.raises(SpecError, match="use easy, conservative or strict"):
        check_backfill("aggressive")


# -- the simulator --------------------------------------------------------------------------
GAP = [(0, "10h", 4), (1, "1h", 8), (2, "1h", 2), (3, "20h", 2), (4, "6h", 2)]


def _simulated_starts_h(tmp_path, backfill: str | None, rows=GAP, per_node=8) -> list[float]:
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.sim.engine import SimDaemon
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"submit": f"2023-03-01T00:0{m}:00", "duration": d, "gpus": g}) + "\n"
            for m, d, g in rows
        )
    )
    raw = {
        "policies": ["fifo"],
        "jobs": {"source": str(trace)},
        "grid": {"source": "synthetic:days=5&start=2023-03-01"},
        "cluster": {"gpus": 8, "gpus_per_node": per_node},
    }
    if backfill is not None:
        raw["backfill"] = backfill
    inputs = prepare(Scenario.model_validate(raw), tmp_path)
    run = SimDaemon(inputs, resolve_policy("fifo"), None).run()
    t0 = float(inputs.jobs.submit_s[0])
    return [round((s - t0) / 3600, 2) for s in run.first_start_s]


def test_the_simulator_backfills_by_default_and_keeps_strict_order_as_an_option(tmp_path):
    backfilled = _simulated_starts_h(tmp_path, None)
    # the 8-GPU head starts at 10 h (the 4-GPU job's end); the 1 h and 6 h jobs ran in
    # the gap, the 20 h one after the head
    assert backfilled == [0.0, 10.0, 0.03, 11.0, 0.07]
    assert _simulated_starts_h(tmp_path, "easy") == backfilled
    assert _simulated_starts_h(tmp_path, "strict") == [0.0, 10.0, 11.0, 11.0, 11.0]


def test_the_simulator_backfills_conservatively_by_default(tmp_path):
    # two 4-GPU nodes: 4 GPUs on one until 10 h, 2 on the other until 12 h; a 4-GPU head
    # (5 h) is promised the first node at 10 h, the 4-GPU job behind it the second when
    # that frees (12 h); a 100 h 2-GPU job fits now on the second node. easy starts it
    # (the head does not need that node) and so pushes the job behind the head to 15 h;
    # conservative keeps that job's reservation and starts the long one at 15 h
    rows = [(0, "10h", 4), (1, "12h", 2), (2, "5h", 4), (3, "5h", 4), (4, "100h", 2)]
    default = _simulated_starts_h(tmp_path, None, rows, per_node=4)
    assert default == [0.0, 0.02, 10.0, 12.02, 15.0]
    assert _simulated_starts_h(tmp_path, "conservative", rows, per_node=4) == default
    assert _simulated_starts_h(tmp_path, "easy", rows, per_node=4) == [0.0, 0.02, 10.0, 15.0, 0.07]


def test_simulate_refuses_an_unknown_backfill_in_one_line(cli):
    proc = cli.run("simulate", "--backfill", "aggressive", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gridshift: error: --backfill: unknown backfill 'aggressive'; "
        "use easy, conservative or strict"
    ]


MANY = st.lists(
    st.tuples(st.integers(0, 5), st.integers(1, 8), st.integers(1, 30)), min_size=55, max_size=70
)


@settings(max_examples=30, deadline=None)
@given(sizes=SIZES, jobs=MANY, mode=st.sampled_from([EASY, CONSERVATIVE]))
def test_more_due_jobs_than_reservations_still_never_delay_a_head(sizes, jobs, mode):
    # past MAX_RESERVATIONS due jobs (50) conservative reserves for the first 50 only;
    # the ones behind start only where they fit, never later than strict order allowed
    assert len(jobs) > MAX_RESERVATIONS
    total = sum(sizes)
    jobs = [(s, min(w, total), d) for s, w, d in jobs]
    start, promised = _run(mode, sizes, jobs)
    for job_id, latest in promised.items():
        assert start[job_id] <= latest, (job_id, start, promised)


def test_conservative_backfill_is_the_default_of_the_daemon_and_the_simulator():
    from orchestrator.daemon.sqlqueue import SqlQueue
    from orchestrator.settings import DaemonSettings
    from orchestrator.sim.scenario import Scenario

    assert DaemonSettings().backfill == CONSERVATIVE
    assert SqlQueue.__dataclass_fields__["backfill"].default == CONSERVATIVE
    assert Scenario.model_fields["backfill"].default == CONSERVATIVE
    assert Scheduler(Fifo()).backfill == CONSERVATIVE
