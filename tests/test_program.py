"""The evaluation core (``sim/program.py``) and the one rule's precedences (``ir/deps.py``).

The compiled program, re-timed incrementally after random edits, must say exactly what the
reference simulator and the kernel say of the edited schedule: every step's start and end,
the step time, each rank's peak, and a deadlock where they find one. A move answered from
the tails (``sim/critical.py``, still pending) must give the step time to within the
documented rounding (:func:`~pipebubble.sim.critical.tolerance`, twice), a deadlock exactly,
the peaks exactly, and once re-timed, every time exactly."""

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
from pipebubble.sim.critical import Tails, tolerance
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
        assert close(step, want, core)  # (answered from the tails: to within rounding)
        assert core.settle() == want  # re-timed: exactly
        if step == float("inf"):
            deadlocks += 1
            core.reorder(before)
    assert 10 < deadlocks < 290
    core.reorder(dict(enumerate(start)))
    assert core.step_time == simulate(s, costs).step_time


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


def test_local_search_decides_the_same_with_and_without_answers_from_the_tails(monkeypatch):
    """The local search reads the step time first and the sum of ends only when the step
    does not decide; a move answered from the tails and refused is taken back at no cost.
    Its decisions (the orders, the scores) are those of re-timing every move, and most
    tried moves get no re-time."""
    from pipebubble.ir.schedule import Action, loop_placement
    from pipebubble.schedules.auto.greedy import Knobs, greedy_order
    from pipebubble.schedules.auto.improve import anneal, improve

    p, m = 4, 6
    where = loop_placement(p, p)
    sc = CostModel(f=[1.0, 1.3, 0.8, 1.1], b=2.2, w=0.9, comm=0.3,
                   activation_memory=1.0).resolve(p, 1)
    limits = [4.0] * p
    start = [[Action(*a) for a in o]
             for o in greedy_order(p, m, sc, where, limits, Knobs("memory", True, False))[0]]
    made = []
    real = Compiled.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Compiled, "__init__", spy)
    runs = {}
    for tails_from in (10 ** 9, 0):
        monkeypatch.setattr(Compiled, "TAILS_FROM", tails_from)
        made.clear()
        runs[tails_from] = (anneal(start, sc, where, m, limits, budget=400, seed=5,
                                   columns=0.2),
                            improve(start, sc, where, m, limits, budget=300))
        counts = [c.counts for c in made]
    assert runs[0] == runs[10 ** 9]
    assert sum(c["cancelled"] for c in counts) > sum(c["re-timed"] for c in counts) / 4
