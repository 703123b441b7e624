"""Conservative backfill's reservations (``orchestrator.planning.profile``): the fast
search (the cluster on one integer, a sweep that starts where an earlier, narrower and no
longer request found its time) finds what a plain sweep over every candidate time finds,
block for block."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestrator.planning.profile import Profile, Reservation
from placement.buddy import choose
from placement.topology import ClusterTopology, NodeTopology


def _reference(profile: Profile, width: int, run_s, reservations) -> tuple | None:
    """The plain sweep: every holder end and reservation end from now, per-node masks,
    the first time ``Profile._place`` finds a block."""
    now, inf = profile.now_s, float("inf")
    nodes = range(len(profile.sizes))
    holders = [(end, profile.unpack(packed)) for end, packed in profile.holders]
    times = {now} | {e for e, _ in holders if now < e < inf}
    times |= {r.end_s for r in reservations if r.end_s is not None and r.end_s > now}
    for t in sorted(times):
        end = None if run_s is None else t + run_s
        window = [0] * len(profile.sizes)
        for e, masks in holders:
            if e > t:
                window = [window[i] | masks[i] for i in nodes]
        for r in reservations:
            if (end is None or r.start_s < end) and (r.end_s is None or r.end_s > t):
                for i, m in r.masks.items():
                    window[i] |= m
        masks = profile._place(width, window)
        if masks is not None:
            return t, end, masks
    return None


HOLDERS = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 8), st.one_of(st.none(), st.integers(1, 30))),
    max_size=8,
)
ASKS = st.lists(
    st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(1, 30))), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.sampled_from([2, 4, 6, 8]), min_size=1, max_size=4),
       holders=HOLDERS, asks=ASKS)  # fmt: skip
# a short 2-GPU request fits at 5 h before the 4-GPU reservation at 30 h; a longer one
# found 40 h, which is no bound for it
@example(sizes=[4], holders=[(0, 2, 5), (0, 2, 30)], asks=[(4, 10), (2, 50), (2, 10)])
def test_the_fast_search_reserves_what_a_plain_sweep_reserves(sizes, holders, asks):
    nodes = tuple(NodeTopology.plain(f"n{i}", s) for i, s in enumerate(sizes))
    profile = Profile(ClusterTopology(nodes), 0.0)
    free = [(1 << s) - 1 for s in sizes]
    for node, width, end in holders:  # running jobs on disjoint GPUs
        i = node % len(sizes)
        mask = choose(sizes[i], free[i], min(width, sizes[i]))
        if mask:
            free[i] &= ~mask
            profile.hold({i: mask}, None if end is None else float(end))
    reservations: list[Reservation] = []
    for width, run in asks:
        run_s = None if run is None else float(run)
        want = _reference(profile, width, run_s, reservations) if width else None
        got = profile.reserve(width, run_s, reservations)
        if not width:
            continue
        assert (None if got is None else (got.start_s, got.end_s, got.masks)) == want
        if got is None:
            break  # as conservative backfill does: nothing passes such a job
        reservations.append(got)
