"""What the tests of ``auto`` share: peaks, the registered rivals of a placement, the cost
models of the grid, and auto without its MIP windows."""

import contextlib

from pipebubble import CostModel, ScheduleError, get_schedule, simulate
from pipebubble.schedules import lookup, schedule_names


def peaks(timeline):
    return [r.peak_memory for r in timeline.rank_stats()]


@contextlib.contextmanager
def local_search_only():
    """auto without its MIP windows, for properties they cannot change: they only ever
    replace an order with a faster one that fits (``test_auto_optimal.py`` tests them), and
    they cost most of auto's time on small instances."""
    import pipebubble.schedules.auto as auto_module

    saved = auto_module.POLISH_UP_TO
    auto_module.POLISH_UP_TO = 0
    try:
        yield
    finally:
        auto_module.POLISH_UP_TO = saved


def same_placement_rivals(p, m, costs):
    """Registered schedules auto searches among: loop with 1 chunk, or V with 2."""
    for name in schedule_names():
        spec = lookup(name)
        if spec.chunks not in (1, 2):
            continue
        try:
            s = get_schedule(name, p, m)
            t = simulate(s, costs)
        except ScheduleError:
            continue
        if s.chains == 1 and (s.placement == "v" or (s.placement == "loop" and s.chunks == 1)):
            yield name, t


COSTS = [
    CostModel(f=1, b=2, w=1),
    CostModel(f=1, b=3, w=1, comm=0.2, activation_memory=1, weight_memory=0.5),
    CostModel(f=2, b=3, w=0.5, comm=0.05, activation_memory=1, weight_memory=1),
]
