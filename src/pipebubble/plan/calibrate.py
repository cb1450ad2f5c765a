"""Derive a CostModel from a measured Timeline, so the simulator can predict the same run.

Per stage: F = median forward time; B = median full-backward time, or median I + median W
when the backward was split; W = median W (0 when never split). Comm is the median gap
between a producer's end and its consumer's start across ranks, when asked for.

>>> from pipebubble import CostModel, get_schedule, simulate
>>> tl = simulate(get_schedule("1f1b", 2, 4), CostModel(f=[1, 2], b=[2, 4], w=[1, 1]))
>>> costs_from_timeline(tl).f
[1.0, 2.0]
"""

from __future__ import annotations

from statistics import median

from ..costs import CostModel
from ..timeline import Timeline


def stage_times(timeline: Timeline) -> dict[str, list[float | None]]:
    """Median duration per (kind, stage); None where the stage never ran that kind."""
    buckets: dict[tuple[str, int], list[float]] = {}
    for e in timeline.events():
        buckets.setdefault((e.kind, e.stage), []).append(e.end - e.start)
    return {
        k: [median(buckets[k, s]) if (k, s) in buckets else None
            for s in range(timeline.num_stages)]
        for k in "FIWB"
    }


def costs_from_timeline(timeline: Timeline, comm: float = 0.0, **memory: object) -> CostModel:
    """A per-stage CostModel that reproduces ``timeline``'s action durations."""
    t = stage_times(timeline)
    f, b, w = [], [], []
    for s in range(timeline.num_stages):
        f.append(t["F"][s] or 0.0)
        if t["I"][s] is not None:
            w_s = t["W"][s] or 0.0
            b.append(t["I"][s] + w_s)
            w.append(w_s)
        else:
            b.append(t["B"][s] or 0.0)
            w.append(min(b[-1], t["W"][s] or 0.0))
    return CostModel(f=f, b=b, w=w, comm=comm, **memory)  # type: ignore[arg-type]
