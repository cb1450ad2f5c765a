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
    return clock, replay_on(clock, schedule)


def replay_on(clock, schedule):
    """:func:`replay` on a given clock: each action's (start, end)."""
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
    return times


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


def _unit_costs():
    # per chunk F = I = W = 1 on the V placement (2 chunks), one activation unit per F
    # freed by W (M_W = M_B): the building blocks' units
    return CostModel(f=2, b=4, w=2, activation_memory=2, weight_memory=2)


def test_unit_clock_replays_a_v_schedule_with_the_reference_times_as_ints():
    s = get_schedule("zb-v", ranks=3, microbatches=6)
    clock = Clock.units(tuple(s.stage_to_rank), s.num_microbatches)
    times = replay_on(clock, s)
    t = simulate_reference(s, _unit_costs())
    want = {Action(e.stage, e.kind, e.microbatch): (e.start, e.end) for e in t.events()}
    assert times == want
    assert all(type(v) is int for pair in times.values() for v in pair)
    assert clock.step_time == t.step_time


def test_unit_clock_memory_is_the_walk_until_w_and_until_i():
    """used counts each activation from its F to its W, used_i to its I: their highest
    levels over a replay are the schedule's peaks with M_W = M_B and with M_W = 0."""
    from pipebubble.sim.program import schedule_peaks

    s = get_schedule("zb-v", ranks=3, microbatches=5)
    clock = Clock.units(tuple(s.stage_to_rank), s.num_microbatches, limits_i=[99] * 3)
    top, top_i = [0.0] * 3, [0.0] * 3
    for r, order in enumerate(s.orders):  # one rank after another: memory is per rank
        for a in order:
            clock.place(clock.id(a.kind, a.stage, a.microbatch), 0)
            top[r] = max(top[r], clock.used[r])
            top_i[r] = max(top_i[r], clock.used_i[r])
    assert top == schedule_peaks(s, CostModel(activation_memory=2, weight_memory=2))
    assert top_i == schedule_peaks(s, CostModel(activation_memory=2, weight_memory=0))
    assert clock.used == [0.0] * 3 and clock.used_i == [0.0] * 3


@pytest.mark.parametrize("units", [True, False])
def test_place_at_is_place_of_each(units):
    """One call per time step books exactly what one call per action does, on the unit
    body (Clock.units) and on the general one (float costs, limits_i counted)."""
    s = get_schedule("zb-v", ranks=2, microbatches=4)
    where = tuple(s.stage_to_rank)

    def make():
        if units:
            return Clock.units(where, 4, limits=[9] * 2, limits_i=[9] * 2)
        sc = CostModel(f=1.5, b=3.0, w=1.0, comm=0.25).resolve(4, 2)
        return Clock(sc, where, 4, limits=[9.0] * 2, limits_i=[9.0] * 2)

    one, many = make(), make()
    steps = {}  # the actions three at a time, one start per group
    for i, a in enumerate(a for o in s.orders for a in o):
        steps.setdefault(i // 3, []).append(one.id(a.kind, a.stage, a.microbatch))
    for t, xs in sorted(steps.items()):
        for x in xs:
            one.place(x, t)
        many.place_at(xs, t)
    for name in ("ready", "end", "free", "used", "used_i", "begin", "busy"):
        assert getattr(one, name) == getattr(many, name), name


def test_unit_body_equals_the_general_body():
    """Clock.units' folded-in constants give the times and memory the general body gives
    for the same unit costs as floats."""
    s = get_schedule("zb-v", ranks=3, microbatches=4)
    where = tuple(s.stage_to_rank)
    sc = _unit_costs().resolve(6, 2)
    unit, general = Clock.units(where, 4, limits_i=[9] * 3), Clock(sc, where, 4,
                                                                   limits_i=[9.0] * 3)
    for t, a in enumerate(a for o in s.orders for a in o):
        x = unit.id(a.kind, a.stage, a.microbatch)
        assert unit.place(x, t) == general.place(x, float(t))
        assert unit.ready == general.ready and unit.used == general.used
        assert unit.used_i == general.used_i


def test_limits_i_uses_the_one_tolerance_and_names_bad_input():
    c = Clock.units((0, 1, 1, 0), 1, limits_i=[3, 3])
    assert c.room_i[0] == 3 + 3e-9 and c.room == [float("inf")] * 2
    with pytest.raises(ValueError, match="limits_i has 1 values; expected one per rank"):
        Clock.units((0, 1, 1, 0), 1, limits_i=[3])


# The unit calendar: passes booked at units they have not reached yet.

def _unit_starts(s):
    """Each action's start under unit costs (the reference simulator; ints)."""
    t = simulate_reference(s, _unit_costs())
    return {Action(e.stage, e.kind, e.microbatch): round(e.start) for e in t.events()}


def _count(s, at, rank, u, frees):
    """Brute force: rank's activations during unit u, each from its F's unit to its
    ``frees`` pass's unit (both included), every pass at ``at[pass]``."""
    return sum(1 for a in s.orders[rank] if a.kind == "F" and at[a] <= u
               and not at[Action(a.stage, frees, a.microbatch)] < u)


def _booked(s, at, horizon, **limits):
    c = Clock.units(tuple(s.stage_to_rank), s.num_microbatches, **limits)
    c.calendar(horizon)
    for a, t in at.items():
        c.book(c.id(a.kind, a.stage, a.microbatch), t)
    return c


def test_calendar_levels_count_each_activation_at_every_unit_and_peak_as_the_walk():
    from pipebubble.sim.program import schedule_peaks

    s = get_schedule("zb-v", ranks=3, microbatches=5)
    at = _unit_starts(s)
    horizon = max(at.values()) + 2
    c = _booked(s, at, horizon)
    for r in range(3):
        assert c.held[r] == [_count(s, at, r, u, "W") for u in range(horizon)]
        assert c.held_i[r] == [_count(s, at, r, u, "I") for u in range(horizon)]
        assert [c.taken[r][at[a]] - 1 for a in s.orders[r]] == [
            c.id(a.kind, a.stage, a.microbatch) for a in s.orders[r]]
    assert c.booked() == [[c.id(a.kind, a.stage, a.microbatch) for a in o] for o in s.orders]
    # the highest level of a unit is the memory walk's peak (M_W = M_B, and M_W = 0)
    assert [max(row) for row in c.held] == schedule_peaks(
        s, CostModel(activation_memory=2, weight_memory=2))
    assert [max(row) for row in c.held_i] == schedule_peaks(
        s, CostModel(activation_memory=2, weight_memory=0))
    # booking after the levels were read updates them the same way
    late = Clock.units(tuple(s.stage_to_rank), 5)
    late.calendar(horizon)
    first = dict(list(at.items())[:7])
    for a, t in first.items():
        late.book(late.id(a.kind, a.stage, a.microbatch), t)
    assert late.held[0] is not None
    for a, t in list(at.items())[7:]:
        late.book(late.id(a.kind, a.stage, a.microbatch), t)
    assert late.held == c.held and late.held_i == c.held_i


def test_calendar_fits_from_and_first_free_are_the_brute_force_answers():
    s = get_schedule("zb-v", ranks=3, microbatches=5)
    at = {a: 2 * t for a, t in _unit_starts(s).items()}  # every other unit free
    horizon = max(at.values()) + 2
    c = _booked(s, at, horizon, limits=[3, 4, 5], limits_i=[3, 2, 5])
    for r, (lim, lim_i) in enumerate(((3, 3), (4, 2), (5, 5))):
        def fits(v, r=r, lim=lim, lim_i=lim_i):
            return fits_limit(c.held[r][v] + 1, lim) and fits_limit(c.held_i[r][v] + 1, lim_i)
        for hi in range(0, horizon, 3):
            for lo in range(0, hi + 1, 2):
                want = min(u for u in range(lo, hi + 1) if all(map(fits, range(u, hi))))
                assert c.fits_from(r, lo, hi) == want
                free = [u for u in range(lo, hi) if c.taken[r][u] == 0]
                assert c.first_free(r, lo, hi) == (free[0] if free else -1)


def test_pull_moves_a_booking_and_keeps_the_levels_a_fresh_count():
    """Visiting the passes in booked order, each pulled to the first free unit after its
    inputs (a forward: only over units where one more fits): the placements are the
    calendar's, the incremental levels equal a fresh calendar of the final units, and the
    limit stopped some forward short of a free unit."""
    s = get_schedule("zb-v", ranks=3, microbatches=5)
    at = {a: 2 * t for a, t in _unit_starts(s).items()}
    horizon = max(at.values()) + 2
    limits = {"limits": [3] * 3, "limits_i": [2] * 3}
    c = _booked(s, at, horizon, **limits)
    stopped = 0
    for a, t in sorted(at.items(), key=lambda kv: kv[1]):
        x = c.id(a.kind, a.stage, a.microbatch)
        r = s.stage_to_rank[a.stage]
        lo = c.ready[x]
        want = c.first_free(r, c.fits_from(r, lo, t) if a.kind == "F" else lo, t)
        stopped += a.kind == "F" and want != c.first_free(r, lo, t)
        got = c.pull(x, t, lo)
        assert got == (t if want < 0 else want) and c.end[x] == got + 1
        at[a] = got
    assert stopped
    fresh = _booked(s, at, horizon, **limits)
    assert c.held == fresh.held and c.held_i == fresh.held_i and c.taken == fresh.taken


def test_calendar_bad_input_is_named():
    sc = CostModel().resolve(2, 1)
    with pytest.raises(ValueError, match="unit calendar is for unit clocks"):
        Clock(sc, (0, 1), 1).calendar(4)
    c = Clock.units((0, 1, 1, 0), 2)
    with pytest.raises(ValueError, match="horizon must be >= 1, got 0"):
        c.calendar(0)
    c.calendar(6)
    c.book(c.id("F", 0, 0), 0, count=2, every=3)
    with pytest.raises(ValueError, match="taken on rank 0"):
        c.book(c.id("F", 3, 0), 3)
    with pytest.raises(ValueError, match="outside 0 .. 5"):
        c.book(c.id("I", 0, 0), 4, count=2, every=2)
    with pytest.raises(ValueError, match="3 passes every 1 from microbatch 0 of 2"):
        c.book(c.id("W", 0, 0), 1, count=3)
