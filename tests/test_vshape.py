"""V-Half and V-Min: memory and step time of the building-block construction, by simulation,
against the closed forms of ``sim/formulas.py``; export to torch and exact gradients."""

import json

import pytest

from pipebubble import CostModel, get_schedule, simulate, validate
from pipebubble.cli import main
from pipebubble.interop.torch_csv import parse_torch_csv, to_torch_csv
from pipebubble.schedules import closed_form_bubble
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
        closed = closed_form_bubble(name, p, m, 2, UNIT.resolve(2 * p, 2))
        assert closed == pytest.approx(t.bubble_fraction)


def test_published_memory_formulas_by_hand():
    assert [v_min_memory(p) for p in (2, 3, 4, 5, 8)] == [2, 2, 2, 3, 4]
    assert [v_half_memory(p) for p in (2, 3, 4, 5, 8)] == [2, 2, 3, 3, 5]
    # ZB-V holds p rank-shares with the same costs: V-Half about half, V-Min about a third
    t = simulate(get_schedule("zbv", 8, 24), UNIT)
    assert max(r.peak_memory for r in t.rank_stats()) == 8


@pytest.mark.parametrize("p", [4, 7, 10, 13])
def test_v_min_reaches_the_bound_when_p_mod_3_is_1(p):
    m = 2 * p
    t = simulate(get_schedule("v-min", p, m), UNIT)
    assert t.step_time == 6 * m + 6 * p - 1 - 3 * 2 * v_min_memory(p)


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
