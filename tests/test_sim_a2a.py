"""Expert parallelism's all-to-all in the simulator: hidden in DualPipe's overlapped F&B
pairs, exposed everywhere else (``CostModel.a2a_f``/``a2a_b``, ``StageCosts.pair_parts``)."""

import json
import math

import pytest
from hypothesis import given, settings

from pipebubble.cli import main
from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Overlap, ScheduleError
from pipebubble.render.trace import trace_document
from pipebubble.schedules import get_schedule
from pipebubble.sim.formulas import dualpipe_closed_form, gpipe_closed_form
from pipebubble.sim.kernel import simulate
from pipebubble.sim.reference import simulate_reference
from pipebubble.sim.wire import lower, run_wire
from strategies import schedules_and_costs


def test_a_pair_takes_the_larger_of_its_compute_and_its_all_to_all():
    """F = 2, B = 2 (W = 0): with 1.5 s of all-to-all in each the compute is 1 and the
    all-to-all 3, so the pair takes 3 (not 4), hides 1 and exposes 2; with 0.5 in each the
    compute (3) wins: 3, all of the 1 s hidden."""
    sc = CostModel(f=2, b=2, w=0, a2a_f=1.5, a2a_b=1.5).resolve(1)
    fwd, bwd = sc.pair_parts(0, 0, "B")
    assert sc.pair_duration(0, 0, "B") == (3.0, 1.0)
    assert fwd.duration + bwd.duration == 3.0 and fwd.duration == bwd.duration
    assert (fwd.hidden + bwd.hidden, fwd.exposed + bwd.exposed) == (1.0, 2.0)
    light = CostModel(f=2, b=2, w=0, a2a_f=0.5, a2a_b=0.5).resolve(1)
    assert light.pair_duration(0, 0, "B") == (3.0, 1.0)
    assert [p.exposed for p in light.pair_parts(0, 0, "B")] == [0.0, 0.0]
    # alone, an action keeps its whole time and exposes its all-to-all
    assert light.lone_part(0, "F") == (2.0, 0.0, 0.5)
    assert light.lone_part(0, "W").exposed == 0.0


@pytest.mark.parametrize("m, pairs", [(4, 1), (8, 5), (12, 9)])
def test_dualpipe_on_two_ranks_saves_exactly_what_its_pairs_hide(m, pairs):
    """DualPipe p = 2 has no bubble (F = 1, B = 2: step 3m with nothing to hide). With half
    a second of all-to-all in F and in B each pair (compute 2, all-to-all 1) takes 2 instead
    of 3: the step drops by 1 per pair on a rank, m - 3 pairs (rank 0's order, counted)."""
    schedule = get_schedule("dualpipe", 2, m)
    assert sum(isinstance(s, Overlap) for s in schedule.orders[0]) == pairs
    plain = simulate(schedule, CostModel(f=1, b=2, w=1))
    moe = simulate(schedule, CostModel(f=1, b=2, w=1, a2a_f=0.5, a2a_b=0.5))
    assert plain.step_time == 3 * m
    assert moe.step_time == 3 * m - pairs
    for stats in moe.rank_stats():
        assert stats.a2a_hidden == pairs
        assert plain.step_time - moe.step_time == stats.a2a_hidden
        # every action's all-to-all is accounted for: m F's and m B's of 0.5 each (a rank
        # holds one stage of each of the two model copies, m/2 microbatches each)
        assert stats.a2a_hidden + stats.a2a_exposed == m * 0.5 + m * 0.5


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "zbv"])
def test_schedules_without_pairs_do_not_care_how_much_of_f_is_all_to_all(name):
    """No overlapped pairs: every action exposes its all-to-all, which is part of --f/--b,
    so the step time is the same to the last bit whatever part of them it is."""
    schedule = get_schedule(name, 4, 8)
    want = simulate(schedule, CostModel(f=1, b=2, w=1)).step_time
    for a2a_f, a2a_b in ((0.3, 0.1), (1.0, 1.0), (0.0, 0.7)):
        t = simulate(schedule, CostModel(f=1, b=2, w=1, a2a_f=a2a_f, a2a_b=a2a_b))
        assert t.step_time == want
        assert all(s.a2a_hidden == 0 for s in t.rank_stats())


@settings(max_examples=60, deadline=None)
@given(schedules_and_costs())
def test_every_rank_accounts_for_all_its_all_to_all(case):
    """Hidden + exposed on a rank = the all-to-all of the actions it runs, pairs or not."""
    schedule, costs = case
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    t = simulate(schedule, costs)
    if not sc.has_a2a:
        assert not t.has_a2a and "a2a_hidden" not in t.rank_stats()[0].as_dict()
        return
    for r, stats in enumerate(t.rank_stats()):
        want = sum(sc.a2a(e.stage, e.kind) for e in t.events(r))
        assert stats.a2a_hidden + stats.a2a_exposed == pytest.approx(want, abs=1e-9)
        assert stats.a2a_hidden >= 0 and stats.a2a_exposed >= -1e-12


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_many_pairs_kernel_equals_reference_and_the_wire(name):
    """Past BLOCKS_FROM actions the kernel runs pairs as one step each: the same doubles as
    the reference, per-stage all-to-all and comm included; buffered batched wires agree."""
    S = 8
    costs = CostModel(f=[1 + s / 8 for s in range(S)], b=[2.5] * S, w=[1] * S, comm=0.1,
                      a2a_f=[0.2 * s / S for s in range(S)], a2a_b=[0.9] * S, overlap=0.9)
    schedule = get_schedule(name, 4, 96)
    fast, slow = simulate(schedule, costs), simulate_reference(schedule, costs)
    assert len(fast) > 256
    assert [tuple(e) for e in fast.events()] == [tuple(e) for e in slow.events()]
    assert [s.as_dict() for s in fast.rank_stats()] == [s.as_dict() for s in slow.rank_stats()]
    wired = run_wire(lower(schedule, "batched"), costs).timeline
    assert wired.step_time == pytest.approx(fast.step_time, rel=1e-12)
    assert [s.a2a_hidden for s in wired.rank_stats()] == pytest.approx(
        [s.a2a_hidden for s in fast.rank_stats()])


def test_the_dualpipe_closed_forms_decline_with_all_to_all():
    sc = CostModel(f=1, b=2, w=1, a2a_f=0.5).resolve(8, 1)
    assert dualpipe_closed_form(4, 16, 1, sc) is None
    assert dualpipe_closed_form(4, 16, 1, CostModel(f=1, b=2, w=1).resolve(8, 1)) is not None
    # a lone action's time is its whole time: 1F1B's form still holds
    assert gpipe_closed_form(4, 8, 1, CostModel(a2a_f=0.5).resolve(4)) == 3 / 11


@pytest.mark.parametrize("bad, match", [
    (dict(a2a_f=1.5), r"a2a_f must be <= f .* got 1.5 > 1.0 for stage 0"),
    (dict(a2a_b=1.5), r"a2a_b must be <= b - w .* got 1.5 > 1.0"),
    (dict(a2a_f=-0.1), r"a2a_f must be >= 0, got -0.1"),
    (dict(a2a_f=math.nan), r"a2a_f must be >= 0, got nan"),
    (dict(a2a_b=[0.1, 0.2]), r"a2a_b has 2 values; expected 1 or 4"),
])
def test_bad_all_to_all_is_one_line(bad, match):
    with pytest.raises(ScheduleError, match=match):
        CostModel(f=1, b=2, w=1, **bad).resolve(4)


@pytest.mark.parametrize("flags, words", [
    (["--a2a-f", "-1"], "--a2a-f must be finite and >= 0, got -1"),
    (["--a2a-b", "inf"], "--a2a-b must be finite and >= 0, got inf"),
    (["--a2a-f", "2"], "a2a_f must be <= f (the all-to-all is part of the forward), got 2.0"),
    (["--a2a-b", "1.5"], "a2a_b must be <= b - w"),
    (["--ep", "8"], "--ep and --ep-bandwidth apply with --profile FILE"),
])
def test_the_cli_refuses_bad_all_to_all_with_one_line(flags, words, capsys):
    assert _exit(["simulate", "--schedule", "dualpipe", "-p", "4", "-m", "8", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def _exit(argv: list[str]) -> int:
    """The exit status of the CLI (argparse's refusals raise SystemExit; ours return 2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_simulate_json_and_the_trace_carry_the_hidden_and_exposed_all_to_all(capsys):
    assert main(["simulate", "--schedule", "dualpipe", "-p", "2", "-m", "8",
                 "--a2a-f", "0.5", "--a2a-b", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time"] == 19 and out["a2a_hidden"] == 10 and out["a2a_exposed"] == 6
    assert {"a2a_hidden", "a2a_exposed"} <= set(out["events"][0])
    assert sum(e["a2a_hidden"] for e in out["events"]) == 10
    t = simulate(get_schedule("dualpipe", 2, 8), CostModel(a2a_f=0.5, a2a_b=0.5))
    doc = trace_document([t])
    comm = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("a2a_")]
    hidden = sum(e["dur"] for e in comm if e["cat"] == "a2a_hidden")
    exposed = sum(e["dur"] for e in comm if e["cat"] == "a2a_exposed")
    assert (hidden, exposed) == (10 * 1e3, 6 * 1e3)  # 1 unit = 1 ms = 1000 us
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "all-to-all" in names


def test_the_gantt_chart_has_the_all_to_all_in_its_legend():
    from pipebubble.render.plots import _legend_handles

    t = simulate(get_schedule("dualpipe", 2, 8), CostModel(a2a_f=0.5, a2a_b=0.5))
    labels = [h.get_label() for h in _legend_handles([t])]
    assert "all-to-all hidden" in labels and "all-to-all exposed" in labels
    plain = simulate(get_schedule("dualpipe", 2, 8))
    assert "all-to-all hidden" not in [h.get_label() for h in _legend_handles([plain])]
