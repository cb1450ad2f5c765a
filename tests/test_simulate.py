import pytest
from hypothesis import given

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Action, Overlap, ScheduleError, make_schedule
from pipebubble.schedules import get_schedule
from pipebubble.sim.formulas import bubble_fraction, gpipe_step_time
from pipebubble.sim.kernel import Deadlock, simulate
from strategies import schedules_and_costs


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


def test_deadlock_names_every_stuck_rank():
    # Both ranks wait for each other: rank 0 runs B0 before sending F for mb 0's next stage.
    orders = [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "B", 0), Action(1, "F", 0)]]
    s = make_schedule("t", orders, 2, 1)
    with pytest.raises(Deadlock) as info:
        simulate(s)
    msg = str(info.value)
    assert "rank 0 stuck at 0B0" in msg and "rank 1 stuck at 1B0" in msg


@given(schedules_and_costs())
def test_invariants_hold_for_random_schedules(case):
    schedule, costs = case
    t = simulate(schedule, costs)
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    ev = {(e.stage, e.kind, e.microbatch): e for e in t.events()}
    assert len(ev) == schedule.num_actions()
    for r in range(t.num_ranks):
        evs = list(t.events(r))
        for a, b in zip(evs, evs[1:], strict=False):
            assert b.start >= a.end - 1e-9, "two events overlap on a rank"
    S = schedule.num_stages
    for (s, k, m), e in ev.items():
        assert e.end - e.start == pytest.approx(sc.duration(s, k))

        def after(dep, e=e, s=s):
            d = ev[dep]
            hop = sc.comm if schedule.stage_to_rank[d.stage] != schedule.stage_to_rank[s] else 0
            assert e.start >= d.end + hop - 1e-9

        if k == "F" and s > 0:
            after((s - 1, "F", m))
        if k in ("B", "I"):
            after((s, "F", m))
            if s < S - 1:
                after((s + 1, "I", m) if (s + 1, "I", m) in ev else (s + 1, "B", m))
        if k == "W":
            after((s, "I", m))
    # the step runs from 0 (some action needs nothing and starts at once) to the last end
    assert min(e.start for e in ev.values()) == 0
    assert t.step_time == pytest.approx(max(e.end for e in ev.values()))
    assert 0 <= t.bubble_fraction < 1 or t.step_time == 0
    for st in t.rank_stats():
        assert 0 <= st.bubble_fraction <= 1
        assert st.peak_memory >= 0


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
