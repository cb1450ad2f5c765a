"""The critical steps of the evaluation core and the local search over large orders.

``Compiled.critical()`` must name exactly the steps on a longest path: checked by brute
force (lengthen one step by a quarter, the step time grows by that quarter iff the step
is critical, when every slack is a multiple of a half). ``auto/large.local_search`` must
never give a slower or an over-the-limit order, and its step time must be the simulator's.
"""

from __future__ import annotations

import pytest

from pipebubble import CostModel, get_schedule
from pipebubble.ir.schedule import validate
from pipebubble.schedules.auto.large import local_search
from pipebubble.sim import simulate
from pipebubble.sim.kernel import Program, run
from pipebubble.sim.program import Compiled, schedule_peaks


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
