"""The list scheduler of ``schedules/building_block.py`` (:func:`_reorder`) lets a rank
that picked nothing sleep until its own state, a neighbouring rank's pass or a ready time
can change its pick. Asleep or looked at every unit (``every_unit``, the plain loop), it
must pick the same passes: the same step and the same orders, or both stall."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.ir.schedule import ScheduleError
from pipebubble.schedules import building_block as bb
from pipebubble.schedules.auto.adaptive import warmup_targets
from pipebubble.schedules.v_half import v_half_offsets, v_half_published_offsets
from pipebubble.schedules.v_min import v_min_offsets, v_min_published_offsets

BLOCKS = (v_half_offsets, v_min_offsets, v_half_published_offsets, v_min_published_offsets)
# any block: (dF0, dF1, dI0, dI1, turn_f, turn_i, top), most collide somewhere
OFFSETS = st.tuples(*[st.integers(1, 3)] * 6, st.integers(1, 6))


@settings(max_examples=200, deadline=None)
@given(p=st.integers(1, 8), extra_m=st.integers(0, 12),
       which=st.one_of(st.sampled_from(BLOCKS), OFFSETS),
       moved=st.booleans(), more=st.integers(0, 3), fill=st.booleans(),
       warm=st.booleans(), deep=st.integers(0, 2), cap_i=st.booleans())
def test_sleeping_ranks_pick_what_looking_every_unit_picks(p, extra_m, which, moved, more,
                                                          fill, warm, deep, cap_i):
    m = 1 + extra_m
    try:
        times = bb.block(p, which if isinstance(which, tuple) else which(p))
    except ScheduleError:  # a block that collides at this p: nothing to reorder
        return
    rows = bb.repeat(p, m, times)
    cap, held_i = bb.peak(p, rows), bb.peak(p, rows, frees="I")
    if moved:
        rows = bb.reorder_ends(p, m, times, cap, held_i)
    k = cap + more
    c_i = max(k, held_i) if cap_i else None
    targets = warmup_targets(p, m, k) if warm else None
    args = (p, m, tuple(map(tuple, rows)), k, c_i, fill,
            None if targets is None else tuple(targets), deep if warm else 0)
    asleep = bb._reorder(*args)
    every = bb._reorder(*args, every_unit=True)
    assert asleep == every


def test_the_doc_example_by_hand():
    # 2 ranks, 2 microbatches, the unit block: 13 units once reordered (15 squeezed)
    rows = bb.repeat(2, 2, bb.block(2, (1, 1, 1, 1, 1, 1, 1)))
    step, new = bb._reorder(2, 2, rows, 4, None, True, None, 0)
    assert step == 13
    assert (step, new) == bb._reorder(2, 2, rows, 4, None, True, None, 0, every_unit=True)
    assert " ".join(map(str, new[0])) == "0F0 0F1 3F0 3I0 3W0 3F1 0I0 3I1 0W0 3W1 0I1 0W1"
