"""The search over large orders kept beside the benchmarks (``bench/large_search/``).

``TailsCompiled`` (the evaluation core plus moves answered from the tails): an answer left
pending must give the step time to within the documented rounding (``critical.tolerance``,
twice), a deadlock exactly, the peaks exactly, and once re-timed, every time exactly; the
tails kept up to date must equal tails built afresh, to the bit. ``critical()`` must name
exactly the steps on a longest path: checked by brute force (lengthen one step by a
quarter, the step time grows by that quarter iff the step is critical, when every slack is
a multiple of a half). ``local_search`` must never give a slower or an over-the-limit
order, and its step time must be the simulator's.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule
from pipebubble.ir.schedule import validate
from pipebubble.sim import Deadlock, simulate, simulate_reference
from pipebubble.sim.kernel import Program, run
from pipebubble.sim.program import schedule_peaks
from strategies import schedules_and_costs
from test_program import outcome, same, valid_on_rank

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from large_search import TailsCompiled as Compiled  # noqa: E402
from large_search import local_search  # noqa: E402
from large_search.critical import Tails, tolerance  # noqa: E402


def close(got: float, want: float, core: Compiled) -> bool:
    """The documented bound of an answer from the tails: within twice the tolerance."""
    if want == float("inf") or got == float("inf"):
        return got == want
    return abs(got - want) <= 2 * tolerance(len(core._end), want)


def neighbours(core: Compiled, rnd: random.Random):
    """A rank and an index k whose steps k, k + 1 may trade places there (None: none)."""
    for _ in range(20):
        r = rnd.randrange(len(core.orders))
        order = core.orders[r]
        if len(order) < 2:
            continue
        k = rnd.randrange(len(order) - 1)
        new = list(order)
        new[k], new[k + 1] = new[k + 1], new[k]
        if valid_on_rank(new, core.steps):
            return r, k
    return None


def check_now(core: Compiled, costs, pending_ok: bool = True, tails: bool = True) -> None:
    """The core's step time, deadlock and peaks against the kernel (and a fresh core) on
    the current orders, without re-timing a pending move."""
    pending = core._pending is not None
    assert pending_ok or not pending
    edited = core.schedule()
    want = outcome(replace(edited), costs, simulate)
    if want[0] == "deadlock":
        assert core.deadlocked and core.step_time == float("inf")
        return
    assert not core.deadlocked
    fresh = Compiled(edited, costs)
    assert fresh.step_time == want[2] and fresh.peaks() == want[3]
    assert core.peaks() == want[3]  # memory depends on the order only: exact
    if pending:
        assert close(core.step_time, want[2], core)
    else:
        assert core.step_time == want[2]
        if tails:
            tails_are_fresh(core)
    assert (core._pending is not None) == pending  # asking did not re-time it


def tails_are_fresh(core: Compiled) -> None:
    """The tails kept up to date (updated backwards from what changed, or the marked ones
    run again) = tails built afresh, to the bit, on every step."""
    if core._tails is None:
        return
    core._tails.update()
    assert not core._tails.dirty
    fresh = Tails(core._producer, core._lag, core._duration, core._initial, core.first,
                  core.last)
    for r in range(len(core.orders)):
        for q in range(core.first[r], core.last[r] + 1):
            assert core._tails.tail(q) == fresh.tail(q)
            assert core._tails.reach(q) == fresh.reach(q)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(schedules_and_costs(), st.randoms(use_true_random=False))
def test_answers_from_the_tails_equal_a_full_run(case, rnd):
    """Random sequences of neighbour swaps (many deadlock), swaps taken back, one action
    moved a few places, far swaps, and reads of the times, on random schedules (Overlap
    pairs, which fall back to the re-time, several chains, zero-time actions, comm > 0):
    after each, the core (answering from the tails where it can) = the kernel = a fresh
    core; the reference agrees at the start and at the end; a read re-times exactly."""
    schedule, costs = case
    core = Compiled(schedule, costs, tails_from=0)
    core.SMALL, core.BACKOFF = 0, 0  # incremental and lazy even on a small program
    assert same(core, outcome(schedule, costs, simulate_reference))
    undo = []  # how to take back each move, last first
    if core._window is not None:
        core._tails_ready()  # (built now: kept moves then update them)
    for _ in range(16):
        op = rnd.random()
        if op < 0.12 and not core.deadlocked:  # the last move kept, then further tries
            core.settle()
            check_now(core, costs, pending_ok=False, tails=rnd.random() < 0.5)
            continue
        if op < 0.3 and undo:  # take the last move back
            how, r, a, b = undo.pop()
            (core.swap if how == "swap" else core.move)(r, a, b)
        elif op < 0.65:  # a neighbour swap
            got = neighbours(core, rnd)
            if got is None:
                continue
            r, k = got
            core.swap(r, k, k + 1)
            undo.append(("swap", r, k, k + 1))
        elif op < 0.85:  # one action moved 1..4 places, or two far apart swapped
            r = rnd.randrange(len(core.orders))
            n = len(core.orders[r])
            if n < 2:
                continue
            k = rnd.randrange(n)
            to = min(n - 1, max(0, k + rnd.choice([-4, -3, -2, -1, 1, 2, 3, 4])))
            if to == k:
                continue
            new = list(core.orders[r])
            if rnd.random() < 0.7:
                new.insert(to, new.pop(k))
                if valid_on_rank(new, core.steps):
                    core.move(r, k, to)
                    undo.append(("move", r, to, k))
            else:
                new[k], new[to] = new[to], new[k]
                if valid_on_rank(new, core.steps):
                    core.swap(r, k, to)
                    undo.append(("swap", r, k, to))
        else:  # a read: the pending move is re-timed, every time exact
            assert same(core, outcome(replace(core.schedule()), costs, simulate))
            continue
        check_now(core, costs, tails=rnd.random() < 0.3)  # (else the seeds pile up)
    core.settle()
    check_now(core, costs, pending_ok=False)
    assert same(core, outcome(core.schedule(), costs, simulate_reference))


def test_neighbour_swaps_tried_and_taken_back_are_answered_from_the_tails():
    """ZB-H1 p=4 m=24 with comm (no slack to spare): 400 neighbour swaps, each tried and
    taken back, a fifth of them kept; deadlocks found without a re-time (a swap tried and
    taken back costs no re-time at all); each answer against the kernel."""
    s = get_schedule("zb-h1", 4, 24)
    costs = CostModel(f=1, b=2.5, w=0.75, comm=0.3)
    core = Compiled(s, costs, tails_from=0)
    core.SMALL = 0
    rnd = random.Random(3)
    deadlocks = 0
    for _ in range(400):
        r, k = neighbours(core, rnd)
        step = core.swap(r, k, k + 1)
        before = core.counts["re-timed"]  # (the swap re-times a kept one before it)
        try:
            want = simulate(core.schedule(), costs).step_time
        except Deadlock:
            want = float("inf")
        assert close(step, want, core)
        deadlocks += step == float("inf") and core._pending is not None  # found lazily
        if step == float("inf") or rnd.random() < 0.8:
            lazy = core._pending is not None
            core.swap(r, k, k + 1)
            if lazy:  # tried and taken back: nothing was re-timed
                assert core.counts["re-timed"] == before
    assert deadlocks >= 3
    assert core.counts["lazy"] > 300 and core.counts["cancelled"] > 200
    assert core.counts["tails deferred"] > 50  # (answered before the tails' update: later
    # than every step whose tails' inputs a kept move changed)
    tails_are_fresh(core)
    assert core.settle() == simulate(core.schedule(), costs).step_time


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zbv", "interleaved-1f1b"])
def test_critical_steps_are_those_that_lengthen_the_step(name):
    costs = CostModel(f=1, b=2, w=1, comm=0.5)  # every time a multiple of a half
    core = Compiled(get_schedule(name, 3, 6), costs)
    step = core.step_time
    got = set(core.critical())
    want = set()
    for r, order in enumerate(core.orders):
        for k in range(len(order)):
            q = core.first[r] + k
            dur = list(core._duration)
            dur[q] += 0.25
            end = run(Program(core._producer, core._lag, dur, core._initial, core.first,
                              core.last, None, 0))
            longer = max(end[x] for x in core.last) - step
            assert longer in (0.0, 0.25)  # (slack is a multiple of a half: all or nothing)
            if longer:
                want.add((r, k))
    assert got == want and got


@pytest.mark.parametrize("sideways", [False, True])
@pytest.mark.parametrize("name,placement", [("gpipe", "loop"), ("zb-h1", "loop"),
                                            ("zbv", "v")])
def test_local_search_is_never_slower_and_fits(name, placement, sideways):
    """Unequal stages, comm > 0, a memory limit: the result is valid, within the limit,
    timed as the simulator times it, and not slower than the start."""
    s = get_schedule(name, 4, 8)
    costs = CostModel(f=[1.0, 1.4, 0.9, 1.2] * (2 if placement == "v" else 1), b=2.1,
                      w=0.8, comm=0.3)
    limit = max(schedule_peaks(s, costs))
    out = local_search(s, costs, limit, tries=400, sideways=sideways)
    validate(out.schedule)
    assert out.step_time == simulate(out.schedule, costs).step_time
    assert out.step_time <= out.start_time == simulate(s, costs).step_time
    assert max(schedule_peaks(out.schedule, costs)) <= limit * (1 + 1e-9)
    assert out.tried <= 400 + 2 * 4  # (the budget is checked once per critical action)
    assert (out.kept > 0) == (out.step_time < out.start_time)
    assert out.sideways == 0 or sideways


def test_local_search_shortens_gpipe_with_unequal_stages():
    """GPipe p=4 m=6 with unequal stages: moving critical backwards earlier helps."""
    costs = CostModel(f=[1.0, 1.4, 0.9, 1.2], b=2.0, w=1.0, comm=0.2)
    s = get_schedule("gpipe", 4, 6)
    out = local_search(s, costs)
    assert out.step_time < out.start_time
    assert simulate(out.schedule, costs).step_time == out.step_time


def test_local_search_rejects_bad_knobs():
    s = get_schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match="window=0: must be 1..15"):
        local_search(s, window=0)
    with pytest.raises(ValueError, match="tries=-1: must be >= 0"):
        local_search(s, tries=-1)


@pytest.mark.parametrize("name", ["zb-h1", "zbv", "interleaved-1f1b"])
def test_local_search_decides_the_same_from_the_tails(name, monkeypatch):
    """The search on the incremental path (moves answered from the tails, kept ones
    re-timed forwards and backwards where they change, re-times taken back) finds the
    same orders as re-timing every move with the kernel's loop."""
    s = get_schedule(name, 4, 8, 2 if name == "interleaved-1f1b" else None)
    costs = CostModel(f=[1.0, 1.4, 0.9, 1.2, 1.1, 0.7, 1.3, 1.0][:s.num_stages], b=2.1,
                      w=0.8, comm=0.3)
    plain = local_search(s, costs, tries=600)
    monkeypatch.setattr(Compiled, "TAILS_FROM", 0)
    monkeypatch.setattr(Compiled, "SMALL", 0)
    fast = local_search(s, costs, tries=600)
    assert fast.counts["lazy"] > 0 and fast.counts["restored"] > 0
    assert fast.kept > 0 or name == "interleaved-1f1b"  # (kept moves re-timed, then tried)
    assert [o for o in fast.schedule.orders] == [o for o in plain.schedule.orders]
    assert fast.step_time == plain.step_time == simulate(fast.schedule, costs).step_time
