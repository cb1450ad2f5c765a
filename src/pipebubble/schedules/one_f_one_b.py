"""1F1B (PipeDream-Flush, Megatron-LM): warm up, then alternate one forward, one backward.

Rank r warms up with ``min(p - r - 1, m)`` forwards, then alternates F and B until its
forwards run out, then drains the remaining backwards. At most ``p - r`` microbatches are in
flight on rank r, so activation memory is bounded by the pipeline depth, not by m.
Same bubble as GPipe: (p - 1)/(m + p - 1).

Rank 1 of 2 with m = 3:  ``1F0 1B0 1F1 1B1 1F2 1B2``.
"""

from __future__ import annotations

from ..ir.orders import CODE, RankOrder
from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import gpipe_closed_form
from .registry import ScheduleSpec, register


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Every rank's 2m actions written into one set of flat arrays (rank after rank), which
    the orders are views of (:meth:`~pipebubble.ir.orders.RankOrder.split`)."""
    import numpy as np

    m, n = microbatches, 2 * microbatches  # n: actions per rank
    stage = np.repeat(np.arange(ranks, dtype=np.int64), n)  # stage r on rank r
    kind = np.empty(ranks * n, dtype=np.int8)
    mb = np.empty(ranks * n, dtype=np.int64)
    for r in range(ranks):
        warmup = min(ranks - r - 1, m)
        k, b = kind[r * n:(r + 1) * n], mb[r * n:(r + 1) * n]
        k[:warmup], b[:warmup] = CODE["F"], np.arange(warmup)  # warm-up forwards
        # steady state: F of microbatch warmup + j, then B of j
        k[warmup:n - warmup:2], b[warmup:n - warmup:2] = CODE["F"], np.arange(warmup, m)
        k[warmup + 1:n - warmup:2], b[warmup + 1:n - warmup:2] = CODE["B"], np.arange(m - warmup)
        k[n - warmup:], b[n - warmup:] = CODE["B"], np.arange(m - warmup, m)  # drain
    orders = RankOrder.split(stage, kind, mb, list(range(0, ranks * n + 1, n)))
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
