"""simulate()'s kept results (sim/kernel.py's _Kept) and schedule_peaks' gather: a repeat of
the same actions under the same costs gives the Timeline a fresh simulation gives, to the
byte; other costs, another order of the same sizes, a renamed copy and a deadlock are each
what the loop says of them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.schedules import get_schedule, schedule_names
from pipebubble.sim import kernel
from pipebubble.sim.kernel import Deadlock, simulate
from pipebubble.sim.program import schedule_peaks
from strategies import random_valid_schedule

COLUMNS = ("start", "end", "rank", "stage", "microbatch", "mem_start", "mem_end",
           "overlapped")


def same(a, b) -> bool:
    """Two Timelines with the same columns, byte for byte, and the same fields."""
    for name in COLUMNS:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        if x.dtype != y.dtype or x.tobytes() != y.tobytes():
            return False
    for name in ("a2a_hidden", "a2a_exposed"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and bytes(x) != bytes(y)):
            return False
    return (a.kind == b.kind and a.schedule == b.schedule and a.offsets == b.offsets
            and [r.peak_memory for r in a.rank_stats()]
            == [r.peak_memory for r in b.rank_stats()])


def fresh(schedule, costs):
    """The simulation with nothing kept (the loop, or the scan where it answers)."""
    kernel.KEPT.cache_clear()
    try:
        return simulate(schedule, costs)
    finally:
        kernel.KEPT.cache_clear()


@pytest.fixture
def keep_all(monkeypatch):
    """Keep every simulation, however small."""
    monkeypatch.setattr(kernel, "KEEP_FROM", 0)
    kernel.KEPT.cache_clear()
    yield kernel.KEPT
    kernel.KEPT.cache_clear()


# off-grid costs (0.1, 0.3, ...: sums that round) and lags, as the planner's
OFF_GRID = st.builds(lambda f, b, w, comm, overlap: CostModel(f=f, b=b, w=b * w, comm=comm,
                                                               overlap=overlap),
                     st.sampled_from([0.1, 1.0, 0.3]), st.sampled_from([0.2, 2.0, 0.7]),
                     st.sampled_from([0.1, 0.5, 0.35]), st.sampled_from([0.0, 0.05, 1.0]),
                     st.sampled_from([1.0, 0.75]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(1, 3), st.integers(1, 5),
       st.booleans(), st.sampled_from(["loop", "random"]), st.sampled_from([0.0, 0.5]),
       OFF_GRID)
def test_a_repeat_is_the_fresh_timeline(seed, ranks, chunks, m, split, placement, overlap,
                                        costs):
    monkey = kernel.KEEP_FROM
    kernel.KEEP_FROM = 0
    try:
        schedule = random_valid_schedule(seed, ranks, chunks, m, split, placement, 1, overlap)
        want = fresh(schedule, costs)
        first = simulate(schedule, costs)
        hits = kernel.KEPT.hits
        again = simulate(schedule, costs)
        assert kernel.KEPT.hits == hits + 1
        copy = make_schedule("copy", schedule.orders, schedule.num_stages,
                             schedule.num_microbatches, placement=list(schedule.stage_to_rank))
        renamed = simulate(copy, costs)  # a new object, the same actions: kept too
        assert kernel.KEPT.hits == hits + 2
        assert same(first, want) and same(again, want)
        assert renamed.schedule == "copy" and same(renamed, fresh(copy, costs))
    finally:
        kernel.KEEP_FROM = monkey
        kernel.KEPT.cache_clear()


def test_other_costs_or_order_are_simulated_anew(keep_all):
    """gpipe and 1f1b hold the same sizes, placement and counts per rank: only the action
    columns tell them apart. Costs that differ in one bit (or only in the sign of a zero)
    are other costs."""
    gpipe, f1b = get_schedule("gpipe", 4, 8), get_schedule("1f1b", 4, 8)
    costs = CostModel(f=0.1, b=0.2, w=0.1, comm=0.05)
    simulate(gpipe, costs)
    assert same(simulate(f1b, costs), fresh(f1b, costs))
    assert keep_all.hits == 0
    nudged = CostModel(f=np.nextafter(0.1, 1.0), b=0.2, w=0.1, comm=0.05)
    simulate(f1b, costs)
    assert same(simulate(f1b, nudged), fresh(f1b, nudged))
    assert kernel.KEPT.key(f1b, kernel.flat_actions(f1b), CostModel(comm=0.0).resolve(4)) != \
        kernel.KEPT.key(f1b, kernel.flat_actions(f1b), CostModel(comm=-0.0).resolve(4))


@pytest.mark.parametrize("name", sorted(schedule_names()))
def test_every_family_repeats_exactly(name, keep_all):
    """Every registered family, lagged and off-grid (V placements' lags differ per step),
    twice: the second time kept, the same Timeline."""
    try:
        schedule = get_schedule(name, 4, 8)
    except Exception:  # a family that needs other sizes
        pytest.skip(f"{name} has no 4-rank, 8-microbatch schedule")
    costs = CostModel(f=0.1, b=0.3, w=0.1, comm=0.07)
    want = fresh(schedule, costs)
    assert same(simulate(schedule, costs), want)
    hits = keep_all.hits
    assert same(simulate(schedule, costs), want)
    assert keep_all.hits == hits + 1


def test_a_deadlock_is_named_every_time(keep_all):
    """A deadlock is never kept: each call names the stuck actions."""
    orders = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    s = make_schedule("bad", [[Action.from_str(a) for a in o] for o in orders], 2, 2)
    for _ in range(2):
        with pytest.raises(Deadlock, match="rank 0 stuck at .*rank 1 stuck at"):
            simulate(s, CostModel(f=0.1, b=0.2, w=0.1, comm=0.05))
    assert keep_all.hits == 0


def test_the_kept_stay_within_their_bound(monkeypatch, keep_all):
    monkeypatch.setattr(kernel, "KEEP_ACTIONS", 100)
    for m in (4, 8, 12):  # 4 ranks x 2m actions each: 32, 64, 96
        simulate(get_schedule("1f1b", 4, m), CostModel(comm=0.1))
    assert keep_all.info()["actions"] <= 100


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev",
                                  "v-min", "v-half"])
def test_schedule_peaks_are_the_timelines(name):
    """Off-grid memory costs per stage (sums that round): each rank's peak is the
    simulated Timeline's, the same double."""
    schedule = get_schedule(name, 4, 8)
    S = schedule.num_stages
    costs = CostModel(activation_memory=[0.1 + 0.013 * s for s in range(S)],
                      input_memory=[0.07 * (s % 3) for s in range(S)], f=0.1, b=0.2, w=0.1)
    timeline = simulate(schedule, costs)
    assert schedule_peaks(schedule, costs) == [r.peak_memory for r in timeline.rank_stats()]
