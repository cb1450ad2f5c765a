"""ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6).

Two chunks per rank in the ``v`` placement: rank r holds stage r (chunk 0, on the way
down) and stage 2p - 1 - r (chunk 1, on the way back up), so rank 0 holds both the first
and the last stage and a microbatch's forward goes 0 → p-1 → 0 like a V, its backward the
other way. The backward is split into I and W. Rank r runs, with c0 and c1 its two stages:

1. 2(p - r) - 1 forwards of c0;
2. r times: F c1, F c0;
3. p - r times: F c1, I c1, W c1;
4. steady state, while forwards remain: F c0, I c0, W c0, F c1, I c1, W c1;
5. cool-down: r times I c0, I c1; p - r times I c0, W c0; then the remaining Ws.

With F = I = W and m >= 2p - 1 no rank is ever idle between its first and last action
("zero bubble", the paper drops the optimizer barrier), while rank 0 holds at most 2p chunk
activations = p rank-shares, the same as 1F1B. For m < 2p - 1 the schedule is built for
2p - 1 microbatches and the actions of the missing ones are dropped (as PyTorch's
``ScheduleZBVZeroBubble`` does).
"""

from __future__ import annotations

from ..ir.orders import RankOrder
from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import zbv_closed_form
from .registry import ScheduleSpec, register


def zbv(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    n = max(m, 2 * p - 1)
    orders = []
    for r in range(p):
        stage, kinds, mbs = _rank_order(p, n, r)
        keep = mbs < m  # the actions of the microbatches that exist
        orders.append(RankOrder.build(stage[keep], kinds[keep], mbs[keep]))
    return make_schedule("zbv", orders, 2 * p, m, placement="v")


def _rank_order(p: int, n: int, r: int):
    """Rank r's steps 1-5 above for n microbatches, as (stages, kind codes, microbatches);
    each step is a pattern of (stage, kind) repeated, laid out by numpy."""
    import numpy as np

    c0, c1 = r, 2 * p - 1 - r
    nxt = {(c, k): 0 for c in (c0, c1) for k in "FIW"}
    stages: list = []
    letters: list[str] = []
    mbs: list = []

    def rep(pattern: tuple[tuple[int, str], ...], times: int) -> None:
        if times <= 0:
            return
        seen: dict[tuple[int, str], int] = {}
        first = []  # each slot's microbatch in the first repeat
        for sk in pattern:
            first.append(nxt[sk] + seen.get(sk, 0))
            seen[sk] = seen.get(sk, 0) + 1
        step = np.array([seen[sk] for sk in pattern], dtype=np.int64)
        rows = np.arange(times, dtype=np.int64)[:, None]
        mbs.append((np.array(first, dtype=np.int64) + rows * step).ravel())
        stages.append(np.tile(np.array([s for s, _ in pattern], dtype=np.int64), times))
        letters.append("".join(k for _, k in pattern) * times)
        for sk, count in seen.items():
            nxt[sk] += count * times

    fiw0 = ((c0, "F"), (c0, "I"), (c0, "W"))
    fiw1 = ((c1, "F"), (c1, "I"), (c1, "W"))
    rep(((c0, "F"),), 2 * (p - r) - 1)
    rep(((c1, "F"), (c0, "F")), r)
    rep(fiw1, p - r)
    # step 4 while c0 has forwards left, then c0's I and W beside c1's FIW until c1's
    # forwards catch up with c0's
    rep(fiw0 + fiw1, n - nxt[c0, "F"])
    rep(fiw0[1:] + fiw1, nxt[c0, "F"] - nxt[c1, "F"])
    rep(((c0, "I"), (c1, "I")), r)
    rep(((c0, "I"), (c0, "W")), p - r)
    rep(((c1, "W"),), nxt[c1, "I"] - nxt[c1, "W"])
    rep(((c0, "W"),), nxt[c0, "I"] - nxt[c0, "W"])
    mb = np.concatenate(mbs)
    codes = RankOrder.build(0, "".join(letters), mb).kind
    return np.concatenate(stages), codes, mb


register(
    ScheduleSpec(
        "zbv",
        zbv,
        "V placement (2 chunks), split backward: no bubble within a rank's span at 1F1B's "
        "memory when F = I = W (Qi et al. 2024)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=True,
        split_backward=True,
        aliases=("zb-v", "zbvzerobubble"),
        closed_form=zbv_closed_form,
        formula="bubble 0 within every rank's span (F = I = W)",
        closed_form_basis="span",
        placement="v",
        split_only=True,
        torch_class="ScheduleZBVZeroBubble",
        color="#33BBEE",
        memory_sweep=4,
    )
)
