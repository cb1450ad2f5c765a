"""Looped BFS (breadth-first pipeline parallelism, Lamy-Poirier 2022).

Like interleaved 1F1B, each rank holds ``v`` chunks in the ``loop`` placement, but it runs
*breadth first*: all m microbatches through its first chunk, then all through its second,
..., then the backwards chunk by chunk in reverse, the microbatches in reverse (the last one
forwarded is the first whose gradient can come back). With m >= p the bubble is the same
as interleaved 1F1B, (p - 1)(F + B)/v, but like GPipe every rank holds the activations of
all m microbatches (m rank-shares on rank 0) before the first backward frees one. It suits
large m with sharded weights (fewer weight gathers), not tight memory.

Rank 1 of p=2, v=2, m=2 (stages 1 and 3)::

    1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0
"""

from __future__ import annotations

from ..ir.orders import RankOrder
from ..ir.schedule import Schedule, ScheduleError, make_schedule
from ..sim.formulas import interleaved_closed_form
from .registry import ScheduleSpec, register


def looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    if chunks < 2:
        raise ScheduleError(
            f"looped-bfs needs chunks >= 2 (with 1 chunk it is gpipe), got {chunks}"
        )
    import numpy as np

    p, m, v = ranks, microbatches, chunks
    orders = []
    for r in range(p):
        stages = np.repeat(np.arange(v) * p + r, m)  # each chunk's stage, m times
        mbs = np.tile(np.arange(m), v)
        orders.append(RankOrder.build(np.concatenate([stages, stages[::-1]]),
                                      "F" * (m * v) + "B" * (m * v),
                                      np.concatenate([mbs, mbs[::-1]])))
    return make_schedule("looped-bfs", orders, p * v, m)


register(
    ScheduleSpec(
        "looped-bfs",
        looped_bfs,
        "v chunks per rank, breadth first: bubble / v like interleaved, memory m like GPipe "
        "(Lamy-Poirier 2022)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=False,
        aliases=("loopedbfs", "bfs", "breadth-first"),
        closed_form=interleaved_closed_form,
        formula="bubble (p−1)(F+B)/v: fraction (p−1)/(v·m+p−1)",
        torch_class="ScheduleLoopedBFS",
    )
)
