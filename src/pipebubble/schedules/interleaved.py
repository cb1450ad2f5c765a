"""Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): v chunks per rank, depth first.

Each rank holds ``v`` stages in the ``loop`` placement (stage ``s`` on rank ``s mod p``), so a
microbatch visits every rank v times. Forwards go through the local chunks in *groups* of
``g`` microbatches: the first g microbatches through chunk 0, then the same g through chunk 1,
..., then the next group. Backwards follow the same order with the chunks reversed. Rank r
warms up with ``(v - 1) g + 2 (p - r - 1)`` forwards, then alternates one forward and one
backward, then drains. Because each chunk is 1/v of a rank's share, the bubble shrinks by v:
(p - 1)(F + B)/v, at the price of v times more point-to-point messages and more activation
memory on rank 0: p (1 + (p - 1)/(p v)) rank-shares (Korthikanti et al. 2022).

**Microbatch counts not divisible by p.** Megatron-LM requires m to be a multiple of p (the
group size is p). We follow PyTorch's ``ScheduleInterleaved1F1B`` instead, which is the same
when m is a multiple of p and also accepts other m: ``rounds = max(1, m // p)`` groups of
``g = m // rounds`` microbatches, which needs m to be a multiple of ``rounds``. So m < 2p is
always fine (one group of m), p=4, m=10 runs 2 groups of 5, and p=4, m=9 is rejected (2
rounds do not divide 9). The bubble formula holds for every accepted m >= p; with m < p
there are fewer microbatches than ranks and the pipeline cannot fill.

Rank 0 of p=2, v=2, m=2 (stages 0 and 2 on rank 0)::

    0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1
"""

from __future__ import annotations

from ..ir.orders import RankOrder, interleave
from ..ir.schedule import Schedule, ScheduleError, make_schedule
from ..sim.formulas import interleaved_closed_form
from .registry import ScheduleSpec, register


def group_size(ranks: int, microbatches: int) -> int:
    """Microbatches per group (per round), PyTorch's flexible rule; raise if m does not fit.

    >>> group_size(4, 8), group_size(4, 10), group_size(4, 3)
    (4, 5, 3)
    """
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        below = _nearest_valid(ranks, microbatches, -1)
        above = _nearest_valid(ranks, microbatches, +1)
        raise ScheduleError(
            f"interleaved-1f1b runs m // p = {rounds} rounds of equal size, and "
            f"m={microbatches} is not a multiple of {rounds}; valid m near it: "
            f"{below} or {above} (any m < 2p, or a multiple of m // p)"
        )
    return microbatches // rounds


def _nearest_valid(ranks: int, m: int, direction: int) -> int:
    while m > 1 and m % max(1, m // ranks):
        m += direction
    return m


def interleaved_orders(ranks: int, microbatches: int, chunks: int, g: int) -> list[RankOrder]:
    """Per-rank warm-up / 1F1B / cool-down orders over ``chunks`` loop-placed stages,
    forwards and backwards in groups of ``g`` microbatches."""
    import numpy as np

    p, m, v = ranks, microbatches, chunks
    n = v * m  # (chunk, microbatch) units per rank
    k = np.arange(n)  # the k-th forward (and the k-th backward) of a rank
    chunk = (k // g) % v
    mb = (k // (g * v)) * g + k % g
    orders = []
    for r in range(p):
        f_stage, b_stage = chunk * p + r, (v - 1 - chunk) * p + r
        warmup = min((v - 1) * g + 2 * (p - 1 - r), n)
        steady = n - warmup  # then F of unit warmup + j, B of unit j
        stage = np.concatenate([f_stage[:warmup], interleave(f_stage[warmup:], b_stage[:steady]),
                                b_stage[steady:]])
        mbs = np.concatenate([mb[:warmup], interleave(mb[warmup:], mb[:steady]), mb[steady:]])
        orders.append(RankOrder.build(stage, "F" * warmup + "FB" * steady + "B" * warmup, mbs))
    return orders


def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    if chunks < 2:
        raise ScheduleError(
            f"interleaved-1f1b needs chunks >= 2 (with 1 chunk it is 1f1b), got {chunks}"
        )
    g = group_size(ranks, microbatches)
    orders = interleaved_orders(ranks, microbatches, chunks, g)
    return make_schedule("interleaved-1f1b", orders, ranks * chunks, microbatches,
                         group_size=g)


register(
    ScheduleSpec(
        "interleaved-1f1b",
        interleaved_1f1b,
        "v chunks per rank, depth first: bubble / v, more memory and messages "
        "(Narayanan et al. 2021)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=False,
        aliases=("interleaved", "interleaved1f1b", "vpp"),
        closed_form=interleaved_closed_form,
        formula="bubble (p−1)(F+B)/v: fraction (p−1)/(v·m+p−1)",
        torch_class="ScheduleInterleaved1F1B",
        megatron="interleaved 1F1B",
        color="#009988",
    )
)
