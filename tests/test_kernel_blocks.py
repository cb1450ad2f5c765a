"""The kernel's block program (one step per lone action or Overlap pair, what simulate()
runs on schedules with pairs and at least BLOCKS_FROM actions) against the three-step
Program (wait + forward + backward per pair, what the incremental core of sim/program.py
runs, and simulate() below BLOCKS_FROM): the same Timeline to the bit."""

from dataclasses import replace

import pytest
from hypothesis import given, settings

from pipebubble.costs import CostModel
from pipebubble.ir.check import flat_actions
from pipebubble.ir.deps import Layout
from pipebubble.ir.schedule import Overlap
from pipebubble.schedules import get_schedule
from pipebubble.sim.kernel import (
    BLOCKS_FROM,
    Deadlock,
    _rule,
    _simulate_blocks,
    _timeline,
    compile_blocks,
    compile_program,
    run,
    simulate,
)
from pipebubble.sim.reference import simulate_reference
from strategies import schedules_and_costs

COLUMNS = ("rank", "stage", "kind", "microbatch", "start", "end", "mem_start", "mem_end",
           "overlapped", "offsets")


def three_step(schedule, costs):
    """The Timeline from compile_program + run (None on a deadlock)."""
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    flat = flat_actions(schedule)
    program = compile_program(schedule, flat, sc)
    end = run(program)
    if any(end[last] == float("inf") for last in program.last):
        return None
    return _timeline(schedule, flat, sc, program, end)


def by_blocks(schedule, costs, uniform=True):
    """The Timeline by the block program, whatever the schedule's size (None: deadlock);
    with ``uniform``, by its loop for one lag where every dependency has the same."""
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    lag = uniform_lag(schedule, sc.comm) if uniform else None
    return _simulate_blocks(schedule, flat_actions(schedule), sc, lag)


def uniform_lag(schedule, comm):
    topo = Layout(schedule.num_stages, tuple(schedule.stage_to_rank),
                  tuple(schedule.chain_starts))
    return _rule(topo).uniform(comm)


def columns(timeline):
    return {c: list(getattr(timeline, c)) for c in COLUMNS}


@settings(max_examples=60, deadline=None)
@given(schedules_and_costs())
def test_blocks_equal_the_three_step_program(case):
    schedule, costs = case
    want = columns(three_step(schedule, costs))  # the strategy's schedules never deadlock
    assert columns(by_blocks(schedule, costs, uniform=False)) == want
    assert columns(by_blocks(schedule, costs)) == want


def test_one_lag_where_every_dependency_crosses_ranks_or_none_does():
    """The uniform lag: comm for 1F1B and DualPipe (neighbour stages on other ranks), None
    for ZB-V and DualPipeV (the V's turn: two stages of one rank), 0 on one rank or
    without comm."""
    lags = {name: uniform_lag(get_schedule(name, 4, 8), 0.5)
            for name in ("1f1b", "gpipe", "dualpipe", "zbv", "dualpipev")}
    assert lags == {"1f1b": 0.5, "gpipe": 0.5, "dualpipe": 0.5, "zbv": None,
                    "dualpipev": None}
    assert uniform_lag(get_schedule("zbv", 4, 8), 0.0) == 0.0
    assert uniform_lag(get_schedule("1f1b", 1, 8), 0.5) == 0.0


def test_one_step_per_block_on_dualpipe():
    """DualPipe p=4 m=8: each rank's steps are its blocks (a pair is one), plus one boundary
    per rank, the one after the last rank and ``never``; a pair's forward part takes
    overlap x F and ends where its backward part starts."""
    s = get_schedule("dualpipe", 4, 8)
    costs = CostModel(f=1, b=2, comm=0.25, overlap=0.75)
    sc = costs.resolve(s.num_stages, s.chunks)
    program = compile_blocks(s, flat_actions(s), sc)
    assert len(program.duration) == sum(len(o) for o in s.orders) + s.num_ranks + 2
    pairs = sum(isinstance(step, Overlap) for o in s.orders for step in o)
    assert pairs > 0 and s.num_actions() == sum(len(o) for o in s.orders) + pairs
    t = by_blocks(s, costs)
    assert columns(t) == columns(three_step(s, costs)) == columns(by_blocks(s, costs, False))
    seen = 0
    for i in range(len(t) - 1):
        if t.overlapped[i] and t.kind[i] == "F":  # a pair's forward part; its backward next
            assert t.end[i] == t.start[i + 1] and t.overlapped[i + 1]
            assert t.end[i] - t.start[i] == pytest.approx(0.75 * sc.f[t.stage[i]])
            seen += 1
    assert seen == pairs


def test_simulate_takes_the_block_program_on_a_large_schedule():
    """DualPipe p=4 m=64 (over BLOCKS_FROM actions): simulate() = the block program = the
    reference."""
    s = get_schedule("dualpipe", 4, 64)
    costs = CostModel(f=1.3, b=2.7, comm=0.37, overlap=0.71)
    assert s.num_actions() >= BLOCKS_FROM
    t = simulate(s, costs)
    assert columns(t) == columns(by_blocks(s, costs)) == columns(simulate_reference(s, costs))


def test_a_deadlock_with_pairs_is_named_as_by_the_reference():
    """DualPipe's two copies read as one chain: copy B's first stage waits for copy A's last.
    The block program sees the deadlock; simulate() names the stuck actions (the
    three-step program's way) as the reference does."""
    one_chain = replace(get_schedule("dualpipe", 4, 64), chain_starts=(0,))
    assert one_chain.num_actions() >= BLOCKS_FROM
    assert by_blocks(one_chain, CostModel()) is None
    assert by_blocks(one_chain, CostModel(), uniform=False) is None
    with pytest.raises(Deadlock) as fast:
        simulate(one_chain)
    with pytest.raises(Deadlock) as slow:
        simulate_reference(one_chain)
    assert fast.value.stuck == slow.value.stuck
