"""DualPipe (DeepSeek): two model copies, microbatches entering from both ends.

``get_schedule("dualpipe", p, M)`` takes M microbatches in total: M/2 go down copy A
(stages 0..p-1, rank 0 to rank p-1) and M/2 go up copy B (stages p..2p-1, rank p-1 to rank
0), two independent chains. Costs here are given per stage (lists of 2p values), so every
number is the time of one stage, 1/p of one copy, whatever a scalar cost is divided by.

The bubble closed form (DualPipe README) is (PP/2 - 1)(F&B + B - 3W) per rank with PP = p.
The simulation matches it exactly, found by brute force over p in {2, 4, 6, 8}, M from 2p
to 8p and F, I, W in {0.5, 1, 1.5, 2, 3}, overlap in {0.5, 0.55, ..., 1}, when:

- p = 2 (no bubble at all, for every F, I, W); or
- F = I, W <= I, and F&B >= B (always so when overlap = 1).

With overlap = 1 every rank idles exactly that; with overlap < 1 only the idlest rank
does (the ends of the pipeline run fewer overlapped pairs), so the registered closed form
(a fraction over the step) is given for overlap = 1 only. Off the conditions the formula
misses except at isolated crossings; ``test_bubble_conditions`` repeats the search on a
smaller grid.
"""

import itertools
import json

import pytest

from pipebubble.cli import main
from pipebubble.costs import CostModel
from pipebubble.interop import parse_torch_csv, to_torch_csv
from pipebubble.ir.schedule import Action, Overlap, ScheduleError, v_placement, validate
from pipebubble.schedules import closed_form_bubble, get_schedule
from pipebubble.sim.formulas import dualpipe_bubble_time
from pipebubble.sim.kernel import Deadlock, simulate


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def per_stage(p, f=1.0, b=2.0, w=1.0, overlap=1.0, mem=1.0):
    """Uniform costs given per stage (2p stages: one of each copy per rank)."""
    n = 2 * p
    return CostModel(f=[f] * n, b=[b] * n, w=[w] * n, overlap=overlap,
                     activation_memory=[mem] * n)


# ---- shape ----------------------------------------------------------------------------------

def test_valid_over_a_grid_with_two_chains_in_v_placement():
    for p in (2, 4, 6, 8):
        for total in range(2 * p, 4 * p + 3, 2):
            s = get_schedule("dualpipe", p, total)
            validate(s)
            assert (s.num_ranks, s.num_stages, s.chains) == (p, 2 * p, 2)
            assert s.chain_starts == (0, p)
            assert s.num_microbatches == total // 2 and s.total_microbatches == total
            # rank r holds copy A's stage r and copy B's stage p-1-r (global 2p-1-r)
            assert s.placement == "v" and s.stage_to_rank == v_placement(p)
            assert s.last_stage(p - 1) and s.first_stage(p) and s.last_stage(2 * p - 1)


def test_every_microbatch_of_both_chains_runs_every_stage_once():
    p, total = 4, 10
    s = get_schedule("dualpipe", p, total)
    done = [a for r in range(p) for a in s.actions(r)]
    for chain in (range(p), range(p, 2 * p)):
        for stage in chain:
            for mb in range(total // 2):
                assert done.count(Action(stage, "F", mb)) == 1
                backward = [a.kind for a in done if (a.stage, a.microbatch) == (stage, mb)
                            and a.kind != "F"]
                assert sorted(backward) in (["B"], ["I", "W"])
    assert sum(a.kind == "F" for a in done) == p * total  # M microbatches x p stages each
    t = simulate(s, per_stage(p))
    firsts = {(e.stage, e.microbatch) for e in t.events() if e.kind == "F" and e.start == 0}
    assert firsts == {(0, 0), (p, 0)}  # both copies start at time 0, from opposite ends
    assert t.summary()["microbatches"] == total


def test_matches_deepseeks_phases_on_p4():
    # DualPipe.step for 4 ranks, 8 chunks (4 per direction): rank 0 (half_rank 0) warms up
    # with 2 F0, then F0 F1, one zero-bubble (B1 W F1), one main (F0&B1)(F1&B0), one
    # B1 (F1&B0), B1 B0 (the B0 split), W B0 (split), W. Rank 1 is a middle rank: no warm-up
    # beyond 2 x (F0 F1), and its first main step runs F0 and B1 apart.
    s = get_schedule("dualpipe", 4, 8)
    assert " ".join(map(str, s.orders[0])) == (
        "0F0 0F1 0F2 7F0 7I0 7W0 7F1 (0F3;7B1) (7F2;0B0) 7B2 (7F3;0B1) 7B3 0I2 0W2 0I3 0W3")
    assert " ".join(map(str, s.orders[1])) == (
        "1F0 6F0 1F1 6F1 1F2 6B0 (6F2;1B0) (1F3;6B1) (6F3;1B1) 6B2 1B2 6I3 1I3 6W3 1W3")
    # ranks 3 and 2 mirror ranks 0 and 1 with the copies swapped: copy A's stage j (global
    # j) <-> copy B's stage j (global p + j)
    swap = {s: (s + 4) % 8 for s in range(8)}
    for r in (2, 3):
        want = [_swap(step, swap) for step in s.orders[3 - r]]
        assert list(s.orders[r]) == want


def _swap(step, swap):
    if isinstance(step, Overlap):
        return Overlap(_swap(step.forward, swap), _swap(step.backward, swap))
    return step._replace(stage=swap[step.stage])


def test_is_two_dualpipevs_on_half_the_ranks():
    # Rank r of DualPipe(p, M) runs rank h = min(r, p-1-r) of DualPipeV(p/2, M/2): near
    # stage as chunk 0, far stage as chunk 1. Without communication time the timelines match
    # event for event (the V's turn inside rank p/2-1 becomes the hop to rank p/2).
    for p, total in [(2, 4), (4, 8), (4, 14), (6, 12), (8, 20)]:
        costs = per_stage(p, f=1.0, b=2.5, w=0.75, overlap=0.8)
        dual = simulate(get_schedule("dualpipe", p, total), costs)
        half = p // 2
        v = simulate(get_schedule("dualpipev", half, total // 2), per_stage(
            half, f=1.0, b=2.5, w=0.75, overlap=0.8))
        for r in range(p):
            h = min(r, p - 1 - r)
            got = [(e.kind, e.microbatch, e.start, e.end) for e in dual.events(r)]
            want = [(e.kind, e.microbatch, e.start, e.end) for e in v.events(h)]
            assert got == want, (p, total, r)


def _phases(p, m, r, stage):
    """Rank r of DualPipeV(p, m), phase by phase as the module docstring states them, one
    step at a time: the readable statement the array generator must equal."""
    from collections import deque

    next_f, next_b, weights, order = [0, 0], [0, 0], deque(), []

    def f(chunk):
        next_f[chunk] += 1
        return Action(stage[chunk], "F", next_f[chunk] - 1)

    def b(chunk, split=False):
        next_b[chunk] += 1
        mb = next_b[chunk] - 1
        if split:
            weights.append(Action(stage[chunk], "W", mb))
        return Action(stage[chunk], "I" if split else "B", mb)

    def w():
        if weights:
            order.append(weights.popleft())

    order += [f(0) for _ in range(2 * (p - r - 1))]  # 1
    for _ in range(r + 1):  # 2
        order += [f(0), f(1)]
    for _ in range(p - r - 1):  # 3
        order.append(b(1, split=True))
        w()
        order.append(f(1))
    for i in range(m - 2 * p + r + 1):  # 4
        order += [f(0), b(1)] if i == 0 and r == p - 1 else [Overlap(f(0), b(1))]
        order.append(Overlap(f(1), b(0)))
    for _ in range(p - r - 1):  # 5
        order += [b(1), Overlap(f(1), b(0))]
    split = False
    for i in range(r + 1):  # 6
        split |= i == (r + 1) // 2 and r % 2 == 1
        order.append(b(1, split))
        split |= i == (r + 1) // 2 and r % 2 == 0
        order.append(b(0, split))
    for _ in range(p - r - 1):  # 7
        w()
        order.append(b(0, split=True))
    for _ in range(r + 1):  # 8
        w()
    return order


def test_array_orders_equal_the_phases_step_by_step():
    """The generator builds each rank's order as arrays (the steady state with numpy); it
    reads as exactly the steps of the eight phases, pairs as Overlaps."""
    import pickle

    for p in range(1, 7):
        for m in range(2 * p, 4 * p + 4):
            s = get_schedule("dualpipev", p, m)
            for r, order in enumerate(s.orders):
                want = _phases(p, m, r, (r, 2 * p - 1 - r))
                assert list(order) == want and order == tuple(want), (p, m, r)
                assert len(order) == len(want)  # a pair is one step
                assert order.num_actions() == sum(2 if isinstance(x, Overlap) else 1
                                                  for x in want)
                assert order[len(want) // 2] == want[len(want) // 2]
                assert pickle.loads(pickle.dumps(order)) == order
    big = get_schedule("dualpipe", 6, 30)
    for r in range(6):  # rank r of DualPipe is rank min(r, p-1-r) of a DualPipeV, see above
        mine = (r, 11 - r)
        want = _phases(3, 15, min(r, 5 - r), mine if r < 3 else mine[::-1])
        assert list(big.orders[r]) == want


def test_a_packed_pair_is_a_forward_then_a_backward():
    import numpy as np

    from pipebubble.ir.orders import RankOrder

    one = RankOrder.build(0, "FB", [0, 0])
    ok = RankOrder.with_pairs(one.stage, one.kind, one.microbatch, [1, 2])
    assert list(ok) == [Overlap(Action(0, "F", 0), Action(0, "B", 0))] and len(ok) == 1
    assert ok != one and one == RankOrder.with_pairs(one.stage, one.kind, one.microbatch,
                                                     [0, 0])
    bf = RankOrder.build(0, "BF", [0, 0])
    for order, pair in ((bf, [1, 2]), (one, [2, 1]), (one, [1, 0]), (one, [1]), (one, [2, 3])):
        with pytest.raises(ScheduleError, match="an Overlap pairs a forward with a backward"):
            RankOrder.with_pairs(order.stage, order.kind, order.microbatch, np.array(pair))


# ---- numbers ---------------------------------------------------------------------------------

def test_numbers_by_hand_p4_m8():
    # Per stage F=1, B=2 (I=1, W=1). Each rank runs 8 stage-microbatches (4 of each copy):
    # busy 8 x 3 = 24; idle (p/2 - 1)(F&B + B - 3W) = 1 x (3 + 2 - 3) = 2; step 26.
    s = get_schedule("dualpipe", 4, 8)
    costs = per_stage(4)
    t = simulate(s, costs)
    assert t.step_time == 26
    assert [st.busy for st in t.rank_stats()] == [24] * 4
    assert [st.idle for st in t.rank_stats()] == [2] * 4
    sc = costs.resolve(8, s.chunks)
    assert closed_form_bubble("dualpipe", 4, 8, s.chunks, sc) == approx(2 / 26)
    assert t.bubble_fraction == approx(2 / 26)


def test_peak_activations_are_p_plus_1_on_every_rank():
    # DualPipe README: activation PP + 1, counted in stages (1/PP of one copy each) with
    # PP = p. Rank 0 warms up with p - 1 forwards of copy A and one of copy B, and its first
    # overlapped pair adds one more before anything is freed. DualPipe spreads it evenly:
    # every rank peaks at p + 1 (1F1B: p on rank 0, 1 on rank p - 1).
    for p in (2, 4, 6, 8):
        for total in (2 * p, 2 * p + 2, 4 * p):
            t = simulate(get_schedule("dualpipe", p, total), per_stage(p, mem=1.0))
            for st in t.rank_stats():
                assert st.peak_activations == p + 1 and st.peak_memory == p + 1, (p, total)


def test_overlap_cost_is_used():
    s = get_schedule("dualpipe", 4, 8)
    assert any(isinstance(step, Overlap) for step in s.orders[0])
    assert simulate(s, per_stage(4, overlap=0.5)).step_time < simulate(s, per_stage(4)).step_time


def test_bubble_conditions():
    # Under the conditions (p = 2, or F = I, W <= I and F&B >= B) the idlest rank idles
    # exactly (p/2 - 1)(F&B + B - 3W); with overlap = 1 every rank does, and the registered
    # closed form equals the simulated fraction (elsewhere it says None). Off the conditions
    # the simulated idle time is another, piecewise function of F, I, W (for F > I, not even
    # linear in p): the formula misses it except at isolated points where the two cross.
    values = [0.5, 1, 2]
    outside = crossings = 0
    for p in (2, 4, 6):
        for total in (2 * p, 2 * p + 2, 4 * p):
            s = get_schedule("dualpipe", p, total)
            for f, i, w, ov in itertools.product(values, values, values, [1.0, 0.75, 0.5]):
                b = i + w
                costs = per_stage(p, f=f, b=b, w=w, overlap=ov)
                t = simulate(s, costs)
                idle = dualpipe_bubble_time(p // 2, ov * (f + b), b, w)
                holds = p == 2 or (f == i and w <= i and ov * (f + b) >= b)
                worst = max(st.idle for st in t.rank_stats())
                if holds:
                    assert worst == approx(idle), (p, total, f, i, w, ov)
                else:
                    outside += 1
                    crossings += worst == approx(idle)
                closed = closed_form_bubble("dualpipe", p, total, s.chunks,
                                            costs.resolve(2 * p, s.chunks))
                assert (closed is not None) == (holds and ov == 1.0), (p, total, f, i, w, ov)
                if closed is not None:
                    assert all(st.idle == approx(idle) for st in t.rank_stats())
                    assert closed == approx(t.bubble_fraction)
    # outside: p = 4, 6 x 3 M x (81 - 12 inside: F = I, W <= I, 2 overlaps with F&B >= B)
    assert outside == 2 * 3 * (81 - 12) and crossings <= outside // 20, crossings


def test_no_closed_form_with_communication():
    s = get_schedule("dualpipe", 4, 8)
    sc = CostModel(comm=0.1).resolve(8, s.chunks)
    assert closed_form_bubble("dualpipe", 4, 8, s.chunks, sc) is None
    t = simulate(s, CostModel(comm=0.1))  # the turn between ranks 1 and 2 is now a hop
    assert t.step_time > simulate(s, CostModel()).step_time


# ---- constraints -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "p, total, needle",
    [
        (3, 12, "even number of ranks >= 2 (its two halves mirror each other), got 3"),
        (1, 4, "even number of ranks >= 2"),
        (4, 6, "even number of microbatches >= 2 x ranks = 8 (half enter from each end"),
        (4, 9, "got 9"),
        (6, 11, ">= 2 x ranks = 12"),
    ],
)
def test_constraints_are_checked_up_front(p, total, needle):
    with pytest.raises(ScheduleError, match="dualpipe needs") as err:
        get_schedule("dualpipe", p, total)
    assert needle in str(err.value)


@pytest.mark.parametrize("args", [["-p", "3", "-m", "8"], ["-p", "4", "-m", "7"],
                                  ["-p", "4", "-m", "8", "-v", "3"]])
def test_cli_constraint_errors_exit_2(capsys, args):
    assert main(["simulate", "--schedule", "dualpipe", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebubble: error: dualpipe") and len(err.strip().splitlines()) == 1


# ---- CLI and interop -------------------------------------------------------------------------

def test_compare_and_simulate_show_dualpipe(capsys):
    assert main(["compare", "-p", "4", "-m", "8", "--json"]) == 0
    rows = {r["schedule"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows["dualpipe"]
    assert row["microbatches"] == 8  # the total, both directions
    assert row["closed_form_bubble"] == approx(row["bubble_fraction"])
    assert row["per_rank"][0]["peak_activations"] == 5  # p + 1
    assert main(["simulate", "--schedule", "dualpipe", "-p", "4", "-m", "8"]) == 0
    out = capsys.readouterr().out
    assert "dualpipe  p=4 m=8 v=1" in out and "rank 3" in out  # one stage per copy per rank
    assert row["step_time"] == 26 and row["per_rank"][0]["peak_memory"] == 5  # same model


def test_csv_export_writes_it_and_reads_back_with_its_chains(tmp_path, capsys):
    s = get_schedule("dualpipe", 4, 8)
    path = tmp_path / "dualpipe.csv"
    assert main(["export", "--schedule", "dualpipe", "-p", "4", "-m", "8", "--csv",
                 str(path)]) == 0
    assert "8 microbatches (4 per chain)" in capsys.readouterr().err
    text = path.read_text()
    assert text == to_torch_csv(s)
    assert text.splitlines()[0].split(",")[7] == "(0F3;7B1)OVERLAP_F_B"
    # The format has no chains: say where they start to get DualPipe back.
    back = parse_torch_csv(text, chain_starts=(0, 4))
    assert back.orders == s.orders and back.num_microbatches == 4
    assert simulate(back, per_stage(4)).step_time == 26
    # Read as one chain, copy B's first stage would wait for copy A's last: a deadlock,
    # reported with the stuck cells (torch's _load_csv refuses it too: test_torch_csv.py).
    with pytest.raises(Deadlock):
        simulate(parse_torch_csv(text))
    assert main(["simulate", "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert "deadlock" in err and "row 1, column 4" in err and len(err.strip().splitlines()) == 1
