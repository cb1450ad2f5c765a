"""The search budget of ``auto`` (``schedules/auto/budget.py``): one ledger that every stage
after the registered schedules charges. A budget of 0 does no search beyond them (the
greedy runs only as the fallback when nothing registered fits), the work charged grows
with the budget, the same instance and budget give the same order, and each stage's
charge is in the provenance. There is no wall clock unless a deadline is asked for
(``search_deadline``), so no test depends on the machine's speed; the deadline's bound is
bench/bench_auto.py's ``budget`` section."""

import pytest

import pipebubble.schedules.auto as auto_mod
from pipebubble import CostModel, auto_schedule, get_schedule, simulate, validate
from pipebubble.costs import fits_limit
from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.schedules.auto import budget as budget_mod
from pipebubble.schedules.auto.budget import WORK_PER_SECOND, Budget
from pipebubble.schedules.auto.mip import check_cap, window_work
from pipebubble.schedules.registry import lookup, schedule_names

UNIT = CostModel(f=2, b=4, w=2, weight_memory=1.0)  # F = I = W = 1 a chunk, W frees all
REAL = CostModel(f=[1.0, 1.4, 0.8, 1.2], b=[2.1, 2.5, 1.7, 2.2], w=[0.9, 1.1, 0.7, 1.0],
                 comm=0.1, weight_memory=0.5)


@pytest.fixture(autouse=True)
def _no_memory():
    """No remembered answers across calls."""
    auto_mod._REMEMBERED.clear()
    yield
    auto_mod._REMEMBERED.clear()


def _peaks_fit(sched, costs, limit):
    return all(fits_limit(r.peak_memory, limit) for r in simulate(sched, costs).rank_stats())


def _best_registered(p, m, costs, limit, chunks):
    """The fastest registered schedule of that placement that fits (brute force)."""
    best = None
    for name in schedule_names():
        spec = lookup(name)
        if spec.searched or spec.chunks != chunks:
            continue
        try:
            s = get_schedule(name, p, m)
        except Exception:
            continue
        if s.chains != 1 or (chunks == 2 and s.stage_to_rank != get_schedule("zbv", p, m)
                             .stage_to_rank):
            continue
        if _peaks_fit(s, costs, limit):
            step = simulate(s, costs).step_time
            best = step if best is None else min(best, step)
    return best


def test_ledger_refuses_what_it_cannot_afford_and_charges_what_was_done():
    b = Budget(1.0)
    assert b.total == WORK_PER_SECOND
    assert b.spend(0.75 * WORK_PER_SECOND, "greedy")
    assert not b.spend(0.5 * WORK_PER_SECOND, "adaptive V")  # refused: nothing charged
    assert b.spent == 0.75 * WORK_PER_SECOND and "adaptive V" not in b.by_stage
    assert not b.charge(0.5 * WORK_PER_SECOND, "tail windows")  # done: charged, overdrawn
    assert b.left == -0.25 * WORK_PER_SECOND
    assert sum(b.by_stage.values()) == b.spent
    assert not b.afford(0.0) and not b.hit


def test_zero_budget_searches_nothing_beyond_the_registered_schedules():
    # V, 5 chunk activations a rank: V-Min fits, so nothing else runs.
    p, m, limit = 4, 16, 2.5
    s = auto_schedule(p, m, UNIT, memory_limit=limit, placement="v", search_seconds=0)
    info = s.options["auto"]
    validate(s)
    assert _peaks_fit(s, UNIT, limit)
    assert info.work == 0 and all(x.work == 0 for x in info.stages)
    assert info.generator in schedule_names()
    assert info.step_time == pytest.approx(_best_registered(p, m, UNIT, limit, 2))
    full = auto_schedule(p, m, UNIT, memory_limit=limit, placement="v")
    assert full.options["auto"].step_time < info.step_time  # the search is what gains


def test_zero_budget_falls_back_to_one_greedy_order_below_every_registered_one():
    # Loop placement at 2 microbatches a rank: no registered loop schedule fits (1F1B
    # holds p on rank 0), so the greedy runs once, charged, as the fallback.
    p, m, limit = 4, 8, 2.0
    assert _best_registered(p, m, REAL, limit, 1) is None
    s = auto_schedule(p, m, REAL, memory_limit=limit, placement="loop", search_seconds=0)
    info = s.options["auto"]
    validate(s)
    assert _peaks_fit(s, REAL, limit)
    assert info.generator.startswith("greedy")
    charged = {x.name: x.work for x in info.stages if x.work}
    assert list(charged) == ["greedy"]
    assert charged["greedy"] == auto_mod.GREEDY_WORK * 3 * p * m  # one pass


REAL3 = CostModel(f=[1.0, 1.4, 0.8], b=[2.1, 2.5, 1.7], w=[0.9, 1.1, 0.7], comm=0.1,
                  weight_memory=0.5)


@pytest.mark.parametrize(("p", "m", "costs", "limit", "placement"), [
    (4, 16, UNIT, 2.5, "v"),  # adaptive V, then the tail windows
    (3, 4, REAL3, 2.0, "loop"),  # local search, then MIP windows
])
def test_work_grows_with_the_budget_and_every_stage_is_charged(p, m, costs, limit, placement):
    works, steps = [], []
    for seconds in (0, 0.02, 0.1, 0.4):
        auto_mod._REMEMBERED.clear()
        s = auto_schedule(p, m, costs, memory_limit=limit, placement=placement,
                          search_seconds=seconds)
        info = s.options["auto"]
        assert _peaks_fit(s, costs, limit)
        assert sum(x.work for x in info.stages) == pytest.approx(info.work)
        searched = [x for x in info.stages if x.name != "registered schedules"
                    and (placement == "v" or x.name != "adaptive V")]  # V only
        if seconds == 0.4:  # every stage that ran did work, and the ledger counted it
            assert searched and all(x.work > 0 for x in searched), info.stages
        works.append(info.work)
        steps.append(info.step_time)
    assert works == sorted(works), works
    assert works[-1] > works[0]


def test_same_instance_and_budget_same_order():
    runs = []
    for _ in range(2):
        auto_mod._REMEMBERED.clear()
        s = auto_schedule(4, 16, UNIT, memory_limit=3.0, placement="v", search_seconds=0.05)
        runs.append((s.orders, s.options["auto"].work))
    assert runs[0] == runs[1]


def test_a_solve_stops_at_its_check_cap_with_the_start_or_better():
    # A tail window of 16 actions a rank after V-Min at p = 4, m = 16 under 6 chunk
    # activations: uncapped, HiGHS makes over a hundred checks (its root cut rounds and
    # nodes); capped at 2 it stops at the third, with an order no slower than the start.
    import highspy

    from pipebubble.schedules.auto.mip import solve, starts

    p, m = 4, 16
    start = get_schedule("v-min", p, m)
    sc = UNIT.resolve(2 * p, 2)
    t = simulate(start, sc)
    flat = [[Action(a.stage, a.kind, a.microbatch) for a in o] for o in start.orders]
    began = starts(t)
    cut = sorted(began.values(), reverse=True)[16 * p - 1]
    got = {}
    for cap in (None, 2):
        effort = []
        orders = solve(highspy, sc, start.stage_to_rank, m, [3.0] * p, flat, began,
                       t.step_time, None, time_limit=60, gap=1e-3, nodes=50, tail_from=cut,
                       effort=effort, checks=cap)[0]
        assert orders is not None
        timed = simulate(make_schedule("x", orders, 2 * p, m, placement="v"), sc)
        assert timed.step_time <= t.step_time + 1e-9
        assert all(fits_limit(r.peak_memory, 3.0) for r in timed.rank_stats())
        got[cap] = effort[-1]
    assert got[2][1] == 3 and got[None][1] > 10 * 3
    assert got[2][0] < got[None][0]  # fewer simplex iterations too


def test_no_window_starts_without_room_for_its_setup_and_a_few_checks():
    size, total = 64, 384
    assert check_cap(Budget(0.0), size, total) is None
    need = window_work(size, total, 0, 0) + budget_mod.WORK_PER_SECOND * 0  # setup only
    assert check_cap(Budget(need / WORK_PER_SECOND), size, total) is None
    roomy = Budget(1.0)
    cap = check_cap(roomy, size, total)
    assert cap is not None and cap >= 8
    # the cap's worst case fits in what is left
    assert window_work(size, total, 0, cap) <= roomy.left + 1e-6


def test_no_deadline_unless_asked(monkeypatch):
    """No wall clock by default (the clock is not even read); ``deadline=S`` lies S seconds
    after the ledger is made."""
    import time

    def no_clock():
        raise AssertionError("the clock was read")

    b = Budget(0.5)
    monkeypatch.setattr(budget_mod.time, "perf_counter", no_clock)
    assert b.deadline == float("inf") and not b.late() and b.seconds_left() == float("inf")
    assert b.spend(1.0) and b.charge(1.0)
    monkeypatch.undo()
    t0 = time.perf_counter()
    b = Budget(0.5, deadline=2.0)
    t1 = time.perf_counter()
    assert t0 + 2.0 <= b.deadline <= t1 + 2.0
