"""What the tests of ``auto`` share: peaks, the registered rivals of a placement and the
cost models of the grid."""

from pipebubble import CostModel, ScheduleError, get_schedule, simulate
from pipebubble.schedules import lookup, schedule_names


def peaks(timeline):
    return [r.peak_memory for r in timeline.rank_stats()]


def same_placement_rivals(p, m, costs):
    """Registered schedules auto searches among: loop with 1 chunk, or V with 2."""
    for name in schedule_names(searched=False):
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
