"""The memory caps of the partitioner (``partition._memory_reach``: per stage and start
layer, the furthest end layer whose memory stays within the stage's cap), against a brute
force, whether the rows come as lists or as one numpy matrix (the planner's cut (b)); and
the capped cut (:func:`capped_partition`, :func:`capped_within`) the same for both."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.partition import PartitionError, _memory_reach, capped_partition, capped_within


def furthest(row: list[float], cap: float, i: int) -> int:
    """The largest j >= i with sum(row[i:j]) <= cap, summed left to right as cumsum does."""
    prefix = [0.0]
    for x in row:
        prefix.append(prefix[-1] + x)
    return max(j for j in range(i, len(row) + 1) if prefix[j] <= prefix[i] + cap)


@settings(max_examples=80, deadline=None)
@given(L=st.integers(1, 9), S=st.integers(1, 4), data=st.data())
def test_reach_is_the_brute_force_for_lists_and_matrices(L, S, data):
    S = min(S, L)
    same = data.draw(st.booleans())  # one row for every stage, or one row per stage
    n_rows = 1 if same else S
    rows = [data.draw(st.lists(st.integers(0, 6).map(float), min_size=L, max_size=L))
            for _ in range(n_rows)]
    caps = data.draw(st.lists(st.integers(0, 12).map(float), min_size=S, max_size=S))
    got = _memory_reach(rows, caps, S, L)
    assert [r.tolist() for r in got] == [
        [furthest(rows[0 if same else k], caps[k], i) for i in range(L + 1)]
        for k in range(S)]
    matrix = [r.tolist() for r in _memory_reach(np.array(rows), caps, S, L)]
    assert matrix == [r.tolist() for r in got]
    costs = data.draw(st.lists(st.integers(1, 5).map(float), min_size=L, max_size=L))
    bottleneck = float(data.draw(st.integers(1, 20)))
    assert (capped_within(costs, S, rows, caps, bottleneck)
            == capped_within(costs, S, np.array(rows), caps, bottleneck))
    try:
        want = capped_partition(costs, S, rows, caps)
    except PartitionError:
        want = None
    try:
        assert capped_partition(costs, S, np.array(rows), caps) == want
    except PartitionError:
        assert want is None


def test_reach_by_hand():
    # layers of 2, 1, 3 bytes under a cap of 3: from layer 0 two layers fit (2 + 1), from
    # layer 1 one (1, then 1 + 3 > 3), from layer 2 one (3), from the end none
    assert _memory_reach([[2.0, 1.0, 3.0]], 3.0, 1, 3)[0].tolist() == [2, 2, 3, 3]
