"""The greedy list scheduler (``schedules/auto/greedy.py``): its unrolled loops for one and
two stages a rank (the loop and V placements) make the general loop's choices, and its packed
orders are its tuple orders."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import loop_placement, v_placement
from pipebubble.schedules.auto.greedy import Knobs, _greedy_ids, greedy_order

knobs = st.builds(Knobs, cap=st.sampled_from(["1f1b", "h2", "memory"]), lazy_w=st.booleans(),
                  wait_i=st.booleans(), deep_first=st.booleans(), critical=st.booleans())


@settings(max_examples=300, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 8), f=st.floats(0.1, 3), b=st.floats(0.3, 4),
       w=st.floats(0, 1), comm=st.sampled_from([0.0, 0.1, 0.5]),
       recompute=st.booleans(), limit=st.sampled_from([None, 1.0, 1.5, 2.0, 3.0, 6.0]),
       v=st.booleans(), knobs=knobs)
def test_unrolled_loops_make_the_general_loops_choices(p, m, f, b, w, comm, recompute, limit,
                                                       v, knobs):
    w = min(w, 0.9) * b  # (W is a part of the full backward)
    where = v_placement(p) if v else loop_placement(p, p)
    sc = CostModel(f=f, b=b, w=w, comm=comm, activation_memory=1, weight_memory=0.4,
                   recompute=recompute).resolve(len(where), 2 if v else 1)
    limits = None if limit is None else [(1 + v) * limit + 0.3 * r for r in range(p)]
    fast = _greedy_ids(p, m, sc, where, limits, knobs)
    general = _greedy_ids(p, m, sc, where, limits, knobs, one_stage=False)
    assert fast == general  # the same orders, step and idle, to the bit


def test_packed_orders_hold_the_tuple_orders():
    sc = CostModel(f=1, b=2, w=1, comm=0.1).resolve(6)
    where = (0, 1, 2, 2, 1, 0)  # V placement
    orders, step, idle = greedy_order(3, 4, sc, where, [4.0] * 3, Knobs())
    packed, step2, idle2 = greedy_order(3, 4, sc, where, [4.0] * 3, Knobs(), packed=True)
    assert (step2, idle2) == (step, idle)
    assert [[tuple(a) for a in row] for row in packed] == [[tuple(a) for a in row]
                                                           for row in orders]
