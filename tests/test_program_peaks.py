"""``sim/program.schedule_peaks`` keeps each order's peaks by memory table: asked again
under costs it has seen, interleaved with others, it must still give each rank's peak as a
simulation's Timeline records it (the memory walk over the timed events)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.ir.schedule import ScheduleError
from pipebubble.sim.program import schedule_peaks

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev", "v-half")
MEMORY = st.integers(0, 40).map(float)  # whole bytes: the walk's sums are exact in any order


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(2, 4), m=st.integers(1, 9),
       costs=st.lists(st.tuples(MEMORY, MEMORY, st.booleans()), min_size=2, max_size=4),
       asks=st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_kept_peaks_are_the_timelines(name, p, m, costs, asks):
    try:
        sched = get_schedule(name, p, m)
    except (ScheduleError, ValueError):  # a family that needs more microbatches or p
        return
    models = [CostModel(activation_memory=a + w, weight_memory=w, recompute=r,
                        input_memory=w / 2 if r else 0.0) for a, w, r in costs]
    want = [[r.peak_memory for r in simulate(sched, c).rank_stats()] for c in models]
    for k in asks:  # the same costs again, in any order: the kept peaks
        k %= len(models)
        assert schedule_peaks(sched, models[k]) == want[k]


def test_peaks_by_hand_under_two_memory_costs():
    # 1F1B p=2 m=4: rank 0 holds 2 microbatches at once, rank 1 one; M_B 3 then 5
    s = get_schedule("1f1b", 2, 4)
    assert schedule_peaks(s, CostModel(activation_memory=3)) == [6.0, 3.0]
    assert schedule_peaks(s, CostModel(activation_memory=5)) == [10.0, 5.0]
    assert schedule_peaks(s, CostModel(activation_memory=3)) == [6.0, 3.0]
