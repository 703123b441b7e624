"""Pairs on one GPU as the live daemon's guard, backfill and placement see them (issue 24's
review): the guard never suspends one of a pair (that frees no GPU); a paired GPU is held
until both end; a --share job never joins a host on a server that does not answer nor one
backfilled on a promise."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.daemon.energy.pairs import movable_alone, pair_ends
from orchestrator.daemon.energy.sharing import Sharing
from orchestrator.daemon.sqlqueue import SqlQueue
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology

FIRST, SECOND = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"
PAIRED = {1: [2], 2: [1]}  # attempts 1 (host) and 2 (newcomer) share GPU 0


def test_the_guard_suspends_a_job_alone_not_one_of_a_pair():
    alloc = ClusterAllocator(ClusterTopology((NodeTopology.from_islands("box", [[0, 1]]),)))
    alloc.hold(("attempt", 1), "box", [0])  # the host; the newcomer holds nothing more
    alloc.hold(("attempt", 3), "box", [1])  # alone on GPU 1
    queue = SqlQueue.__new__(SqlQueue)
    queue.alloc = alloc
    queue.dispatcher = SimpleNamespace(sharing=SimpleNamespace(paired=lambda: PAIRED), nodes=[])
    movable = {("attempt", i): object() for i in (1, 2, 3)}
    assert queue.make_room(1, movable) == [("attempt", 3)]
    assert list(movable_alone(movable, PAIRED)) == [("attempt", 3)]


def test_a_paired_gpu_is_expected_back_when_both_have_ended():
    ends = {("attempt", 1): 100.0, ("attempt", 2): 500.0, ("attempt", 3): 50.0}
    assert pair_ends(ends, PAIRED) == {("attempt", 1): 500.0, ("attempt", 2): 500.0,
                                       ("attempt", 3): 50.0}  # fmt: skip
    unknown = pair_ends({("attempt", 1): 100.0, ("attempt", 2): None}, PAIRED)
    assert unknown[("attempt", 1)] is None  # the newcomer's end is unknown: so is the GPU's
    assert pair_ends({("attempt", 1): 100.0}, PAIRED)[("attempt", 1)] is None  # stopped


def _stub(**att_fields):
    node = SimpleNamespace(name="box", executor="local", config=SimpleNamespace(share="time-slice"),
                           model_of=lambda gpus: "Tesla V100-SXM2")  # fmt: skip
    host = SimpleNamespace(name=SECOND, uid=1000, share=True, deadline=None, duration_s=None)
    att = SimpleNamespace(**({"id": 1, "node": "box", "gpu_ids": [0], "started_at": None,
                              "cap": None} | att_fields))  # fmt: skip

    class Stub(Sharing):
        def _alone(self, nodes):
            return [(att, host)]

        def earlier_s(self, atts):  # the host's first attempt
            return {}

    return Stub(db=None, nodes=[node])


def _asking():
    return SimpleNamespace(id=9, name=FIRST, uid=1000, share=True, attempts=0, deadline=None,
                           duration_s=None, gpu_type=None)  # fmt: skip


def test_no_pair_on_an_unreachable_server_nor_next_to_a_promise():
    assert _stub().place(_asking(), 1, 0.0) == ("box", [0])
    assert _stub().place(_asking(), 1, 0.0, down={"box": 5.0}) is None
    assert _stub(backfilled_until=object()).place(_asking(), 1, 0.0) is None


def _host_with(deadline_s: float, **att_fields):
    from datetime import UTC, datetime

    stub = _stub(**att_fields)
    host = SimpleNamespace(name=SECOND, uid=1000, share=True, duration_s=1000.0,
                           deadline=datetime.fromtimestamp(deadline_s, UTC))  # fmt: skip
    att = stub._alone({})[0][0]
    stub._alone = lambda nodes: [(att, host)]
    return stub


def test_the_deadline_check_counts_the_cap_and_the_work_left():
    from datetime import UTC, datetime

    from orchestrator.planning.devices.interference import Interference
    from orchestrator.planning.perfmodel import curve_for

    speed = Interference().speed(SECOND, FIRST, "v100")
    rate = curve_for("Tesla V100-SXM2").throughput_fraction(0.5)
    assert rate < 0.95
    started = datetime.fromtimestamp(0.0, UTC)
    needs_s = 1000.0 / speed  # all its work left at its speed paired, uncapped
    # uncapped it ends in time; at a 50 % cap it does not: no pair
    fits = dict(started_at=started, cap=None, progress_total=None, progress_done=None)
    assert _host_with(needs_s + 1, **fits).place(_asking(), 1, 0.0) == ("box", [0])
    capped = fits | {"cap": 0.5}
    assert _host_with(needs_s + 1, **capped).place(_asking(), 1, 0.0) is None
    # its own report says 90 % is done: a tenth of the work left, in time even capped
    done = capped | {"progress_total": 100.0, "progress_done": 90.0}
    assert _host_with(needs_s / 10 / rate + 1, **done).place(_asking(), 1, 0.0) == ("box", [0])
    assert _host_with(needs_s / 10 / rate + 1, **capped).place(_asking(), 1, 0.0) is None
