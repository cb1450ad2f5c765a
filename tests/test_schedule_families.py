"""Every registered schedule: valid over a grid, and equal to its published closed forms.

Costs are in rank-shares (a scalar F is the forward of one rank's share of the model; with
v chunks per rank one chunk takes F/v). Each closed form holds only under conditions (enough
microbatches, some order between F, I and W); every test says which, and the conditions
were found by brute force over p <= 6, m <= 4p, F, I, W in {0.5, 1, 1.5, 2, 3}
(``test_*_conditions_are_exact`` repeat that search on a smaller grid).
"""

import itertools

import pytest

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import ScheduleError, validate
from pipebubble.schedules import closed_form_bubble, get_schedule, lookup, schedule_names
from pipebubble.sim.formulas import (
    dualpipe_bubble_time,
    interleaved_bubble_fraction,
    zb_h1_bubble_time,
    zb_h2_bubble_time,
)
from pipebubble.sim.kernel import simulate

ALL = schedule_names(searched=False)


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def accepted(name, p, m, v=None):
    try:
        return get_schedule(name, p, m, v)
    except ScheduleError:
        return None


# ---- every schedule is valid ----------------------------------------------------------

def test_the_registry_holds_every_family():
    assert set(ALL) >= {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2",
                        "zbv", "dualpipev", "dualpipe"}


@pytest.mark.parametrize("name", ALL)
def test_every_generated_schedule_validates_and_simulates(name):
    spec = lookup(name)
    chunk_options = [None] if spec.fixed_chunks else [2, 3, 4]
    made = 0
    for p, m, v in itertools.product(range(1, 7), range(1, 14), chunk_options):
        s = accepted(name, p, m, v)
        if s is None:
            continue
        made += 1
        validate(s)
        assert s.num_ranks == p and s.total_microbatches == m  # M over all chains
        assert s.num_stages == p * (v or spec.chunks) * s.chains  # chunks: per rank per chain
        t = simulate(s, CostModel(f=1, b=2, w=1))  # raises Deadlock if it cannot progress
        # every rank runs each of the m microbatches through its share of the model once
        # forward (F = 1) and once backward (I + W = B = 2), whatever the chunks or chains
        assert [st.busy for st in t.rank_stats()] == approx([3 * m] * p), (p, m, v)
    assert made >= (9 if name == "dualpipe" else 40)  # dualpipe: p even, M even >= 2p


@pytest.mark.parametrize(
    "name, p, m, v, message",
    [
        ("interleaved-1f1b", 4, 8, 1, "chunks >= 2"),
        ("interleaved-1f1b", 4, 9, 2, "m=9 is not a multiple of 2; valid m near it: 8 or 10"),
        ("looped-bfs", 4, 8, 1, "chunks >= 2"),
        ("zbv", 4, 8, 3, "exactly 2 chunk"),
        ("dualpipev", 4, 7, None, "dualpipev needs microbatches >= 2 x ranks = 8, got 7"),
        ("zb-h1", 4, 8, 2, "exactly 1 chunk"),
    ],
)
def test_constraints_are_checked_up_front(name, p, m, v, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(")):
        get_schedule(name, p, m, v)


# ---- interleaved 1F1B and looped BFS ----------------------------------------------------

def test_interleaved_hand_example():
    # p=2, v=2, m=2: rank 0 holds stages 0 and 2; one group of 2 microbatches.
    s = get_schedule("interleaved-1f1b", 2, 2, 2)
    assert s.to_text().splitlines()[0] == "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1"
    assert s.stage_to_rank == (0, 1, 0, 1) and s.placement == "loop"


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs"])
def test_interleaved_bubble_is_divided_by_v(name):
    # Narayanan et al. 2021: bubble (p-1)(F+B)/v, step m(F+B) + (p-1)(F+B)/v, for m >= p.
    for p, v in itertools.product(range(1, 6), range(2, 5)):
        for m in range(p, 3 * p + 1):
            s = accepted(name, p, m, v)
            if s is None:
                continue
            for f, b in [(1, 2), (1, 1), (2, 1)]:
                t = simulate(s, CostModel(f=f, b=b))
                assert t.step_time == approx(m * (f + b) + (p - 1) * (f + b) / v), (p, m, v)
                assert t.bubble_fraction == approx(interleaved_bubble_fraction(p, m, v))


def test_interleaved_numbers_by_hand():
    # p=4, m=8, v=2, F=1, B=2: step 8*3 + 3*3/2 = 28.5; bubble 3/(16+3) = 15.79 %.
    t = simulate(get_schedule("interleaved-1f1b", 4, 8, 2), CostModel(f=1, b=2))
    assert t.step_time == 28.5
    assert t.bubble_fraction == approx(3 / 19)


def test_interleaved_m_not_divisible_by_p_uses_flexible_rounds():
    # PyTorch's rule: rounds = max(1, m // p) equal groups. p=4, m=10: 2 groups of 5.
    s = get_schedule("interleaved-1f1b", 4, 10, 2)
    assert s.options["group_size"] == 5
    first_chunk1 = s.orders[0].index(next(a for a in s.orders[0] if a.stage == 4))
    assert first_chunk1 == 5  # five microbatches through chunk 0 before chunk 1 starts
    # The bubble formula still holds (m >= p) ...
    t = simulate(s, CostModel(f=1, b=2))
    assert t.step_time == approx(10 * 3 + 3 * 3 / 2)
    # ... m < p runs one group of m, but the pipeline never fills: more than the formula.
    short = simulate(get_schedule("interleaved-1f1b", 4, 3, 2), CostModel(f=1, b=2))
    assert short.step_time > 3 * 3 + 3 * 3 / 2
    # m=9 with p=4: 2 rounds do not divide 9 microbatches.
    with pytest.raises(ScheduleError, match="valid m near it: 8 or 10"):
        get_schedule("interleaved-1f1b", 4, 9, 2)


def test_interleaved_closed_form_needs_m_at_least_p():
    sc = CostModel().resolve(8, 2)
    assert closed_form_bubble("interleaved-1f1b", 4, 8, 2, sc) == approx(3 / 19)
    assert closed_form_bubble("interleaved-1f1b", 4, 3, 2, sc) is None


def test_interleaved_peak_memory():
    # Rank 0 holds (v-1)g + 2(p-1) + 1 chunk activations (g = group size = p when m is a
    # multiple of p), i.e. p(1 + (p-1)/(pv)) rank-shares (Korthikanti et al. 2022).
    for p, v in itertools.product(range(2, 6), range(2, 5)):
        m = 2 * p
        st = simulate(get_schedule("interleaved-1f1b", p, m, v)).rank_stats()[0]
        assert st.peak_activations == (v + 1) * p - 1
        assert st.peak_memory == approx(p * (1 + (p - 1) / (p * v)))


def test_looped_bfs_holds_all_microbatches_like_gpipe():
    for p, m, v in [(2, 4, 2), (4, 8, 2), (3, 7, 3)]:
        st = simulate(get_schedule("looped-bfs", p, m, v)).rank_stats()[0]
        assert st.peak_activations == v * m and st.peak_memory == approx(m)


# ---- ZB-H1 and ZB-H2 --------------------------------------------------------------------

def test_zb_h1_hand_example():
    assert get_schedule("zb-h1", 2, 2).to_text() == (
        "0F0 0F1 0I0 0W0 0I1 0W1\n1F0 1I0 1F1 1I1 1W0 1W1"
    )


def test_zb_h2_warms_up_with_2_p_minus_r_minus_1_forwards():
    s = get_schedule("zb-h2", 4, 12)
    for r, order in enumerate(s.orders):
        first_i = next(i for i, a in enumerate(order) if a.kind == "I")
        assert first_i == 2 * (4 - r - 1) + 1  # warm-up forwards, one more F, then I


COSTS = [(f, i, w) for f, i, w in itertools.product([0.5, 1, 2], repeat=3)]


def test_zb_h1_bubble():
    # Qi et al. 2024: step m(F+B) + (p-1)(F+I-W) for m >= p when W <= F and W <= I.
    for p in range(1, 7):
        for m in (p, p + 1, 2 * p, 3 * p + 1):
            s = get_schedule("zb-h1", p, m)
            for f, i, w in COSTS:
                if w > f or w > i:
                    continue
                t = simulate(s, CostModel(f=f, b=i + w, w=w))
                assert t.step_time == approx(m * (f + i + w) + zb_h1_bubble_time(p, f, i, w))
                for st in t.rank_stats():
                    assert st.idle == approx(zb_h1_bubble_time(p, f, i, w))


def test_zb_h1_numbers_by_hand():
    # p=4, m=8, F=I=W=1: step 8*3 + 3*1 = 27, a third of 1F1B's bubble (33 - 24 = 9).
    t = simulate(get_schedule("zb-h1", 4, 8), CostModel(f=1, b=2, w=1))
    assert t.step_time == 27
    assert [s.peak_activations for s in t.rank_stats()] == [4, 3, 2, 1]


def test_zb_h2_bubble_within_the_span():
    # Qi et al. 2024: (p-1)(F+I-2W) idle within rank 0's span (first F to last W; the
    # paper drops the optimizer barrier), when m >= 2p-1, W <= F and 2W <= F+I. Later ranks
    # idle less: rank r idles (p-1-r)(F+I-2W).
    for p in range(1, 7):
        for m in (2 * p - 1, 2 * p, 3 * p + 1):
            s = get_schedule("zb-h2", p, m)
            for f, i, w in COSTS:
                if w > f or 2 * w > f + i:
                    continue
                t = simulate(s, CostModel(f=f, b=i + w, w=w))
                for st in t.rank_stats():
                    assert st.busy == approx(m * (f + i + w))
                    assert st.span - st.busy == approx((p - 1 - st.rank) * (f + i - 2 * w))
                assert t.rank_stats()[0].span - t.rank_stats()[0].busy == approx(
                    zb_h2_bubble_time(p, f, i, w))
                # With the barrier (our step time, 0 to the last action anywhere):
                assert t.step_time == approx(m * (f + i + w) + (p - 1) * max(f, f + i - 2 * w))


def test_zb_h2_with_f_i_w_equal_has_no_bubble_in_its_span_and_zb_h1_step_time():
    # DESIGN.md: with the barrier ZB-H2's step time equals ZB-H1's (here F = I = W).
    h1 = simulate(get_schedule("zb-h1", 4, 8), CostModel(f=1, b=2, w=1))
    h2 = simulate(get_schedule("zb-h2", 4, 8), CostModel(f=1, b=2, w=1))
    assert h2.step_time == h1.step_time == 27
    assert all(s.span == s.busy == 24 for s in h2.rank_stats())


def test_zb_h1_conditions_are_exact():
    # Outside W <= F, W <= I, m >= p the formula fails somewhere (so the closed form says
    # None there, rather than a wrong number).
    vals = [0.5, 1, 2]
    for p, m in [(3, 2), (3, 3), (4, 6)]:
        for f, i, w in itertools.product(vals, repeat=3):
            t = simulate(get_schedule("zb-h1", p, m), CostModel(f=f, b=i + w, w=w))
            holds = t.step_time == approx(m * (f + i + w) + zb_h1_bubble_time(p, f, i, w))
            assert holds == (m >= p and w <= f and w <= i), (p, m, f, i, w)
            sc = CostModel(f=f, b=i + w, w=w).resolve(p, 1)
            assert (closed_form_bubble("zb-h1", p, m, 1, sc) is not None) == holds


def test_zb_h2_closed_form_is_over_the_span():
    assert lookup("zb-h2").closed_form_basis == "span"
    sc = CostModel(f=1, b=3, w=1).resolve(4, 1)  # I = 2: (p-1)(F+I-2W) = 3
    t = simulate(get_schedule("zb-h2", 4, 8), CostModel(f=1, b=3, w=1))
    r0 = t.rank_stats()[0]
    assert closed_form_bubble("zb-h2", 4, 8, 1, sc) == approx((r0.span - r0.busy) / r0.span)
    assert closed_form_bubble("zb-h2", 4, 6, 1, sc) is None  # m < 2p - 1


def test_zero_bubble_peak_activations():
    # Rank 0 holds p microbatches in ZB-H1 (as 1F1B) and 2p - 1 in ZB-H2 (M_W = 0).
    for p in range(1, 7):
        h1 = simulate(get_schedule("zb-h1", p, 3 * p)).rank_stats()[0]
        h2 = simulate(get_schedule("zb-h2", p, 3 * p)).rank_stats()[0]
        assert h1.peak_activations == p and h1.peak_memory == p
        assert h2.peak_activations == 2 * p - 1 and h2.peak_memory == 2 * p - 1


# ---- ZB-V ---------------------------------------------------------------------------------

def test_zbv_v_placement_and_zero_bubble_in_span():
    # Qi et al. 2024, section 6: with F = I = W and m >= 2p - 1 no rank idles within its
    # span; rank 0 holds 2p chunk activations = p rank-shares, like 1F1B.
    for p in range(1, 7):
        for m in (2 * p - 1, 2 * p, 3 * p + 2):
            s = get_schedule("zbv", p, m)
            assert s.placement == "v" and s.stage_to_rank[2 * p - 1] == 0
            for f in (1, 2):
                t = simulate(s, CostModel(f=f, b=2 * f, w=f))
                for st in t.rank_stats():
                    assert st.span == approx(st.busy) == approx(m * 3 * f)
                r0 = t.rank_stats()[0]
                assert r0.peak_activations == 2 * p and r0.peak_memory == approx(p)
    sc = CostModel(f=1, b=2, w=1).resolve(8, 2)
    assert closed_form_bubble("zbv", 4, 7, 2, sc) == 0.0
    assert closed_form_bubble("zbv", 4, 6, 2, sc) is None  # m < 2p - 1
    assert closed_form_bubble("zbv", 4, 8, 2, CostModel(f=1, b=3, w=1).resolve(8, 2)) is None


def test_zbv_numbers_by_hand():
    # p=4, m=8: each rank is busy 8 x 3 = 24 without a gap; rank r starts r chunk-forwards
    # (0.5 each) late, so the step is 24 + 3 x 0.5 = 25.5.
    t = simulate(get_schedule("zbv", 4, 8), CostModel(f=1, b=2, w=1))
    assert t.step_time == 25.5


# ---- DualPipeV ----------------------------------------------------------------------------

def test_dualpipev_bubble():
    # DualPipe README: (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages and chunk times (F/2,
    # B/2, W/2 here), F&B = overlap x (F + B). Holds on the idlest rank when F = I, W <= I and
    # m >= 2p; with overlap = 1 every rank idles exactly that. (With F != I the simulated
    # bubble differs from the formula; the README gives it without conditions.)
    for p in range(1, 6):
        for m in (2 * p, 2 * p + 1, 3 * p + 2):
            s = get_schedule("dualpipev", p, m)
            for f, w, ov in itertools.product([1, 2], [0.5, 1], [1.0, 0.75]):
                if w > f:
                    continue
                costs = CostModel(f=f, b=f + w, w=w, overlap=ov)  # I = B - W = F
                t = simulate(s, costs)
                fc, bc, wc = f / 2, (f + w) / 2, w / 2
                idle = dualpipe_bubble_time(p, ov * (fc + bc), bc, wc)
                assert max(st.idle for st in t.rank_stats()) == approx(idle), (p, m, f, w, ov)
                if ov == 1.0:
                    assert all(st.idle == approx(idle) for st in t.rank_stats())
                    sc = costs.resolve(2 * p, 2)
                    assert closed_form_bubble("dualpipev", p, m, 2, sc) == approx(
                        t.bubble_fraction)


def test_dualpipev_numbers_by_hand_and_memory():
    # p=4, m=8, F=1, B=2, W=1 (chunks 0.5, 1, 0.5): idle (4-1)(1.5 + 1 - 1.5) = 3 per rank,
    # step 8 x 3 + 3 = 27. Rank 0 holds PP + 1 = 2p + 1 = 9 chunk activations (4.5
    # rank-shares): the README's "PP+1" counts chunks of one stage each.
    t = simulate(get_schedule("dualpipev", 4, 8), CostModel(f=1, b=2, w=1))
    assert t.step_time == 27
    r0 = t.rank_stats()[0]
    assert r0.peak_activations == 9 and r0.peak_memory == 4.5
    for p in range(1, 6):
        r0 = simulate(get_schedule("dualpipev", p, 3 * p)).rank_stats()[0]
        assert r0.peak_activations == 2 * p + 1


def test_dualpipev_overlap_cost_is_used():
    s = get_schedule("dualpipev", 4, 8)
    assert any(type(step).__name__ == "Overlap" for step in s.orders[0])
    full = simulate(s, CostModel(overlap=1.0)).step_time
    faster = simulate(s, CostModel(overlap=0.5)).step_time
    assert faster < full


# ---- the closed forms say None outside their conditions ------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_no_closed_form_with_communication_or_uneven_stages(name):
    s = get_schedule(name, 4, 8)
    S, v = s.num_stages, s.chunks
    assert closed_form_bubble(name, 4, 8, v, CostModel(comm=0.1).resolve(S, v)) is None
    uneven = CostModel(f=[1.0] * (S - 1) + [2.0]).resolve(S, v)
    assert closed_form_bubble(name, 4, 8, v, uneven) is None


@pytest.mark.parametrize("name", ALL)
def test_closed_form_matches_the_simulation_at_p4_m8(name):
    # The figures of `pipebubble compare -p 4 -m 8`: each closed form equals the simulated
    # fraction it is published over (the step, or the idlest rank's span).
    s = get_schedule(name, 4, 8)
    costs = CostModel(f=1, b=2, w=1)
    t = simulate(s, costs)
    closed = closed_form_bubble(name, 4, 8, s.chunks, costs.resolve(s.num_stages, s.chunks))
    assert closed is not None
    if lookup(name).closed_form_basis == "span":
        worst = max((st.span - st.busy) / st.span for st in t.rank_stats())
        assert closed == approx(worst)
    else:
        assert closed == approx(t.bubble_fraction)


# ---- the CLI shows every schedule ---------------------------------------------------------

def test_compare_lists_every_schedule_with_its_closed_form(capsys):
    from pipebubble.cli import main

    assert main(["compare", "-p", "4", "-m", "8", "--json"]) == 0
    rows = {r["schedule"]: r for r in __import__("json").loads(capsys.readouterr().out)}
    auto = rows.pop("auto")  # compare's extra row: the automatic scheduler, no closed form
    assert auto["step_time"] <= rows["zbv"]["step_time"]
    assert set(rows) == set(ALL)
    for name, row in rows.items():
        assert row["closed_form_bubble"] is not None, name
        basis = lookup(name).closed_form_basis
        assert row["closed_form_basis"] == basis
        simulated = row["span_bubble_fraction" if basis == "span" else "bubble_fraction"]
        assert row["closed_form_bubble"] == approx(simulated), name
    assert rows["zb-h2"]["per_rank"][0]["peak_memory"] == 7  # 2p - 1
    assert main(["compare", "-p", "4", "-m", "8"]) == 0
    table = capsys.readouterr().out
    for name in ALL:
        assert f" {name} " in table


def test_simulate_draws_zbv(capsys):
    from pipebubble.cli import main

    assert main(["simulate", "--schedule", "zbv", "--ranks", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "rank 3" in out and "step time 25.5" in out and "(closed form 0.00%)" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--schedule", "dualpipev", "-p", "4", "-m", "6"], "microbatches >= 2 x ranks = 8"),
        (["--schedule", "interleaved-1f1b", "-p", "4", "-m", "9"], "valid m near it: 8 or 10"),
        (["--schedule", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "1"], "chunks >= 2"),
        (["--schedule", "zbv", "-p", "4", "-m", "8", "-v", "3"], "exactly 2 chunk(s)"),
    ],
)
def test_cli_constraint_errors_exit_2(capsys, args, needle):
    from pipebubble.cli import main

    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_peak_memory_on_rank_0_for_every_family():
    # In rank-shares of M_B (M_W = 0), m >= 2p: GPipe m, 1F1B p, interleaved p(1+(p-1)/(pv)),
    # looped BFS m, ZB-H1 p, ZB-H2 2p-1, ZB-V p, DualPipeV p + 1/2 (= PP + 1 chunks, PP = 2p).
    for p in range(1, 6):
        m = 3 * p
        expected = {"gpipe": m, "1f1b": p, "interleaved-1f1b": p * (1 + (p - 1) / (2 * p)),
                    "looped-bfs": m, "zb-h1": p, "zb-h2": 2 * p - 1, "zbv": p,
                    "dualpipev": p + 0.5}
        for name, mem in expected.items():
            got = simulate(get_schedule(name, p, m)).rank_stats()[0].peak_memory
            assert got == approx(mem), (name, p)
