"""sim/clock.py: the kernel's rule one action at a time equals the simulator."""

from __future__ import annotations

import pytest

from pipebubble import CostModel, get_schedule
from pipebubble.costs import fits_limit
from pipebubble.ir.schedule import Action, v_placement
from pipebubble.sim import simulate_reference
from pipebubble.sim.clock import Clock


def replay(schedule, costs):
    """Place a schedule's actions (F, I, W only) through a Clock, each rank in its order,
    each action at its earliest start, sweeping the ranks until all are placed; returns
    the clock and each action's (start, end)."""
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    clock = Clock(sc, tuple(schedule.stage_to_rank), schedule.num_microbatches,
                  chain_starts=tuple(schedule.chain_starts))
    at = [0] * schedule.num_ranks
    times = {}
    moved = True
    while moved:
        moved = False
        for r, order in enumerate(schedule.orders):
            while at[r] < len(order):
                a = order[at[r]]
                x = clock.id(a.kind, a.stage, a.microbatch)
                start = clock.earliest(x)
                if start == float("inf"):
                    break
                times[a] = (start, clock.place(x, start))
                at[r] += 1
                moved = True
    assert at == [len(o) for o in schedule.orders]  # a valid schedule never sticks
    return clock, times


@pytest.mark.parametrize("name,ranks,micro,costs", [
    ("zb-h1", 4, 8, CostModel(f=1, b=2.5, w=0.75, comm=0.3)),
    ("zb-h2", 3, 6, CostModel(f=[1.0, 1.3, 0.7], b=2.1, w=0.9, comm=0.25)),
    ("zb-v", 3, 6, CostModel(f=1.1, b=2.0, w=0.8, comm=0.2)),
])
def test_replayed_orders_get_the_reference_simulators_times(name, ranks, micro, costs):
    s = get_schedule(name, ranks=ranks, microbatches=micro)
    clock, times = replay(s, costs)
    t = simulate_reference(s, costs)
    want = {Action(e.stage, e.kind, e.microbatch): (e.start, e.end) for e in t.events()}
    assert times == want  # the same doubles: the kernel's rule and arithmetic
    assert clock.step_time == t.step_time


def test_ready_times_and_the_memory_test():
    sc = CostModel(f=1, b=2, w=1, comm=0.5, activation_memory=2.0).resolve(2, 1)
    c = Clock(sc, (0, 1), 2, limits=[2.0, 3.0])
    f00, f10, i10, i00 = (c.id("F", 0, 0), c.id("F", 1, 0), c.id("I", 1, 0),
                          c.id("I", 0, 0))
    assert c.earliest(f00) == 0.0 and c.earliest(f10) == float("inf")
    c.place(f00, 0.0)
    assert c.earliest(f10) == 1.5  # its input: 1, plus comm to the other rank
    assert c.earliest(i00) == float("inf")  # needs I(1) too
    c.place(f10, 2.0)  # later than its earliest: the caller chose to wait
    assert c.earliest(i10) == 3.0  # its own F's end: same rank, no lag
    c.place(i10, 3.0)
    assert c.earliest(i00) == 4.5  # the later of F(0)'s end (1) and I(1)'s + comm
    assert c.used == [2.0, 2.0 + sc.memory_deltas(1, "I")[0] + sc.memory_deltas(1, "I")[1]]
    # fits is fits_limit, and room is the highest level it passes
    for extra in (0.0, 1e-10, 1e-8, -1.0):
        assert c.fits(0, extra) == fits_limit(2.0 + extra, 2.0)
        assert (2.0 + extra <= c.room[0]) == fits_limit(2.0 + extra, 2.0)


def test_v_placement_turn_has_no_lag_and_bad_input_is_named():
    sc = CostModel(comm=0.5).resolve(4, 2)
    c = Clock(sc, tuple(v_placement(2)), 1)
    assert c.hop[c.id("F", 2, 0)] == 0.0  # F(1) -> F(2): both on rank 1
    assert c.hop[c.id("F", 1, 0)] == 0.5
    with pytest.raises(ValueError, match="limits has 1 values"):
        Clock(sc, tuple(v_placement(2)), 1, limits=[1.0])
