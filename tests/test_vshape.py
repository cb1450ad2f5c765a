"""V-Half and V-Min: memory and step time of the building-block construction, by simulation,
against the closed forms of ``sim/formulas.py``; export to torch and exact gradients."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, simulate, validate
from pipebubble.cli import main
from pipebubble.interop.torch_csv import parse_torch_csv, to_torch_csv
from pipebubble.ir.schedule import ScheduleError, make_schedule
from pipebubble.schedules import closed_form_bubble
from pipebubble.schedules.building_block import block, peak, reorder, repeat, unit_step
from pipebubble.sim.formulas import (
    v_half_excess,
    v_half_memory,
    v_min_excess,
    v_min_memory,
    v_shape_bound,
)

# One chunk pass = one unit: a rank-share is two chunks, so F = I = W = 2 per rank-share.
UNIT = CostModel(f=2, b=4, w=2, activation_memory=1, weight_memory=1)
FAMILIES = [("v-min", v_min_memory, v_min_excess), ("v-half", v_half_memory, v_half_excess)]


@pytest.mark.parametrize("name,memory,excess", FAMILIES)
@pytest.mark.parametrize("p", range(2, 11))
def test_peak_memory_and_step_time_over_a_grid(name, memory, excess, p):
    for m in (2 * p, 3 * p + 1):
        s = get_schedule(name, p, m)
        validate(s)
        assert s.placement == "v" and s.chunks == 2
        t = simulate(s, UNIT)
        peaks = [r.peak_memory for r in t.rank_stats()]
        assert max(peaks) == memory(p)  # floor((p+4)/3) or floor((p+2)/2) rank-shares
        k = 2 * memory(p)  # chunk activations
        assert t.step_time == v_shape_bound(p, m, k) + excess(p)
        assert excess(p) <= {"v-min": 4 if p % 3 == 2 else 1, "v-half": 1 if p > 2 else 2}[name]
        closed = closed_form_bubble(name, p, m, 2, UNIT.resolve(2 * p, 2))
        assert closed == pytest.approx(t.bubble_fraction)


def test_published_memory_formulas_by_hand():
    assert [v_min_memory(p) for p in (2, 3, 4, 5, 8)] == [2, 2, 2, 3, 4]
    assert [v_half_memory(p) for p in (2, 3, 4, 5, 8)] == [2, 2, 3, 3, 5]
    # ZB-V holds p rank-shares with the same costs: V-Half about half, V-Min about a third
    t = simulate(get_schedule("zbv", 8, 24), UNIT)
    assert max(r.peak_memory for r in t.rank_stats()) == 8


# Where the step time is the bound 6m + 6p - 1 - 3k exactly (k: peak chunk activations).
AT_THE_BOUND = [("v-half", p) for p in (3, 5, 7, 9, 11, 13, 15)] + [
    ("v-min", p) for p in (3, 4, 7, 10, 13, 16)]


@pytest.mark.parametrize("name,p", AT_THE_BOUND)
def test_reaches_the_bound(name, p):
    memory = v_half_memory if name == "v-half" else v_min_memory
    for m in (2 * p, 2 * p + 3):
        t = simulate(get_schedule(name, p, m), UNIT)
        k = 2 * max(r.peak_memory for r in t.rank_stats())
        assert k == 2 * memory(p)
        assert t.step_time == 6 * m + 6 * p - 1 - 3 * k


def test_v_half_p2_is_optimal_though_above_the_bound():
    # p = 2: the bound 6m - 1 is below 6m + 1, which every order needs (rank 1 starts at 1
    # at the earliest and runs 6m unit passes); V-Half reaches 6m + 1.
    for m in (4, 7):
        assert simulate(get_schedule("v-half", 2, m), UNIT).step_time == 6 * m + 1


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("mem_w", [0, 0.5])
def test_reordering_never_raises_the_peak_for_any_mem_w(name, mem_w):
    # The reordered schedule holds no more than the plain repeated block on any rank, for
    # W keeping all, half or none of the activation (M_W = M_B, M_B/2, 0).
    from pipebubble.schedules.v_half import v_half_offsets
    from pipebubble.schedules.v_min import v_min_offsets

    offsets = v_half_offsets if name == "v-half" else v_min_offsets
    costs = CostModel(f=2, b=4, w=2, activation_memory=1, weight_memory=mem_w)
    for p in range(2, 9):
        m = 2 * p + 1
        plain = make_schedule("block", repeat(p, m, block(p, offsets(p))), 2 * p, m,
                              placement="v")
        ours = simulate(get_schedule(name, p, m), costs)
        old = simulate(plain, costs)
        assert max(r.peak_memory for r in ours.rank_stats()) <= max(
            r.peak_memory for r in old.rank_stats())
        assert ours.step_time <= old.step_time


OFFSETS = st.tuples(*[st.integers(1, 3)] * 4, st.integers(1, 6), st.integers(1, 6),
                    st.integers(1, 2))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 6), m=st.integers(1, 14), offsets=OFFSETS, slack=st.integers(0, 2))
def test_reorder_keeps_the_passes_the_cap_and_the_unit_step(p, m, offsets, slack):
    try:
        rows = repeat(p, m, block(p, offsets))
    except ScheduleError:
        return  # this block collides for this p
    cap = max(2, peak(p, rows) - slack)  # at or below the block's own peak
    got = reorder(p, m, rows, cap)
    base = make_schedule("block", rows, 2 * p, m, placement="v")
    assert unit_step(p, m, rows) == simulate(base, UNIT).step_time
    if got is None:
        return  # the rules stalled: the generators keep the block then
    step, orders = got
    assert [sorted(o) for o in orders] == [sorted(o) for o in rows]
    assert peak(p, orders) <= cap
    s = make_schedule("reordered", orders, 2 * p, m, placement="v")
    validate(s)
    t = simulate(s, UNIT)
    assert step == unit_step(p, m, orders) == t.step_time
    assert max(r.peak_memory for r in t.rank_stats()) <= cap / 2


def test_memory_holds_for_every_m_and_no_closed_form_off_its_conditions():
    for p in range(1, 7):
        for m in range(1, 2 * p + 2):
            for name, memory, _ in FAMILIES:
                t = simulate(get_schedule(name, p, m), UNIT)
                assert max(r.peak_memory for r in t.rank_stats()) <= memory(p)
    skewed = CostModel(f=2, b=5, w=2).resolve(8, 2)
    assert closed_form_bubble("v-half", 4, 8, 2, skewed) is None
    comm = CostModel(comm=0.1).resolve(8, 2)
    assert closed_form_bubble("v-min", 4, 8, 2, comm) is None


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_torch_csv_round_trip(name):
    s = get_schedule(name, 3, 6)
    back = parse_torch_csv(to_torch_csv(s))
    assert back.orders == s.orders and back.stage_to_rank == s.stage_to_rank


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_runs_locally_with_exact_gradients(name, capsys):
    assert main(["run", "--local", "--schedule", name, "-p", "2", "-m", "4", "--check",
                 "--width", "16", "--warmup", "0", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5
