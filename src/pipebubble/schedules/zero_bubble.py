"""The handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", section 2).

The backward is split in two: ``I`` (gradient w.r.t. the stage input, which the previous
stage waits for) and ``W`` (gradient w.r.t. the weights, which nobody waits for). Running
I as soon as possible and delaying W moves the backward chain forward and lets the delayed
W fill what would have been bubble. Both schedules have one shape, with two knobs per rank
r: ``warmup`` forwards before the first I, and ``delay``, how many W a rank holds back::

    F x warmup, then for each microbatch j: [F next], I j, [W (j - delay)], then the last Ws

- **ZB-H1**: warmup p - r - 1 (as 1F1B), delay r. Same in-flight activations as 1F1B
  (p on rank 0), bubble (p - 1)(F + I - W): one third of 1F1B's when F = I = W.
- **ZB-H2**: warmup 2(p - r - 1), delay 2r. Rank 0 holds 2p - 1 microbatches; the extra
  warm-up forwards fill the start, the delayed Ws the end, and the bubble within each rank's
  span is (p - 1)(F + I - 2W) on rank 0 (less on later ranks), zero when F = I = W. Like the
  paper this counts each rank from its first F to its last W: the tail of rank 0 overlaps the
  start of the next step once the optimizer barrier is gone. With the barrier (our step time,
  from 0 to the last action anywhere) it is m(F + B) + (p - 1) max(F, F + I - 2W).

The formulas hold with m >= p (ZB-H1) or m >= 2p - 1 (ZB-H2), and W <= F, W <= I (ZB-H1) or
W <= F, 2W <= F + I (ZB-H2); ``formulas.zb_h1_closed_form`` returns None otherwise.

ZB-H1, p=2, m=2::

    rank 0: 0F0 0F1 0I0 0W0 0I1 0W1
    rank 1: 1F0 1I0 1F1 1I1 1W0 1W1
"""

from __future__ import annotations

from ..ir.orders import RankOrder
from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import zb_h1_closed_form, zb_h2_closed_form
from .registry import ScheduleSpec, register


def split_backward_orders(
    ranks: int, microbatches: int, warmup: list[int], delay: list[int]
) -> list[RankOrder]:
    """The ZB-H family: per rank ``warmup[r]`` forwards, then F/I pairs with each W held back
    ``delay[r]`` microbatches, then the held-back Ws. (Laid out by numpy: step j of the
    middle is F of microbatch w + j while forwards remain, I of j, W of j - delay once
    j >= delay.)"""
    import numpy as np

    m = microbatches
    j = np.arange(m, dtype=np.int64)
    kinds3 = np.array(["F", "I", "W"])
    orders = []
    for r in range(ranks):
        w0, d = min(warmup[r], m), delay[r]
        mbs = np.stack([w0 + j, j, j - d], axis=1)
        keep = np.stack([j < m - w0, np.ones(m, dtype=bool), j >= d], axis=1)
        next_w = int(keep[:, 2].sum())
        letters = ("F" * w0 + "".join(np.broadcast_to(kinds3, (m, 3))[keep].tolist())
                   + "W" * (m - next_w))
        mb = np.concatenate([np.arange(w0, dtype=np.int64), mbs[keep],
                             np.arange(next_w, m, dtype=np.int64)])
        orders.append(RankOrder.build(r, letters, mb))
    return orders


def zb_h1(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p = ranks
    orders = split_backward_orders(p, microbatches, [p - r - 1 for r in range(p)],
                                   list(range(p)))
    return make_schedule("zb-h1", orders, p, microbatches)


def zb_h2(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p = ranks
    orders = split_backward_orders(p, microbatches, [2 * (p - r - 1) for r in range(p)],
                                   [2 * r for r in range(p)])
    return make_schedule("zb-h2", orders, p, microbatches)


register(
    ScheduleSpec(
        "zb-h1",
        zb_h1,
        "1F1B with the backward split into I and W, W delayed: 1/3 of 1F1B's bubble at "
        "1F1B's memory (Qi et al. 2024)",
        split_backward=True,
        aliases=("zbh1", "zb1p"),
        closed_form=zb_h1_closed_form,
        formula="bubble (p−1)(F+I−W) per rank",
        split_only=True,
        color="#CC3311",
        memory_sweep=6,
    )
)
register(
    ScheduleSpec(
        "zb-h2",
        zb_h2,
        "ZB-H1 with 2(p-r-1) warm-up forwards: no bubble within a rank's span, 2p-1 "
        "activations (Qi et al. 2024)",
        split_backward=True,
        aliases=("zbh2", "zb2p"),
        closed_form=zb_h2_closed_form,
        formula="bubble (p−1)(F+I−2W) within rank 0's span",
        closed_form_basis="span",
        split_only=True,
        color="#EE3377",
        memory_sweep=7,
    )
)
