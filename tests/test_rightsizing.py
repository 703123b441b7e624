"""The pure right-sizing decision (orchestrator/planning/devices/rightsizing.py): which
nodes to power off, which to wake for the plan's next needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.planning.devices.rightsizing import (
    OFF,
    ON,
    WAKING,
    Need,
    NodePower,
    fits,
    right_size,
)

NOW = 10_000.0


def node(name, state=ON, free=8, gpus=8, idle_since=None, wake=300.0, after=1800.0):
    return NodePower(name, gpus, free, state, idle_since, wake, after)


def test_an_idle_node_past_idle_off_after_is_powered_off():
    nodes = [node("a", idle_since=NOW - 1800), node("b", free=0)]
    assert right_size(nodes, [], NOW).power_off == ("a",)


def test_not_before_idle_off_after_and_the_next_check_says_when():
    nodes = [node("a", idle_since=NOW - 600)]
    actions = right_size(nodes, [], NOW)
    assert actions.power_off == ()
    assert actions.next_check_s == NOW + 1200


def test_never_when_idle_off_after_is_none_or_a_gpu_is_held():
    nodes = [node("a", idle_since=NOW - 1e6, after=None), node("b", free=7, idle_since=None)]
    assert right_size(nodes, [], NOW).power_off == ()


def test_kept_on_for_a_need_due_within_its_wake_time():
    nodes = [node("a", idle_since=NOW - 1e6), node("b", idle_since=NOW - 1e6)]
    soon = [Need(NOW + 200, 8)]  # starts before a powered-off node could answer
    assert len(right_size(nodes, soon, NOW).power_off) == 1  # one of the two stays on
    later = [Need(NOW + 400, 8)]  # after a wake-up: both may go
    assert len(right_size(nodes, later, NOW).power_off) == 2


def test_an_off_node_is_woken_for_a_need_due_within_its_wake_time():
    nodes = [node("a", free=0), node("b", state=OFF)]
    assert right_size(nodes, [Need(NOW + 250, 4)], NOW).wake == ("b",)
    actions = right_size(nodes, [Need(NOW + 1000, 4)], NOW)
    assert actions.wake == ()  # not yet: woken at its start minus the wake-up
    assert actions.next_check_s == NOW + 700


def test_not_woken_when_nodes_on_hold_the_need_and_waking_nodes_count():
    nodes = [node("a", free=4), node("b", state=OFF)]
    assert right_size(nodes, [Need(NOW, 4)], NOW).wake == ()
    nodes = [node("a", free=0), node("b", state=WAKING, free=8), node("c", state=OFF)]
    assert right_size(nodes, [Need(NOW, 8)], NOW).wake == ()


def test_the_quickest_to_wake_first_and_only_as_many_as_needed():
    nodes = [node("slow", state=OFF, wake=600), node("quick", state=OFF, wake=60)]
    assert right_size(nodes, [Need(NOW, 8)], NOW).wake == ("quick",)
    assert right_size(nodes, [Need(NOW, 16)], NOW).wake == ("quick", "slow")


def test_fitting_is_per_node_not_in_plain_gpu_counts():
    size = {"a": 8, "b": 8}
    assert fits([4, 4], {"a": 4, "b": 4}, size)
    assert not fits([8], {"a": 4, "b": 4}, size)  # 8 free GPUs, but on two nodes
    assert fits([16], {"a": 8, "b": 8}, size)  # wider than a node: whole free nodes
    assert not fits([16], {"a": 8, "b": 7}, size)
    nodes = [node("a", free=4), node("b", free=4), node("c", state=OFF)]
    assert right_size(nodes, [Need(NOW, 8)], NOW).wake == ("c",)


def test_bad_nodes_are_refused():
    with pytest.raises(ValueError, match="state"):
        node("a", state="asleep")
    with pytest.raises(ValueError, match="free"):
        node("a", free=9)
    with pytest.raises(ValueError, match="negative"):
        node("a", wake=-1)
    with pytest.raises(ValueError, match="unique"):
        right_size([node("a"), node("a")], [], NOW)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([ON, OFF, WAKING]),
            st.integers(0, 8),
            st.one_of(st.none(), st.floats(0, 5000)),
            st.floats(0, 900),
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(st.floats(-500, 3000), st.integers(1, 20)), max_size=6),
)
def test_after_the_actions_every_need_due_fits_or_every_node_is_up(raw_nodes, raw_needs):
    """Property: after the actions, the needs due within the shortest wake-up fit on the
    nodes up (or nothing more could be woken), and a node powered off held no job."""
    nodes = [
        NodePower(
            f"n{i}",
            8,
            8 if s != ON else free,
            s,
            (NOW - idle) if idle is not None else None,
            wake,
            600.0,
        )
        for i, (s, free, idle, wake) in enumerate(raw_nodes)
    ]
    needs = [Need(NOW + t, g) for t, g in raw_needs]
    actions = right_size(nodes, needs, NOW)
    by = {n.name: n for n in nodes}
    for name in actions.power_off:
        assert by[name].state == ON and by[name].free_gpus == by[name].gpus
    for name in actions.wake:
        assert by[name].state == OFF
    assert not set(actions.power_off) & set(actions.wake)
    up = {
        n.name: (n.gpus if n.state != ON else n.free_gpus)
        for n in nodes
        if (n.state != OFF or n.name in actions.wake) and n.name not in actions.power_off
    }
    size = {n.name: n.gpus for n in nodes}
    shortest = min(n.wake_s for n in nodes)
    due = [n.gpus for n in needs if n.start_s <= NOW + shortest]
    still_off = [n for n in nodes if n.state == OFF and n.name not in actions.wake]
    if still_off and not fits(due, up, size):
        pytest.fail(f"due {due} does not fit on {up} with {len(still_off)} nodes left off")


def test_packing_prefers_nodes_on_and_falls_back_to_one_off():
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    nodes = (NodeTopology.plain("on", 4, "r"), NodeTopology.plain("off", 4, "r"))
    alloc = ClusterAllocator(ClusterTopology(nodes))
    alloc.hold("busy", "off", [0])  # best fit alone would pick "off", the fuller node
    first = alloc.allocate_preferring("a", 2, ["off"])
    assert [n for n, _ in first.parts] == ["on"]
    assert alloc.free_on("off") == [1, 2, 3]  # what it parked is free again
    assert [n for n, _ in alloc.allocate_preferring("b", 2, ["off"]).parts] == ["on"]
    third = alloc.allocate_preferring("c", 2, ["off"])  # no room on "on": the off node
    assert [n for n, _ in third.parts] == ["off"]
    assert alloc.allocate_preferring("d", 2, ["off"]) is None and alloc.free_gpus == 1
    assert set(alloc.allocations()) == {"busy", "a", "b", "c"}


def test_the_planner_counts_the_idle_draw_of_a_job_kept_waiting():
    """budget compares start slots: 400 g/kWh for 10 h, then 100. A 1-GPU job of an hour
    saves ~0.1 kg by waiting 10 h; a GPU kept on idle (100 W) over the wait costs 0.4 kg,
    so it starts now; with right-sizing (the node off after an hour idle) only an hour of
    it counts, and waiting pays again."""
    from datetime import UTC, datetime

    import numpy as np

    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.planning.perfmodel import JobModel, curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.base import QueuedJob, Snapshot

    h, day0 = 3600.0, datetime(2023, 3, 6, tzinfo=UTC).timestamp()
    values = np.array([400.0] * 10 + [100.0] * 38)
    job = QueuedJob(0, 1, day0, duration_s=h, deadline_s=day0 + 24 * h,
                    model=JobModel(h, 1, curve_for("a40")))  # fmt: skip

    def start_h(**idle) -> float:
        snap = Snapshot(day0, [job], StepForecaster(StepSeries(day0, h, values)),
                        total_gpus=8, slot_s=h, **idle)  # fmt: skip
        return (resolve_policy("budget").plan(snap)[0].start_s - day0) / h

    assert start_h() == 10
    assert start_h(idle_w_per_gpu=100.0) == 0
    assert start_h(idle_w_per_gpu=100.0, idle_wait_s=h) == 10


def test_an_off_node_of_the_type_a_need_asks_for_is_woken_not_one_on_of_another():
    """A p100 need does not fit on a free V100 node: p is woken (and the old call shape,
    without types, still works)."""
    v = NodePower("v", 2, 2, ON, None, 300.0, 1800.0, "v100")
    p = NodePower("p", 2, 2, OFF, None, 300.0, 1800.0, "p100")
    assert right_size([v, p], [Need(NOW, 1, 7, "p100")], NOW).wake == ("p",)
    assert right_size([v, p], [Need(NOW, 1, 7, "v100")], NOW).wake == ()
    assert right_size([v, p], [Need(NOW, 1)], NOW).wake == ()


def test_an_idle_node_is_not_kept_on_for_a_need_of_another_type():
    v = NodePower("v", 2, 2, ON, NOW - 1e4, 300.0, 1800.0, "v100")
    p = NodePower("p", 2, 2, ON, None, 300.0, 1800.0, "p100")
    assert right_size([v, p], [Need(NOW + 60, 2, None, "p100")], NOW).power_off == ("v",)


def test_a_need_wider_than_a_node_wakes_only_what_the_nodes_on_lack():
    """16 GPUs with a's 8 free: b alone is woken, not b and c."""
    nodes = [node("a"), node("b", state=OFF), node("c", state=OFF), node("d", state=OFF)]
    assert right_size(nodes, [Need(NOW, 16)], NOW).wake == ("b",)


def test_no_wake_for_a_start_a_running_job_frees_gpus_for_before_the_wake_up():
    nodes = [node("a", free=0), node("b", state=OFF)]
    needs = [Need(NOW + 60, 8)]
    assert right_size(nodes, needs, NOW).wake == ("b",)  # without the running job's end
    assert right_size(nodes, needs, NOW, [("a", NOW + 100, 8)]).wake == ()
    assert right_size(nodes, needs, NOW, [("a", NOW + 900, 8)]).wake == ("b",)  # too late
