"""``sim/program.schedule_peaks`` keeps each order's peaks by memory table: asked again
under costs it has seen, interleaved with others, it must still give each rank's peak as a
simulation's Timeline records it (the memory walk over the timed events)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.ir.schedule import Overlap, ScheduleError
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


def walk_in_floats(sched, costs) -> list[float]:
    """The reference: each rank's start and end deltas in its order, one float running sum
    (numpy's cumsum, as the Timeline sums them), its highest value and 0."""
    import numpy as np

    sc = costs.resolve(sched.num_stages, sched.chunks)
    out = []
    for order in sched.orders:
        acts = [a for step in order for a in (step if type(step) is Overlap else (step,))]
        d = [x for a in acts for x in sc.memory_deltas(a.stage, a.kind)]
        out.append(max(0.0, float(np.cumsum(np.array(d, dtype=np.float64)).max()))
                   if d else 0.0)
    return out


# whole bytes up to the scale of real activations, huge ones past 2^53 / ranks (the float
# walk rounds there: the exact int sums must not be used) and fractions (never exact)
BYTES = st.one_of(st.integers(0, 2 ** 40).map(float), st.integers(2 ** 52, 2 ** 60).map(float),
                  st.floats(0, 1e6, allow_nan=False).map(lambda x: x + 0.3))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(("1f1b", "zb-h2", "zbv", "interleaved-1f1b", "dualpipev")),
       p=st.integers(2, 4), m=st.integers(1, 8), act=BYTES, wgt=BYTES, rec=st.booleans())
def test_peaks_are_the_float_walks(name, p, m, act, wgt, rec):
    try:
        sched = get_schedule(name, p, m)
    except (ScheduleError, ValueError):
        return
    costs = CostModel(activation_memory=act + wgt, weight_memory=wgt, recompute=rec,
                      input_memory=wgt if rec else 0.0)
    assert schedule_peaks(sched, costs) == walk_in_floats(sched, costs)
