"""``schedules/auto/bounds.py``: one provable lower bound, the best of three named kinds.

Each kind is the binding one on a case a person can check by hand, and no kind is ever
above the optimum: by brute force over every order of tiny instances (each stage running
its microbatches in order, the space the bounds speak of), and against an optimum the MIP
proved (stored here as data, not solved again)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.costs import fits_limit
from pipebubble.ir.schedule import Action, make_schedule, v_placement
from pipebubble.schedules.auto.bounds import bound
from pipebubble.sim import Deadlock
from pipebubble.sim.program import schedule_peaks


def test_busiest_rank_binds_when_there_are_many_microbatches():
    """Loop p=4, m=8, F = I = W = 1: the last rank starts at 3 and then works 3 x 8 units,
    27 = 3m + p - 1; ZB-H1 reaches it, so it is the optimum."""
    b = bound(CostModel().resolve(4), (0, 1, 2, 3), 8)
    assert (b.value, b.kind) == (27.0, "busiest rank")
    assert b.by_kind["fill and drain"] == 3 + 16 + 4  # last rank: head, F + I, then I0..2 + W0
    assert simulate(get_schedule("zb-h1", 4, 8), CostModel()).step_time == 27.0


def test_fill_and_drain_binds_with_one_microbatch():
    """m = 1: the one microbatch's path, 4 F + 4 I + W(0) = 9 (the busiest rank: 3 + 3)."""
    b = bound(CostModel().resolve(4), (0, 1, 2, 3), 1)
    assert (b.value, b.kind) == (9.0, "fill and drain")
    assert b.by_kind["busiest rank"] == 6.0
    assert simulate(get_schedule("zb-h1", 4, 1), CostModel()).step_time == 9.0


def test_memory_binds_when_one_microbatch_fits_at_a_time():
    """p=2, m=3, limit 1 (M_B = 1, I frees it): rank 0 starts a forward only once the last
    one's I is done, a round trip F0 F1 I1 I0 of 4; three of them and the last W: 13. The
    busiest rank says 10, the path 9. An order reaches 13."""
    b = bound(CostModel().resolve(2), (0, 1), 3, limits=[1, 1])
    assert (b.value, b.kind) == (13.0, "memory")
    assert b.by_kind == {"busiest rank": 10.0, "fill and drain": 9.0, "memory": 13.0}
    rank0 = [Action.from_str(a) for a in "0F0 0I0 0F1 0W0 0I1 0F2 0W1 0I2 0W2".split()]
    rank1 = [Action(1, k, j) for j in range(3) for k in "FIW"]
    s = make_schedule("one at a time", [rank0, rank1], 2, 3)
    assert simulate(s, CostModel()).step_time == 13.0
    assert bound(CostModel().resolve(2), (0, 1), 3, limits=[2, 2]).kind == "busiest rank"


def test_never_above_a_proven_optimum():
    """V, p=2, m=5, limit 1.5, comm 0.3 (tests/test_auto_optimal.py): the MIP proved 40.34."""
    costs = CostModel(f=[1.35, 1.7, 0.59, 0.68], b=[3.03, 3.4, 1.67, 1.76],
                      w=[1.19, 0.81, 0.69, 0.47], comm=0.3, weight_memory=0.5)
    b = bound(costs.resolve(4, 2), v_placement(2), 5, limits=[1.5, 1.5])
    assert all(x <= 40.34 for x in b.by_kind.values())


def test_memory_area_binds_when_the_w_holds_the_memory_too():
    """p=2, m=3, limit 1, M_W = 1 (the I frees nothing): rank 0 holds a microbatch from its
    F0 until its W0, F0 F1 I1 I0 W0 = 5, one at a time: 3 x 5 = 15 (the round trips alone
    say 13); the one-at-a-time order reaches it."""
    costs = CostModel(weight_memory=1.0)
    b = bound(costs.resolve(2), (0, 1), 3, limits=[1, 1])
    assert (b.value, b.kind) == (15.0, "memory")
    rank0 = [Action(0, k, j) for j in range(3) for k in "FIW"]
    rank1 = [Action(1, k, j) for j in range(3) for k in "FIW"]
    s = make_schedule("one at a time", [rank0, rank1], 2, 3)
    assert max(schedule_peaks(s, costs)) == 1.0
    assert simulate(s, costs).step_time == 15.0


def random_orders(rng, where: tuple[int, ...], m: int, sc, limits) -> list[list[Action]]:
    """Random rank orders that never deadlock: one action at a time, chosen at random among
    those whose inputs are done (F(s, j) after F(s - 1, j); I(s, j) after F(s, j) and
    I(s + 1, j); W(s, j) after I(s, j); each kind of a stage in microbatch order), put at
    the end of its rank's order; mostly a backward when one is ready and a forward only
    where its rank's memory has room (so that many fit, and some come near the best)."""
    S = len(where)
    done = {(s, k): 0 for s in range(S) for k in "FIW"}
    orders: list[list[Action]] = [[] for _ in range(max(where) + 1)]
    held = [0.0] * len(orders)

    def ready(s: int, k: str) -> bool:
        j = done[(s, k)]
        if j >= m:
            return False
        if k == "F":
            return (s == 0 or done[(s - 1, "F")] > j) and fits_limit(
                held[where[s]] + sum(sc.memory_deltas(s, "F")), limits[where[s]])
        if k == "I":
            return done[(s, "F")] > j and (s == S - 1 or done[(s + 1, "I")] > j)
        return done[(s, "I")] > j

    for _ in range(3 * S * m):
        can = [(s, k) for s in range(S) for k in "FIW" if ready(s, k)]
        back = [x for x in can if x[1] != "F"]
        if back and rng.random() < 0.7:
            can = back
        if not can:  # every forward left is over its limit: this order will not fit
            can = [(s, "F") for s in range(S) if done[(s, "F")] < m
                   and (s == 0 or done[(s - 1, "F")] > done[(s, "F")])]
        s, k = rng.choice(can)
        orders[where[s]].append(Action(s, k, done[(s, k)]))
        held[where[s]] += sum(sc.memory_deltas(s, k))
        done[(s, k)] += 1
    return orders


@pytest.mark.parametrize("placement", ["v", "loop"])
def test_no_order_that_fits_beats_the_memory_bound(placement):
    """V (each rank's second stage nested in its first) and interleaved loop placements,
    p=2, m=3, random costs and limits: every random order that fits its limits and does
    not deadlock takes at least every kind of the bound (a lower bound holds for every
    order, not only the optimum)."""
    import random

    rng = random.Random(7)
    where = v_placement(2) if placement == "v" else (0, 1, 0, 1)
    ran = binds = 0
    for _ in range(60):
        w = [rng.uniform(0.1, 1) for _ in range(4)]
        costs = CostModel(f=[rng.uniform(0.3, 2) for _ in range(4)],
                          b=[x + rng.uniform(0.3, 3) for x in w], w=w,
                          comm=rng.choice([0.0, 0.3]),
                          activation_memory=[rng.uniform(0.5, 1.5) for _ in range(4)],
                          weight_memory=rng.choice([0.0, 0.2]))
        sc = costs.resolve(4, 2)
        need = sum(sc.activation_memory)
        limits = [rng.uniform(0.6, 2.0) * need] * 2
        b = bound(sc, where, 3, limits=limits)
        binds += b.kind == "memory"
        for _ in range(40):
            orders = random_orders(rng, where, 3, sc, limits)
            sched = make_schedule("random", orders, 4, 3, placement=placement)
            if not all(fits_limit(x, cap) for x, cap in zip(schedule_peaks(sched, sc), limits,
                                                            strict=True)):
                continue
            try:
                step = simulate(sched, sc).step_time
            except Deadlock:
                continue
            ran += 1
            for kind, value in b.by_kind.items():
                assert value <= step + 1e-9, (kind, value, step, placement)
    assert ran > 100 and binds > 5  # enough orders fit, and the memory kind binds often


def rank_orders(stage: int, m: int):
    """Every order of one stage's F, I, W that runs each kind in microbatch order and each
    microbatch's F before its I before its W."""
    def grow(nf, ni, nw, out):
        if nw == m:
            yield list(out)
            return
        for kind, ok in (("F", nf < m), ("I", ni < nf), ("W", nw < ni)):
            if ok:
                j = {"F": nf, "I": ni, "W": nw}[kind]
                out.append(Action(stage, kind, j))
                yield from grow(nf + (kind == "F"), ni + (kind == "I"), nw + (kind == "W"),
                                out)
                out.pop()
    yield from grow(0, 0, 0, [])


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(f=st.lists(st.floats(0.2, 2), min_size=2, max_size=2),
       i=st.lists(st.floats(0.2, 2), min_size=2, max_size=2),
       w=st.lists(st.floats(0.1, 2), min_size=2, max_size=2),
       comm=st.sampled_from([0.0, 0.4]), mem_w=st.sampled_from([0.0, 0.5]),
       limit=st.sampled_from([None, 1.0, 1.5, 2.0]))
def test_no_kind_is_above_the_brute_force_optimum(f, i, w, comm, mem_w, limit):
    """Loop p=2, m=3: every pair of rank orders (42 x 42), the best that fits the limit;
    every kind of the bound is at or below it."""
    costs = CostModel(f=f, b=[x + y for x, y in zip(i, w, strict=True)], w=w, comm=comm,
                      weight_memory=mem_w)
    limits = None if limit is None else [limit, limit]
    best = float("inf")
    for o0, o1 in itertools.product(list(rank_orders(0, 3)), list(rank_orders(1, 3))):
        s = make_schedule("brute", [o0, o1], 2, 3)
        if limits and not all(fits_limit(x, limit) for x in schedule_peaks(s, costs)):
            continue
        try:
            best = min(best, simulate(s, costs).step_time)
        except Deadlock:
            continue
    b = bound(costs.resolve(2), (0, 1), 3, limits=limits)
    assert best < float("inf")
    for kind, value in b.by_kind.items():
        assert value <= best + 1e-9, (kind, value, best)
    assert b.value == max(b.by_kind.values())


@pytest.mark.parametrize("limit", [None, 3])
def test_auto_prints_one_bound_and_its_gap(limit, capsys):
    """``simulate --json`` for auto: the top-level lower_bound is auto's (named), the gap
    beside it, and no second number."""
    import json

    from pipebubble.cli import main

    args = ["simulate", "--schedule", "auto", "-p", "3", "-m", "6", "--json"]
    main(args + (["--memory-limit", str(limit)] if limit else []))
    out = json.loads(capsys.readouterr().out)
    assert out["lower_bound"] == out["auto"]["lower_bound"]
    assert out["lower_bound_kind"] == out["auto"]["lower_bound_kind"]
    assert out["auto"]["gap"] == pytest.approx(out["step_time"] / out["lower_bound"] - 1)
    assert out["auto"]["gap"] >= 0
    assert [s["name"] for s in out["auto"]["stages"]][:2] == ["registered schedules", "greedy"]


def _scan_trip(src, dst, dur, succ, order):
    """One round trip by the plain longest-path scan from ``src``: the oracle for the
    one-pass, all-sources trips."""
    at = {src: 0.0}
    for a in order[order.index(src):]:
        if a == dst:
            break
        if a in at:
            for b, lag in succ[a]:
                at[b] = max(at.get(b, -1.0), at[a] + dur[a] + lag)
    return at[dst] + dur[dst]


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 5), v=st.booleans(), data=st.data())
def test_every_round_trip_in_one_pass_is_the_longest_path(p, v, data):
    """The memory kind's round trips (F of a stage to its I, every stage at once) are the
    longest paths a scan from each F finds, to the float, on loop and V placements with
    uneven times and a hop cost."""
    from pipebubble.schedules.auto.bounds import _paths, _trips

    where = v_placement(p) if v else tuple(range(p))
    S = len(where)
    t = st.floats(0.01, 5, allow_nan=False)
    b = data.draw(st.lists(t, min_size=S, max_size=S))
    share = data.draw(st.lists(st.floats(0, 1), min_size=S, max_size=S))  # W's part of B
    costs = CostModel(f=data.draw(st.lists(t, min_size=S, max_size=S)), b=b,
                      w=[x * y for x, y in zip(b, share, strict=True)],
                      comm=data.draw(st.floats(0, 2))).resolve(S)
    dur, succ, order, _, _ = _paths(costs, where)
    got = _trips(S, dur, succ, order)
    for s in range(S):
        assert got[s] == _scan_trip(Action(s, "F", 0), Action(s, "I", 0), dur, succ, order)


@pytest.mark.parametrize("name,p,m,v", [("v-min", 4, 12, 2), ("v-half", 4, 12, 2),
                                        ("zbv", 4, 8, 2), ("zb-h1", 4, 8, 1),
                                        ("zb-h2", 3, 9, 1), ("v-min", 6, 18, 2)])
def test_an_orders_own_round_trips_bound_its_step(name, p, m, v):
    """The bound with ``held`` (the order's microbatches held per stage until their I:
    what the planner's order floor reads, plan/cut_score.py) is at or below the order's
    simulated step, under random costs; the planner takes it only from orders it can
    speak of (split, one chain, in microbatch order), never from 1F1B's fused B."""
    import random

    from pipebubble.plan.dims import ParallelDims
    from pipebubble.plan.plans import Config
    from pipebubble.plan.schedule_facts import ScheduleFacts

    rng = random.Random(3)
    facts = ScheduleFacts()
    sched = facts.schedule(Config(ParallelDims(pp=p), 1, m, name, v, "none", 0.0))
    held = facts.trip_counts(sched)
    assert held is not None and len(held) == sched.num_stages
    assert facts.trip_counts(facts.schedule(Config(ParallelDims(pp=p), 1, m, "1f1b", 1,
                                                   "none", 0.0))) is None
    S = sched.num_stages
    for _ in range(20):
        w = [rng.uniform(0.1, 1) for _ in range(S)]
        costs = CostModel(f=[rng.uniform(0.3, 2) for _ in range(S)],
                          b=[x + rng.uniform(0.3, 3) for x in w], w=w,
                          comm=rng.choice([0.0, 0.2]))
        sc = costs.resolve(S, v)
        b = bound(sc, tuple(sched.stage_to_rank), m, held=held)
        assert b.value <= simulate(sched, sc).step_time + 1e-9
