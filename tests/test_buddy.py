"""Buddy allocation and network packing: properties checked with hypothesis against a
brute-force oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.buddy import choose, next_pow2, positions
from placement.cluster import ClusterAllocator
from placement.errors import PlacementError
from placement.topology import ClusterTopology, NodeTopology, order_from_link_levels


def legal_block_exists(n: int, free: int, k: int) -> bool:
    s = next_pow2(k)
    return any(free >> start & ((1 << s) - 1) == (1 << s) - 1 for start in range(0, n - s + 1, s))


@given(st.integers(min_value=1, max_value=12), st.data())
def test_choose_is_aligned_free_and_refuses_only_when_nothing_is_legal(n, data):
    free = data.draw(st.integers(min_value=0, max_value=(1 << n) - 1))
    k = data.draw(st.integers(min_value=1, max_value=n))
    mask = choose(n, free, k)
    if not legal_block_exists(n, free, k):
        assert mask == 0
        return
    taken = positions(mask)
    s = next_pow2(k)
    assert len(taken) == k and mask & ~free == 0, "only free GPUs, exactly k"
    assert taken[0] % s == 0 and taken[-1] < taken[0] + s, "inside one aligned block"


def test_four_gpu_job_gets_an_nvlink_island():
    # islands {0,2,4,6} and {1,3,5,7}: buddy order keeps each island in one aligned half
    node = NodeTopology.from_islands("dgx", [[0, 2, 4, 6], [1, 3, 5, 7]])
    alloc = ClusterAllocator(ClusterTopology((node,)))
    assert alloc.allocate("a", 1).parts == (("dgx", (0,)),)
    assert alloc.allocate("b", 4).parts == (("dgx", (1, 3, 5, 7)),), "the untouched island"


def test_order_from_nvml_link_levels():
    # GPUs 0,1 on one switch (10), 2,3 on another; pairs across switches meet at 20;
    # sockets: {0,1,2,3} vs {4,5,6,7} at 50
    lv = [
        [
            0 if i == j else 10 if i // 2 == j // 2 else 20 if i // 4 == j // 4 else 50
            for j in range(8)
        ]
        for i in range(8)
    ]
    perm = [0, 4, 1, 5, 2, 6, 3, 7]  # the same machine with GPUs enumerated interleaved
    shuffled = [[lv[perm[i]][perm[j]] for j in range(8)] for i in range(8)]
    order = order_from_link_levels(shuffled)
    blocks = [sorted(perm[g] // 2 for g in order[i : i + 2]) for i in range(0, 8, 2)]
    assert all(b[0] == b[1] for b in blocks), "each aligned pair shares a switch"
    halves = [{perm[g] // 4 for g in order[i : i + 4]} for i in (0, 4)]
    assert all(len(h) == 1 for h in halves), "each aligned quad shares a socket"


def _cluster(sizes, racks=None):
    nodes = tuple(
        NodeTopology.plain(f"n{i}", s, rack=(racks or {}).get(i, f"r{i // 2}"))
        for i, s in enumerate(sizes)
    )
    return ClusterAllocator(ClusterTopology(nodes))


ops = st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=20)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 6, 8]), min_size=1, max_size=6), ops)
def test_no_gpu_twice_and_free_restores_everything(sizes, operations):
    alloc = _cluster(sizes)
    initial = (list(alloc._free), list(alloc._count), [dict(b) for b in alloc._buckets])
    live: list[int] = []
    for n, (do_alloc, k) in enumerate(operations):
        if do_alloc or not live:
            try:
                result = alloc.allocate(n, k)
            except PlacementError:
                assert k > sum(sizes)
                continue
            if result is None:
                single_ok = any(
                    s >= k and legal_block_exists(s, alloc._free[i], k) for i, s in enumerate(sizes)
                )
                assert not single_ok, "refused although a node had a legal block"
                continue
            assert result.gpus >= k
            live.append(n)
        else:
            alloc.free(live.pop(0))
        held = [(node, g) for a in alloc.allocations().values() for node, gs in a.parts for g in gs]
        assert len(held) == len(set(held)), "a GPU was given twice"
        assert alloc.free_gpus + len(held) == sum(sizes)
    for key in live:
        alloc.free(key)
    assert (list(alloc._free), list(alloc._count)) == initial[:2]
    assert [set(b) for b in alloc._buckets] == [set(b) for b in initial[2]]


def test_best_fit_keeps_whole_nodes_free():
    alloc = _cluster([8, 8, 8])
    alloc.allocate("a", 2)
    alloc.allocate("b", 2)
    assert {a.parts[0][0] for a in alloc.allocations().values()} == {"n0"}
    assert alloc.idle_nodes() == 2


def test_wide_jobs_take_whole_nodes_in_as_few_racks_as_possible():
    alloc = _cluster([8] * 6, racks={0: "a", 1: "b", 2: "b", 3: "c", 4: "c", 5: "c"})
    job = alloc.allocate("wide", 16)
    assert {node for node, _ in job.parts} == {"n1", "n2"}, "rack b fits it exactly"
    alloc.allocate("small", 1)  # lands on n0 (rack a), the fullest fitting... all equal
    job2 = alloc.allocate("wider", 24)
    assert {node for node, _ in job2.parts} == {"n3", "n4", "n5"}
    assert alloc.allocate("more", 16) is None


def test_fragmentation_and_idle_nodes():
    alloc = _cluster([8, 8])
    for i in range(4):
        alloc.allocate(f"one{i}", 1)
    assert alloc.fragmentation(8) == 4  # n0's four free GPUs cannot serve 8
    assert alloc.fragmentation(4) == 0  # they are an aligned free half
    assert alloc.idle_nodes() == 1
    with pytest.raises(PlacementError):
        alloc.allocate("huge", 17)


def test_make_room_releases_the_fewest_movable_gpus():
    alloc = _cluster([8, 8])
    for i in range(6):
        alloc.allocate(f"a{i}", 1)  # fills n0 from the fullest node: six on n0
    alloc.allocate("pinned", 2)  # n0's last two
    for i in range(3):
        alloc.allocate(f"b{i}", 1)  # n1
    movable = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(3)]
    assert alloc.allocate("urgent", 8) is None
    victims = alloc.make_room(8, movable)
    assert sorted(victims) == ["b0", "b1", "b2"], "n1 needs three released, n0 cannot clear"
    assert alloc.allocate("check", 1) is not None  # nothing was released by asking
    alloc.free("check")
    for key in victims:
        alloc.free(key)
    assert alloc.allocate("urgent", 8) is not None
    # a job wider than a node needs whole nodes, every holder of which may move
    alloc.free("urgent")
    assert alloc.make_room(16, movable) is None  # "pinned" holds n0
    assert sorted(alloc.make_room(16, [*movable, "pinned"]), key=str)[0] == "a0"
    assert alloc.make_room(4, []) is None


def test_room_if_freed_is_asked_on_a_copy():
    """Whether a job that does not fit now would once one allocation left (co-location
    moves ask it): the allocator itself is left as it was, its placements unchanged."""
    from placement.cluster import ClusterAllocator
    from placement.topology import ClusterTopology, NodeTopology

    def three() -> ClusterAllocator:
        nodes = [NodeTopology.plain(f"n{i}", 4) for i in range(3)]
        alloc = ClusterAllocator(ClusterTopology(nodes))
        for i in range(3):
            alloc.hold(("job", i), f"n{i}", [0])
        return alloc

    alloc, control = three(), three()
    assert alloc.room_if_freed(("job", 0), 2) is False  # it fits already
    assert alloc.room_if_freed(("job", 0), 4) is True  # only with n0 freed
    assert alloc.room_if_freed(("job", 9), 4) is False  # holds nothing
    assert alloc.room_if_freed(("job", 0), 4, gpu_type="a100") is False  # no such GPUs
    assert alloc.held_masks() == control.held_masks()
    assert alloc.allocate("next", 2).parts == control.allocate("next", 2).parts
