"""What ``auto`` keeps between requests (the blocks of a p, the built block orders, the
stretched blocks) changes nothing it returns: the peak counted from a repeated block's
times is the simulator's, and a warm request gives the same order and charges the same
work as a cold one."""

import random

import pytest

from pipebubble import CostModel, auto_schedule
from pipebubble.ir.schedule import make_schedule
from pipebubble.schedules import auto
from pipebubble.schedules.auto import adaptive
from pipebubble.schedules.building_block import repeat
from pipebubble.sim.program import schedule_peaks


@pytest.mark.parametrize("p,m", [(2, 1), (3, 5), (4, 8), (5, 3)])
def test_repeat_peaks_is_the_peak_of_the_repeated_orders(p, m):
    rng = random.Random(p * 100 + m)
    S = 2 * p
    costs = CostModel(f=1, b=3, w=1, activation_memory=[rng.uniform(0.5, 2) for _ in range(S)],
                      weight_memory=[rng.uniform(0, 0.5) for _ in range(S)],
                      recompute=[rng.random() < 0.3 for _ in range(S)],
                      input_memory=[0.1] * S)
    sc = costs.resolve(S, 2)
    seen = 0
    for _name, offsets in auto._stretched_names(p):
        for period in (7, 8, 11):
            for times in auto._stretched_blocks(p, offsets, period):
                orders = repeat(p, m, times, period)
                want = schedule_peaks(make_schedule("x", orders, S, m, placement="v"), sc)
                assert auto._repeat_peaks(p, m, times, period, sc) == want
                seen += 1
    assert seen


def _cold() -> None:
    auto._REMEMBERED.clear()
    adaptive._KEPT.clear()
    adaptive._kept_actions = 0
    adaptive._group.cache_clear()
    auto._stretched_blocks.cache_clear()


@pytest.mark.parametrize("limit", [1.0, 2.5, 3.5])
def test_a_warm_request_gives_the_cold_order_and_charges_the_same(limit):
    costs = CostModel(f=1, b=2, w=1, comm=0.05, weight_memory=0.5)
    _cold()
    cold = auto_schedule(4, 8, costs, memory_limit=limit, placement="v", mip_windows=False,
                         search_seconds=0.05)
    auto._REMEMBERED.clear()  # the answer forgotten, what it built kept
    warm = auto_schedule(4, 8, costs, memory_limit=limit, placement="v", mip_windows=False,
                         search_seconds=0.05)
    assert warm.orders == cold.orders
    assert warm.options["auto"].work == cold.options["auto"].work
    assert [s.work for s in warm.options["auto"].stages] == [
        s.work for s in cold.options["auto"].stages]
