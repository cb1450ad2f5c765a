"""sim/scan.py, the clock's ends by whole-rank scans, against the kernel's loop (the oracle):
the same doubles on random schedules and on every registered family, the loop wherever the
scan declines (off-grid costs, a comm lag that zigzags, a deadlock)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.check import flat_actions
from pipebubble.ir.deps import Layout
from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.schedules import get_schedule, schedule_names
from pipebubble.sim import kernel, scan
from pipebubble.sim.kernel import (
    Deadlock,
    _ints,
    _rule,
    compile_blocks,
    compile_program,
    run,
    simulate,
)
from strategies import random_valid_schedule

SETTLE = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipe",
          "dualpipev")  # the families the scan settles without comm (SWEEPS)
COLUMNS = ("start", "end", "rank", "stage", "kind", "microbatch", "mem_start", "mem_end")


def loop_and_scan(schedule, costs, blocks=False, **options):
    """The loop's ends and solve()'s (None where it declines) on the schedule's program (the
    three-step Program, or with ``blocks`` the Blocks), whatever its size."""
    sc = costs.resolve(schedule.num_stages, schedule.chunks)
    flat = flat_actions(schedule)
    if blocks:
        b = compile_blocks(schedule, flat, sc)
        want = np.array(kernel._run_blocks(b))
        columns = ([b.producer, b.producer2], [b.lag, b.lag2], [b.duration, b.duration2])
        prog = b
    else:
        prog = compile_program(schedule, flat, sc)
        want = np.array(run(prog))
        columns = ([prog.producer], [prog.lag], [prog.duration])
    got = np.array(prog.initial_end)
    initial = got.copy()
    producers = [_ints(x) for x in columns[0]]
    lags = [np.frombuffer(x, dtype=np.float64) for x in columns[1]]
    durations = [np.frombuffer(x, dtype=np.float64) for x in columns[2]]
    if scan.solve(producers, lags, durations, prog.first, prog.last, got, **options):
        return want, got
    assert np.array_equal(got, initial)  # declined: the loop's initial ends, untouched
    return want, None


@st.composite
def grid_cases(draw):
    """A random valid schedule (pairs and chains included) and costs on a grid of quarters
    (every sum exact: what the scan takes), positive, with or without a comm lag."""
    ranks, chunks = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    m, split = draw(st.integers(1, 6)), draw(st.booleans())
    placement = draw(st.sampled_from(["loop", "random"]))
    chains = min(chunks, draw(st.sampled_from([1, 1, 2, 3])))
    overlap = draw(st.sampled_from([0.0, 0.5]))
    schedule = random_valid_schedule(draw(st.integers(0, 2**31)), ranks, chunks, m, split,
                                     placement, chains, overlap)
    S = ranks * chunks
    quarters = st.integers(1, 20).map(lambda q: q / 4)
    f, b = (draw(st.lists(quarters, min_size=S, max_size=S)) for _ in range(2))
    w = [x / 2 for x in b]  # (I = B - W: a quarter's half, an eighth: still on a grid)
    costs = CostModel(f=f, b=[2 * x for x in b], w=w, comm=draw(st.sampled_from([0.0, 0.5, 1.0])),
                      overlap=draw(st.sampled_from([1.0, 0.75])))
    return schedule, costs


@settings(max_examples=120, deadline=None)
@given(grid_cases(), st.booleans())
def test_the_scan_gives_the_loops_doubles(case, blocks):
    """With enough sweeps and no giving up, every acyclic program settles, to the loop's
    ends exactly (the strategy's schedules never deadlock)."""
    schedule, costs = case
    if not blocks and any(flat_actions(schedule).pair):
        blocks = True  # (the three-step program's wait steps take no time: it declines)
    want, got = loop_and_scan(schedule, costs, blocks, sweeps=10**6, lagged=True)
    assert got is not None
    assert want.tobytes() == got.tobytes()


@settings(max_examples=60, deadline=None)
@given(grid_cases())
def test_with_its_default_limits_it_settles_or_declines(case):
    schedule, costs = case
    want, got = loop_and_scan(schedule, costs, blocks=True, lagged=True)
    assert got is None or want.tobytes() == got.tobytes()


def test_off_the_grid_or_no_time_it_declines():
    """Costs such as 0.1 (sums that round) or an action of no time: the loop's business."""
    s = get_schedule("1f1b", 4, 8)
    assert loop_and_scan(s, CostModel(f=1.0, b=2.0))[1] is not None
    assert loop_and_scan(s, CostModel(f=0.1, b=0.2, w=0.1))[1] is None
    assert loop_and_scan(s, CostModel(f=1.0, b=2.0, comm=0.1), lagged=True)[1] is None
    assert loop_and_scan(s, CostModel(f=1.0, b=2.0, comm=0.5))[1] is None  # a lag: declined
    assert loop_and_scan(s, CostModel(f=1.0, b=2.0, comm=0.5), sweeps=10**6,
                         lagged=True)[1] is not None
    assert loop_and_scan(s, CostModel(f=[1.0, 0.0, 1.0, 1.0], b=2.0))[1] is None
    assert loop_and_scan(s, CostModel(f=2.0**60, b=2.0))[1] is None  # sums past 2**53


@pytest.fixture
def spy(monkeypatch):
    """What each solve() the kernel tried answered."""
    answers = []
    real = scan.solve

    def solve(*args, **kwargs):
        answers.append(real(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(scan, "solve", solve)
    return answers


def timeline_columns(timeline):
    return {c: bytes(memoryview(getattr(timeline, c))) if c != "kind" else timeline.kind
            for c in COLUMNS}


def loop_only(schedule, costs, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(scan, "worth_trying", lambda steps, ranks: False)
        return simulate(schedule, costs)


@pytest.mark.parametrize("name", schedule_names(searched=False))
@pytest.mark.parametrize("comm", [0.0, 0.5])
def test_every_family_through_simulate(name, comm, spy, monkeypatch):
    """simulate() on each family at a size the scan takes: the loop's Timeline to the bit.
    Without comm the scan settles for the lock-step families; where ranks wait at every
    step (V-Half, V-Min) it gives up, and a comm lag it declines: the loop runs."""
    s = get_schedule(name, 8, 256)
    costs = CostModel(f=1.0, b=2.0, w=0.75, comm=comm)
    got = simulate(s, costs)
    assert spy and (spy[-1] or comm or name not in SETTLE)
    assert not comm or not any(spy)  # a comm lag: declined
    assert timeline_columns(got) == timeline_columns(loop_only(s, costs, monkeypatch))


@pytest.mark.parametrize("p,m", [(4, 512), (8, 256)])
def test_v_min_settles_within_the_default_sweeps(p, m, spy, monkeypatch):
    """V-Min with f = 1, b = 2, w = 1 settles in 7 sweeps (one more than the first cap of 6,
    which sent every V-Min program back to the loop after six wasted sweeps): the scan
    answers, and with the loop's Timeline."""
    s = get_schedule("v-min", p, m)
    costs = CostModel(f=1.0, b=2.0, w=1.0)
    want, got = loop_and_scan(s, costs, sweeps=scan.SWEEPS)
    assert got is not None and np.array_equal(want, got)
    assert loop_and_scan(s, costs, sweeps=6)[1] is None  # the sweeps it needs: 7
    tried = len(spy)
    got = simulate(s, costs)
    assert spy[tried:] == [True]  # simulate() asked the scan once, and it answered
    assert timeline_columns(got) == timeline_columns(loop_only(s, costs, monkeypatch))


def test_the_one_lag_and_the_lag_columns_agree(spy, monkeypatch):
    """1F1B's one lag, ZB-V's lag column (the V's turn: no comm), per stage costs."""
    for name in ("1f1b", "zbv", "dualpipev"):
        s = get_schedule(name, 4, 512)
        costs = CostModel(f=[1.0, 1.5, 0.5, 2.0] * (s.num_stages // 4), b=3.0, w=1.25, comm=0.0)
        sc = costs.resolve(s.num_stages, s.chunks)
        topo = Layout(s.num_stages, tuple(s.stage_to_rank), tuple(s.chain_starts))
        assert _rule(topo).uniform(sc.comm) == 0.0
        got = simulate(s, costs)
        assert spy[-1]
        assert timeline_columns(got) == timeline_columns(loop_only(s, costs, monkeypatch))


def test_a_deadlock_of_many_steps_is_the_loops_to_report(spy):
    """Rank 0 runs each microbatch's B before the next F, rank 1 the microbatches backwards:
    each waits for the other (a cycle of steps that take time, which never settles)."""
    m = 1100
    orders = [[f"0{k}{j}" for j in range(m) for k in "FB"],
              [f"1{k}{j}" for j in reversed(range(m)) for k in "FB"]]
    s = make_schedule("t", [[Action.from_str(a) for a in o] for o in orders], 2, m)
    with pytest.raises(Deadlock) as info:
        simulate(s)
    assert spy == [False]
    assert info.value.stuck == {0: ("0B0", "0F0 and 1I/B0"), 1: (f"1F{m - 1}", f"0F{m - 1}")}


@pytest.mark.parametrize("p", [4, 2049])  # (from 2,048 ranks the pairs are sorted, not tabled)
def test_which_ranks_wait_on_which(p):
    """1F1B: rank r's forwards wait for rank r-1, its backwards for rank r+1, so a change on
    rank r concerns r-1 and r+1."""
    s = get_schedule("1f1b", p, 1)
    sc = CostModel().resolve(s.num_stages, s.chunks)
    prog = compile_program(s, flat_actions(s), sc)
    ranges = [(lo, hi + 1) for lo, hi in zip(prog.first, prog.last, strict=True)]
    got = scan._waits_on([_ints(prog.producer).astype(np.intp)], ranges, len(prog.producer))
    assert got == [[r for r in (q - 1, q + 1) if 0 <= r < p] for q in range(p)]
