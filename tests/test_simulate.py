from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.deps import producers
from pipebubble.ir.schedule import (
    Action,
    Overlap,
    ScheduleError,
    _scan,
    make_schedule,
    parse_step,
    step_actions,
    validate,
)
from pipebubble.schedules import get_schedule
from pipebubble.sim.formulas import bubble_fraction, gpipe_step_time
from pipebubble.sim.kernel import Deadlock, simulate
from pipebubble.sim.reference import simulate_reference
from strategies import random_valid_schedule, schedules_and_costs


def test_lesson_figures():
    assert round(bubble_fraction(4, 8) * 100, 2) == 27.27
    assert round(bubble_fraction(4, 64) * 100, 2) == 4.48
    with pytest.raises(ValueError, match="num_microbatches must be >= 1, got 0"):
        bubble_fraction(4, 0)


def test_hand_checked_step_time():
    # p=4, m=8, F=1, B=2: (8 + 4 - 1) * 3 = 33
    t = simulate(get_schedule("1f1b", 4, 8), CostModel(f=1, b=2))
    assert t.step_time == 33
    assert t.lower_bound == 24
    assert [s.span for s in t.rank_stats()] == [33, 30, 27, 24]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_simulator_equals_closed_form_over_grid(name):
    for p in range(1, 9):
        for m in range(1, 65):
            for f, b in [(1.0, 2.0), (0.5, 1.5)]:
                t = simulate(get_schedule(name, p, m), CostModel(f=f, b=b))
                assert t.step_time == pytest.approx(gpipe_step_time(p, m, f, b))
                assert t.bubble_fraction == pytest.approx(bubble_fraction(p, m))
                for s in t.rank_stats():
                    assert s.bubble_fraction == pytest.approx(bubble_fraction(p, m))


@pytest.mark.parametrize("p, m", [(4, 8), (4, 3), (8, 32), (2, 1)])
def test_peak_activations_gpipe_m_1f1b_p(p, m):
    g = simulate(get_schedule("gpipe", p, m)).rank_stats()
    o = simulate(get_schedule("1f1b", p, m)).rank_stats()
    assert all(s.peak_activations == m and s.peak_memory == m for s in g)
    for r, s in enumerate(o):
        assert s.peak_activations == min(p - r, m)
        assert s.peak_memory == min(p - r, m)


def test_comm_adds_per_hop():
    # 2 ranks, 1 microbatch, F=1, B=2, comm=0.5: F0, hop, F1, B1, hop, B0
    t = simulate(get_schedule("gpipe", 2, 1), CostModel(f=1, b=2, comm=0.5))
    assert t.step_time == pytest.approx(1 + 0.5 + 1 + 2 + 0.5 + 2)


def test_per_stage_costs_and_chunks():
    s = get_schedule("gpipe", 2, 1)
    t = simulate(s, CostModel(f=[1, 3], b=[2, 4]))
    assert t.step_time == 1 + 3 + 4 + 2
    sc = CostModel(f=1, b=2).resolve(stages=8, chunks=2)
    assert sc.f == [0.5] * 8 and sc.b == [1.0] * 8


@pytest.mark.parametrize(
    "costs, message",
    [
        (CostModel(f=[1, 2, 3]), "f has 3 values; expected 1 or 2"),
        (CostModel(f=-1), "f must be >= 0, got -0.5|f must be >= 0"),
        (CostModel(b=1, w=2), "w must be <= b"),
        (CostModel(comm=-1), "comm must be >= 0"),
    ],
)
def test_bad_costs_named(costs, message):
    with pytest.raises(ScheduleError, match=message):
        simulate(get_schedule("gpipe", 2, 2), costs)


def test_split_backward_and_memory_model():
    # One rank, one stage: F, I, W. M_B = 1, M_W = 0.25: I frees 0.75, W frees 0.25.
    s = make_schedule("t", [[Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)]], 1, 1)
    t = simulate(s, CostModel(f=1, b=2, w=0.5, activation_memory=1, weight_memory=0.25))
    assert [(e.kind, e.start, e.end) for e in t.events()] == [
        ("F", 0, 1), ("I", 1, 2.5), ("W", 2.5, 3)]
    times, values = t.memory_curve(0)
    assert values == [0, 1, 1, 1, 0.25, 0.25, 0.0]


def test_recompute_trades_memory_for_time():
    plain = simulate(get_schedule("gpipe", 2, 4), CostModel(f=1, b=2))
    rec = simulate(get_schedule("gpipe", 2, 4),
                   CostModel(f=1, b=2, recompute=True, input_memory=0.1))
    assert rec.step_time == pytest.approx((4 + 1) * (1 + 3))  # B grows by F
    # rank 0 holds 4 inputs (0.4) then re-materialises one stage's activations (+0.9)
    assert rec.rank_stats()[0].peak_memory == pytest.approx(0.4 + 0.9)
    assert plain.rank_stats()[0].peak_memory == 4


def test_overlapped_pair_is_one_block():
    orders = [[Action(0, "F", 0), Overlap(Action(0, "F", 1), Action(0, "B", 0)), Action(0, "B", 1)]]
    s = make_schedule("t", orders, 1, 2)
    full = simulate(s, CostModel(f=1, b=2))
    half = simulate(s, CostModel(f=1, b=2, overlap=0.5))
    assert full.step_time == 6
    assert half.step_time == pytest.approx(1 + 1.5 + 2)
    assert [e.overlapped for e in half.events()] == [False, True, True, False]


def test_two_ranks_wait_for_one_pair():
    """Rank 0 waits for the pair's gradient (1B0 -> 0B0) and rank 2 for its forward output
    (1F1 -> 2F1), both parked on the pair's end at once; both resume when it ends. By hand
    (F = 1, B = 2): 0F0 [0, 1], 0F1 [1, 2], 1F0 [1, 2], 2F0 [2, 3], 2B0 [3, 5], the pair
    [5, 8] (1F1 [5, 6], 1B0 [6, 8]), 2F1 [8, 9], 0B0 [8, 10], 2B1 [9, 11], 1B1 [11, 13],
    0B1 [13, 15]."""
    orders = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "(1F1;1B0)", "1B1"],
              ["2F0", "2B0", "2F1", "2B1"]]
    s = make_schedule("t", [[parse_step(a) for a in o] for o in orders], 3, 2)
    t = simulate(s, CostModel(f=1, b=2))
    spans = {f"{e.stage}{e.kind}{e.microbatch}": (e.start, e.end) for e in t.events()}
    assert spans == {"0F0": (0, 1), "0F1": (1, 2), "1F0": (1, 2), "2F0": (2, 3),
                     "2B0": (3, 5), "1F1": (5, 6), "1B0": (6, 8), "2F1": (8, 9),
                     "0B0": (8, 10), "2B1": (9, 11), "1B1": (11, 13), "0B1": (13, 15)}
    assert rows(t) == rows(simulate_reference(s, CostModel(f=1, b=2)))


def test_deadlock_names_every_stuck_rank():
    # A valid schedule whose ranks wait for each other: rank 0 runs B0 (which needs rank 1's
    # gradient of mb 0) before F1, while rank 1 runs mb 1 first (which needs rank 0's F1).
    orders = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    s = make_schedule("t", [[Action.from_str(a) for a in o] for o in orders], 2, 2)
    with pytest.raises(Deadlock) as info:
        simulate(s)
    assert info.value.stuck == {0: ("0B0", "0F0 and 1I/B0"), 1: ("1F1", "0F1")}
    assert str(info.value) == ("deadlock: rank 0 stuck at 0B0 waiting for 0F0 and 1I/B0; "
                               "rank 1 stuck at 1F1 waiting for 0F1")


def test_invalid_schedule_gets_validates_message():
    """simulate validates while it compiles: an invalid schedule fails with validate()'s
    own message, not as a deadlock."""
    orders = [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "B", 0), Action(1, "F", 0)]]
    s = make_schedule("t", orders, 2, 1)
    with pytest.raises(ScheduleError) as info:
        validate(s)
    with pytest.raises(ScheduleError, match="rank 1, action 1B0: backward before its forward"):
        simulate(s)
    assert "backward before its forward 1F0" in str(info.value)


@given(schedules_and_costs())
def test_invariants_hold_for_random_schedules(case):
    schedule, costs = case
    t = simulate(schedule, costs)
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    ev = {(e.stage, e.kind, e.microbatch): e for e in t.events()}
    assert len(ev) == len(t) == schedule.num_actions()
    for r in range(t.num_ranks):
        evs = list(t.events(r))
        for a, b in zip(evs, evs[1:], strict=False):
            assert b.start >= a.end - 1e-9, "two events overlap on a rank"
    pairs = {}  # each pair's part -> its (duration, hidden, exposed), by StageCosts.pair_parts
    for order in schedule.orders:
        for step in order:
            if isinstance(step, Overlap):
                parts = sc.pair_parts(step.forward.stage, step.backward.stage,
                                      step.backward.kind)
                pairs.update(zip((tuple(step.forward), tuple(step.backward)), parts,
                                 strict=True))
    for (s, k, m), e in ev.items():
        if e.overlapped:
            part = pairs[s, k, m]
            assert e.end - e.start == pytest.approx(part.duration)
            assert (e.a2a_hidden, e.a2a_exposed) == (part.hidden, part.exposed)
        else:  # a lone action takes its whole time and exposes its all-to-all
            assert e.end - e.start == pytest.approx(sc.duration(s, k))
            assert (e.a2a_hidden, e.a2a_exposed) == (0.0, sc.a2a(s, k))
        for dep in producers(Action(s, k, m), schedule):  # every dependency is respected
            sig = dep.signal
            d = ev.get((sig.stage, sig.kind, sig.microbatch)) or ev[sig.stage, "B", sig.microbatch]
            assert e.start >= d.end + (sc.comm if dep.crosses else 0) - 1e-9
    # the step runs from 0 (some action needs nothing and starts at once) to the last end
    assert min(e.start for e in ev.values()) == 0
    assert t.step_time == pytest.approx(max(e.end for e in ev.values()))
    assert 0 <= t.bubble_fraction < 1 or t.step_time == 0
    for stats in t.rank_stats():
        assert 0 <= stats.bubble_fraction <= 1
        assert stats.peak_memory >= 0


def rows(timeline):
    return [tuple(e) for e in timeline.events()]


@settings(max_examples=300)
@given(schedules_and_costs())
def test_kernel_equals_the_reference(case):
    """The fast kernel and the readable reference agree on every event (start, end, memory),
    the step time and every rank's figures, Overlap pairs and several chains included."""
    schedule, costs = case
    fast, slow = simulate(schedule, costs), simulate_reference(schedule, costs)
    assert rows(fast) == rows(slow)
    assert fast.step_time == slow.step_time
    assert [s.as_dict() for s in fast.rank_stats()] == [s.as_dict() for s in slow.rank_stats()]


def test_the_strategy_makes_overlaps_and_chains():
    """The property tests above see Overlap pairs and several chains (not only in theory)."""
    found = set()
    for seed in range(40):
        s = random_valid_schedule(seed, 3, 2, 3, split=seed % 2 == 0, placement="loop",
                                  chains=2, overlap=0.5)
        found |= {"overlap" for o in s.orders for step in o if isinstance(step, Overlap)}
        found |= {"chains"} if s.chains == 2 else set()
        simulate(s)  # valid and deadlock-free by construction
    assert found == {"overlap", "chains"}


def reorder(order, rnd):
    """A random order of one rank's steps that validate() still accepts: each backward after
    its forward and each W after its I (a random linear extension of those rules)."""
    def local_needs(a):
        before = {"B": "F", "I": "F", "W": "I"}.get(a.kind)
        return [Action(a.stage, before, a.microbatch)] if before else []

    def can_run(step, placed):
        inside = set()
        for a in step_actions(step):
            if any(n not in placed and n not in inside for n in local_needs(a)):
                return False
            inside.add(a)
        return True

    remaining, placed, out = list(order), set(), []
    while remaining:
        step = rnd.choice([x for x in remaining if can_run(x, placed)])
        remaining.remove(step)
        out.append(step)
        placed.update(step_actions(step))
    return out


@given(schedules_and_costs(), st.randoms(use_true_random=False))
def test_kernel_and_reference_agree_on_deadlocks(case, rnd):
    """Reorder one rank's steps at random (still valid): both simulators give the same
    timeline, or the same Deadlock naming the same stuck actions."""
    schedule, costs = case
    orders = [list(o) for o in schedule.orders]
    r = rnd.randrange(len(orders))
    orders[r] = reorder(orders[r], rnd)
    changed = replace(schedule, orders=tuple(tuple(o) for o in orders))
    outcomes = []
    for sim in (simulate, simulate_reference):
        try:
            outcomes.append(rows(sim(changed, costs)))
        except Deadlock as exc:
            outcomes.append(exc.stuck)
    assert outcomes[0] == outcomes[1]


def test_reordering_finds_deadlocks():
    """The test above does meet deadlocks (and timelines): it compares both outcomes."""
    import random

    kinds = set()
    for seed in range(30):
        rnd = random.Random(seed)
        s = get_schedule("1f1b", 3, 3)
        orders = [list(o) for o in s.orders]
        orders[1] = reorder(orders[1], rnd)
        try:
            simulate(replace(s, orders=tuple(tuple(o) for o in orders)))
            kinds.add("ran")
        except Deadlock:
            kinds.add("deadlock")
    assert kinds == {"ran", "deadlock"}


def mutate(schedule, rnd):
    """One random mistake in a valid schedule: drop, duplicate, move or rename an action."""
    orders = [list(o) for o in schedule.orders]
    r = rnd.choice([r for r, o in enumerate(orders) if o])
    i = rnd.randrange(len(orders[r]))
    step = orders[r][i]
    a = step.forward if isinstance(step, Overlap) else step
    how = rnd.choice(["drop", "duplicate", "move", "microbatch", "stage", "kind"])
    if how == "drop":
        del orders[r][i]
    elif how == "duplicate":
        orders[r].insert(rnd.randrange(len(orders[r]) + 1), a)
    elif how == "move":
        del orders[r][i]
        orders[rnd.randrange(len(orders))].append(step)
    elif how == "microbatch":
        orders[r][i] = Action(a.stage, a.kind, rnd.choice([-1, a.microbatch + 1, 99]))
    elif how == "stage":
        orders[r][i] = Action(rnd.choice([-1, a.stage + 1, 99]), a.kind, a.microbatch)
    else:
        orders[r][i] = Action(a.stage, rnd.choice("FIWBX"), a.microbatch)
    return replace(schedule, orders=tuple(tuple(o) for o in orders))


def message(fn, *args):
    try:
        fn(*args)
    except ScheduleError as exc:
        return str(exc)
    return None


@settings(max_examples=300)
@given(schedules_and_costs(), st.randoms(use_true_random=False))
def test_validation_folded_into_the_kernel_says_what_validate_says(case, rnd):
    """The vectorised checks reject exactly what the one-action-at-a-time scan rejects, and
    simulate() fails with validate()'s message."""
    schedule, _ = case
    bad = mutate(schedule, rnd)
    scan = message(_scan, bad)
    assert message(validate, bad) == scan
    if scan is not None:
        assert message(simulate, bad) == scan
    else:  # the mistake happened to be harmless (e.g. a move within the rank)
        assert message(simulate, bad) is None or "deadlock" in message(simulate, bad)


def test_two_chains_are_independent():
    # DualPipe-style: chain A = stages 0,1 on ranks 0,1; chain B = stages 2,3 on ranks 1,0.
    orders = [["0F0", "3F0", "3B0", "0B0"], ["2F0", "1F0", "1B0", "2B0"]]
    s = make_schedule("t", [[Action.from_str(a) for a in o] for o in orders], 4, 1,
                      placement="v", chain_starts=(0, 2))
    assert s.chains == 2 and s.first_stage(2) and s.last_stage(1) and not s.last_stage(2)
    t = simulate(s, CostModel(f=[1] * 4, b=[2] * 4))
    ev = {(e.stage, e.kind): (e.start, e.end) for e in t.events()}
    assert ev[2, "F"] == (0, 1)  # stage 2 starts chain B: no wait for stage 1
    assert ev[3, "F"] == (1, 2) and ev[3, "B"] == (2, 4)  # stage 3 ends chain B: its own loss
    assert ev[1, "B"] == (2, 4)  # stage 1 ends chain A: no gradient from stage 2
    assert ev[2, "B"] == (4, 6) and ev[0, "B"] == (4, 6)
    assert t.step_time == 6 and t.summary()["microbatches"] == 2
    with pytest.raises(ScheduleError, match="chain_starts must start at 0"):
        make_schedule("t", [[], []], 4, 1, chain_starts=(1, 2))
