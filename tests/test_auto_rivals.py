"""``auto`` is never slower than a registered schedule of its placements that fits the same
limit with the same costs (a grid of costs, limits, p and m; unequal stages). Its own file,
so that pytest-xdist runs it beside ``test_auto.py``."""

import pytest

from auto_cases import COSTS, peaks, same_placement_rivals
from pipebubble import CostModel, ScheduleError, auto_schedule, simulate, validate

pytestmark = pytest.mark.slow  # long searches and fits: `make test-heavy`


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("p,m", [(2, 3), (3, 6), (4, 8)])
def test_never_slower_than_a_registered_schedule_that_fits(costs, p, m):
    rivals = list(same_placement_rivals(p, m, costs))
    # A sixth of the default budget and no MIP windows: the rivals are scored before any
    # budget is spent, so the claim holds for every budget, and the windows only ever
    # replace an order with a faster one that fits (test_auto_optimal.py runs both).
    for limit in (1, 1.5, 2, p / 2 + 1, p, 2 * p):
        auto = auto_schedule(p, m, costs, memory_limit=limit, mip_windows=False,
                             search_seconds=0.1)
        validate(auto)
        t = simulate(auto, costs)
        assert max(peaks(t)) <= limit + 1e-9
        assert t.step_time == pytest.approx(auto.options["auto"]["step_time"])
        assert auto.options["auto"]["lower_bound"] <= t.step_time + 1e-9
        for name, rival in rivals:
            if max(peaks(rival)) <= limit + 1e-9:
                assert t.step_time <= rival.step_time + 1e-9, (name, limit)


@pytest.mark.parametrize("placement,stages", [("loop", 3), ("v", 6)])
def test_unequal_stages_per_placement(placement, stages):
    f = [1.0, 1.5, 0.5, 1.2, 0.8, 1.0][:stages]
    costs = CostModel(f=f, b=[2 * x + 0.3 for x in f], w=[0.9 * x for x in f], comm=0.1)
    for limit in (None, 2, 3):
        auto = auto_schedule(3, 6, costs, memory_limit=limit, placement=placement,
                             mip_windows=False, search_seconds=0.1)  # as above
        t = simulate(auto, costs)
        assert auto.placement == placement
        for name, rival in same_placement_rivals(3, 6, costs):
            if limit is None or max(peaks(rival)) <= limit:
                assert t.step_time <= rival.step_time + 1e-9, name
    with pytest.raises(ScheduleError, match="values; expected 1 or 6"):
        auto_schedule(3, 6, CostModel(f=[1.0] * 3), placement="v")
