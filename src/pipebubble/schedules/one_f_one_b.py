"""1F1B (PipeDream-Flush, Megatron-LM): warm up, then alternate one forward, one backward.

Rank r warms up with ``min(p - r - 1, m)`` forwards, then alternates F and B until its
forwards run out, then drains the remaining backwards. At most ``p - r`` microbatches are in
flight on rank r, so activation memory is bounded by the pipeline depth, not by m.
Same bubble as GPipe: (p - 1)/(m + p - 1).

Rank 1 of 2 with m = 3:  ``1F0 1B0 1F1 1B1 1F2 1B2``.
"""

from __future__ import annotations

from ..ir.orders import RankOrder, interleave
from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import gpipe_closed_form
from .registry import ScheduleSpec, register


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    import numpy as np

    m = microbatches
    orders = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, m)
        steady = np.arange(warmup, m)  # F of microbatch warmup + j, then B of j
        kinds = "F" * warmup + "FB" * (m - warmup) + "B" * warmup
        mbs = np.concatenate([np.arange(warmup), interleave(steady, steady - warmup),
                              np.arange(m - warmup, m)])
        orders.append(RankOrder.build(r, kinds, mbs))
    return make_schedule("1f1b", orders, ranks, microbatches)


register(
    ScheduleSpec(
        "1f1b",
        one_f_one_b,
        "warm-up forwards, then one forward one backward (PipeDream-Flush, Megatron-LM)",
        aliases=("one-f-one-b", "pipedream-flush"),
        closed_form=gpipe_closed_form,
        formula="bubble (p−1)(F+B): fraction (p−1)/(m+p−1)",
        torch_class="Schedule1F1B",
        megatron="1F1B",
        deepspeed="TrainSchedule",
        color="#EE7733",
        memory_sweep=5,
    )
)
