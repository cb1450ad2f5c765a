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
