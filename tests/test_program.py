"""The evaluation core (``sim/program.py``) and the one rule's precedences (``ir/deps.py``).

The compiled program, re-timed incrementally after random edits, must say exactly what the
reference simulator and the kernel say of the edited schedule: every step's start and end,
the step time, each rank's peak, and a deadlock where they find one. (The answers from the
tails, in ``bench/large_search/``, are tested in ``tests/test_large_search.py``.)"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule
from pipebubble.costs import fits_limit
from pipebubble.ir.deps import precedences
from pipebubble.ir.schedule import Action, Overlap, step_actions
from pipebubble.sim import Deadlock, simulate, simulate_reference
from pipebubble.sim.program import Compiled, schedule_peaks
from strategies import random_valid_schedule, schedules_and_costs

_BEFORE = {"B": "F", "I": "F", "W": "I"}


def valid_on_rank(order, steps) -> bool:
    """validate()'s rank-local rule: each B/I after its F, each W after its I, when both
    sit on this rank (a pair's two parts count as placed together)."""
    own = {a for i in order for a in step_actions(steps[i])}
    placed = set()
    for i in order:
        here = step_actions(steps[i])
        for a in here:
            need = _BEFORE.get(a.kind)
            if need and Action(a.stage, need, a.microbatch) in own \
                    and Action(a.stage, need, a.microbatch) not in placed | set(here):
                return False
        placed.update(here)
    return True


def random_edit(core: Compiled, rnd: random.Random) -> dict[int, list[int]] | None:
    """A move or a swap of steps on one or two ranks, keeping each rank's order valid."""
    changes = {}
    for _ in range(rnd.choice([1, 1, 2])):
        r = rnd.randrange(len(core.orders))
        order = list(changes.get(r, core.orders[r]))
        if len(order) < 2:
            continue
        for _ in range(10):
            new = list(order)
            k, k2 = rnd.sample(range(len(new)), 2)
            if rnd.random() < 0.5:
                new.insert(k2, new.pop(k))
            else:
                new[k], new[k2] = new[k2], new[k]
            if valid_on_rank(new, core.steps):
                changes[r] = new
                break
    return changes or None


def outcome(schedule, costs, simulator):
    """(step starts and ends per rank, in order; step time; peaks), or the stuck actions."""
    try:
        t = simulator(schedule, costs)
    except Deadlock as exc:
        return ("deadlock", exc.stuck)
    return ("ok", [(e.rank, e.start, e.end) for e in t.events()], t.step_time,
            [s.peak_memory for s in t.rank_stats()])


def core_outcome(core: Compiled):
    if core.deadlocked:
        return "deadlock"
    rows = []
    for r, order in enumerate(core.orders):
        for i in order:
            step = core.steps[i]
            if isinstance(step, Overlap):  # its parts back to back: the timeline's two events
                a, b = step_actions(step)
                back = core.costs.pair_parts(a.stage, b.stage, b.kind)[1]
                mid = core.end_of(i) - back.duration
                rows += [(r, core.start_of(i), mid), (r, mid, core.end_of(i))]
            else:
                rows.append((r, core.start_of(i), core.end_of(i)))
    return ("ok", rows, core.step_time, core.peaks())


def same(core, want) -> bool:
    got = core_outcome(core)
    if want[0] == "deadlock":
        return got == "deadlock" and core.step_time == float("inf")
    if got == "deadlock":
        return False
    # pairs: the core keeps the pair's end; its middle is rebuilt here (one rounding)
    return (got[2] == want[2] and got[3] == want[3] and len(got[1]) == len(want[1])
            and all(g[0] == w[0] and g[2] == pytest.approx(w[2], abs=1e-9)
                    and g[1] == pytest.approx(w[1], abs=1e-9)
                    for g, w in zip(got[1], want[1], strict=True)))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(schedules_and_costs(), st.randoms(use_true_random=False))
def test_incremental_equals_the_reference_and_the_kernel(case, rnd):
    """After each of a few random edits (moves and swaps, on one rank or two at once), the
    core re-timed incrementally = the kernel = the reference simulator on the edited
    schedule, deadlocks included; Overlap pairs, several chains, zero-time actions too."""
    schedule, costs = case
    core, eager = Compiled(schedule, costs), Compiled(schedule, costs)
    core.SMALL = eager.SMALL = 0  # incremental even on a small program
    eager.FAR, eager.FLOOR = 0.0, 2  # hands over to the kernel's loop from the change on
    want = outcome(schedule, costs, simulate_reference)
    assert same(core, want)
    for _ in range(6):
        was = want  # (the outcome of the orders before the edit)
        edit = random_edit(core, rnd)
        if edit is None:
            break
        before = {r: list(core.orders[r]) for r in edit}
        restored = core.counts["restored"]
        core.reorder(edit)
        eager.reorder(edit)
        retimed = core.counts["restored"] == restored  # (not itself the way back)
        edited = core.schedule()
        want = outcome(edited, costs, simulate_reference)
        kernel = outcome(replace(edited), costs, simulate)
        assert (want[0] == "deadlock") == (kernel[0] == "deadlock")
        if want[0] == "ok":
            assert kernel[2] == want[2]
        assert same(core, want) and same(eager, want)
        moved = any(core.orders[r] != before[r] for r in before)
        if moved and retimed and rnd.random() < 0.4:  # taken back: the times put back
            restored = core.counts["restored"], eager.counts["restored"]
            core.reorder(before)
            eager.reorder(before)
            assert core.counts["restored"] == restored[0] + 1
            assert eager.counts["restored"] == restored[1] + 1
            want = was
            assert same(core, want) and same(eager, want)


def test_edits_on_a_big_order_match_a_fresh_simulation():
    """ZB-H1 p=4 m=24 with comm: 300 random moves and swaps (many create deadlocks, which
    the core must find without a full run), each re-timed incrementally, each checked
    against the kernel on the edited schedule; then back to the start order."""
    s = get_schedule("zb-h1", 4, 24)
    costs = CostModel(f=1, b=2.5, w=0.75, comm=0.3)
    core = Compiled(s, costs)
    core.SMALL = 0  # incremental even on a small program
    start = [list(o) for o in core.orders]
    rnd = random.Random(7)
    deadlocks = 0
    for _ in range(300):
        edit = random_edit(core, rnd)
        if edit is None:
            continue
        before = {r: list(core.orders[r]) for r in edit}
        step = core.reorder(edit)
        try:
            want = simulate(core.schedule(), costs).step_time
        except Deadlock:
            want = float("inf")
        assert step == want  # re-timed incrementally: exactly
        if step == float("inf"):
            deadlocks += 1
            core.reorder(before)
    assert 10 < deadlocks < 290
    core.reorder(dict(enumerate(start)))
    assert core.step_time == simulate(s, costs).step_time


def test_peaks_and_one_tolerance():
    """1F1B p=4 m=8: rank r holds p - r activations (M_B = 1); fits(limit) with the one
    tolerance of costs.fits_limit, a hair above is still in, 1 % above is not."""
    s = get_schedule("1f1b", 4, 8)
    core = Compiled(s, CostModel())
    assert core.peaks() == [4.0, 3.0, 2.0, 1.0] == schedule_peaks(s, CostModel())
    assert core.fits([4, 3, 2, 1]) and core.fits(4) and not core.fits([3.96, 3, 2, 1])
    assert fits_limit(4 + 1e-12, 4) and not fits_limit(4.04, 4)
    assert fits_limit(8e10 * (1 + 1e-12), 8e10)  # relative: bytes as well as M_B units


def test_precedences_are_exactly_the_simulators_constraints():
    """On every registered family (DualPipe's pairs and two chains included): each step
    starts at the latest of its rank's previous end and, over the precedences into it,
    the source's end (+ comm when it crosses); nothing else holds it back."""
    costs = CostModel(f=1, b=2.5, w=1, comm=0.5, overlap=0.8)
    for name in ("1f1b", "zb-h2", "zbv", "dualpipe", "dualpipev", "interleaved-1f1b"):
        s = get_schedule(name, 4, 8)
        t = simulate(s, costs)
        end = {(e.stage, e.kind, e.microbatch): e.end for e in t.events()}
        start = {(e.stage, e.kind, e.microbatch): e.start for e in t.events()}
        edges = precedences((st for o in s.orders for st in o), s)
        into: dict = {}
        for e in edges:
            into.setdefault(tuple(e.after), []).append(
                end[tuple(e.before)] + (costs.comm if e.crosses else 0.0))
        for order in s.orders:
            free = 0.0
            for step in order:
                first = step_actions(step)[0]
                assert start[tuple(first)] == pytest.approx(
                    max([free, *into.get(tuple(first), [])])), (name, step)
                free = end[tuple(step_actions(step)[-1])]


def test_precedences_of_a_pair_wait_for_its_end():
    """An Overlap's forward output is ready when the pair ends: the edge to the next stage's
    forward leaves from the pair's backward part; what the pair needs goes to its start."""
    s = random_valid_schedule(3, 2, 2, 3, split=False, placement="loop", overlap=1.0)
    pairs = [st for o in s.orders for st in o if isinstance(st, Overlap)]
    assert pairs
    edges = precedences((st for o in s.orders for st in o), s)
    parts = {a for p in pairs for a in p}
    assert not any(e.before in {p.forward for p in pairs} for e in edges)
    assert not any(e.after in {p.backward for p in pairs} for e in edges)
    assert any(e.after in parts for e in edges) and any(e.before in parts for e in edges)
