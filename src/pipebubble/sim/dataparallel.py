"""Pipeline x data parallel (2D) in the cost model: the gradient all-reduce after the step.

With ``D`` replicas of a ``P``-rank pipeline, each stage's gradients are all-reduced across
its ``D`` copies after the pipeline step (the runtime does it on the stage's rank, stage by
stage, once its last backward is done: ``CostModel.allreduce`` is that time per stage). So
rank r finishes at its last action plus the all-reduce time of the stages it holds, and the
2D step time is the latest rank:

    step_2d = max_r ( end_r + sum_{s on r} allreduce_s )

A ring all-reduce of ``n`` bytes over ``D`` ranks moves ``2 (D - 1) / D x n`` bytes through
each link in ``2 (D - 1)`` rounds (Patarasuk & Yuan 2009):

    t = 2 (D - 1) / D x n / bandwidth + 2 (D - 1) x latency

>>> round(ring_allreduce_time(1e9, 4, bandwidth=100e9, latency=5e-6), 6)  # 1 GB, 4 GPUs
0.01503
>>> ring_allreduce_time(1e9, 1, bandwidth=100e9)  # one replica: nothing to reduce
0.0
"""

from __future__ import annotations

from ..costs import CostModel, StageCosts
from ..errors import UserError
from ..timeline import Timeline


def ring_allreduce_time(nbytes: float, dp: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds to all-reduce ``nbytes`` over ``dp`` ranks with a ring (formula above)."""
    if dp < 1:
        raise UserError(f"dp must be >= 1, got {dp}")
    if bandwidth <= 0:
        raise UserError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    if dp == 1:
        return 0.0
    return 2 * (dp - 1) / dp * nbytes / bandwidth + 2 * (dp - 1) * latency


def rank_finish_times(timeline: Timeline, costs: CostModel | StageCosts, dp: int) -> list[float]:
    """When each rank is done, its stages' all-reduces included (none when ``dp`` is 1)."""
    sc = costs if isinstance(costs, StageCosts) else costs.resolve(
        timeline.num_stages, timeline.chunks
    )
    t0 = min(timeline.start, default=0.0)
    out = []
    for r in range(timeline.num_ranks):
        lo, hi = timeline.offsets[r], timeline.offsets[r + 1]
        end = max(timeline.end[lo:hi], default=t0) - t0
        if dp > 1:
            end += sum(sc.allreduce[s] for s in range(timeline.num_stages)
                       if timeline.stage_to_rank[s] == r)
        out.append(end)
    return out


def step_time_with_allreduce(timeline: Timeline, costs: CostModel | StageCosts, dp: int) -> float:
    """The 2D step time: ``max_r (end_r + sum of allreduce_s for the stages on r)``.

    >>> from pipebubble import get_schedule, simulate
    >>> c = CostModel(f=1, b=2, allreduce=[0.5, 3.0])
    >>> tl = simulate(get_schedule("1f1b", 2, 4), c)   # rank 0 ends at 15, rank 1 at 13
    >>> step_time_with_allreduce(tl, c, dp=2)          # max(15 + 0.5, 13 + 3)
    16.0
    """
    return max(rank_finish_times(timeline, costs, dp), default=0.0)


def dp_fields(timeline: Timeline, costs: CostModel, dp: int) -> dict:
    """What a 2D row adds: ``dp`` and ``step_time_with_allreduce``."""
    return {"dp": dp, "step_time_with_allreduce": step_time_with_allreduce(timeline, costs, dp)}
