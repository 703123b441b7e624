"""Best-fit placement: pure, no GPU given twice, the fullest node that fits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.best_fit import NodeCapacity, PlacementError, place


def test_fullest_fitting_node_wins():
    nodes = [NodeCapacity("a", (0, 1, 2, 3)), NodeCapacity("b", (0, 1, 2, 3), frozenset({0, 1}))]
    assert place(nodes, 2).node == "b"
    assert place(nodes, 3).node == "a"
    assert place(nodes, 2).gpu_indices == (2, 3)


def test_waits_when_busy_and_refuses_the_impossible():
    nodes = [NodeCapacity("a", (0, 1), frozenset({0}))]
    assert place(nodes, 2) is None
    with pytest.raises(PlacementError, match="largest node has 2"):
        place(nodes, 3)
    assert place(nodes, 0).gpu_indices == ()


@given(
    st.lists(st.integers(min_value=1, max_value=8), max_size=30),
    st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=4),
)
def test_no_gpu_is_ever_given_twice(requests, sizes):
    nodes = [NodeCapacity(f"n{i}", tuple(range(s))) for i, s in enumerate(sizes)]
    held: dict[str, set[int]] = {n.name: set() for n in nodes}
    for gpus in requests:
        caps = [NodeCapacity(n.name, n.gpu_indices, frozenset(held[n.name])) for n in nodes]
        if gpus > max(sizes):
            with pytest.raises(PlacementError):
                place(caps, gpus)
            continue
        choice = place(caps, gpus)
        fits = any(len(c.free) >= gpus for c in caps)
        assert (choice is not None) == fits, "refused only when nothing fits"
        if choice:
            assert len(choice.gpu_indices) == gpus
            assert not held[choice.node] & set(choice.gpu_indices)
            held[choice.node] |= set(choice.gpu_indices)
