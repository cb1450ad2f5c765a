"""DualPipeV and DualPipe (DeepSeek, github.com/deepseek-ai/DualPipe; DeepSeek-V3 report).

DualPipe feeds microbatches from both ends of the pipeline into two copies of the model;
DualPipeV is its "cut in half" form: one copy, 2p stages in the ``v`` placement (rank r
holds stage r, chunk 0, and stage 2p - 1 - r, chunk 1), every microbatch going down and back
up the V. Its steady state runs a forward of one chunk and a full backward of the other as
one *overlapped* pair (an :class:`~pipebubble.ir.schedule.Overlap`), so communication of one
hides behind computation of the other: the pair takes ``overlap x max(compute,
all-to-all)`` of its two halves (``CostModel.a2a_f``/``a2a_b``: expert parallelism's
all-to-all; ``StageCosts.pair_duration``), ``overlap x (F + B)`` without all-to-all (1.0: no
gain). Rank r, with F0/F1 and B0/B1 the chunk-0/1 work:

1. 2(p - r - 1) x F0;
2. r + 1 x (F0, F1);
3. p - r - 1 x (I1, W, F1)                     -- zero-bubble: W from the queue right away;
4. m - 2p + r + 1 x ((F0 & B1), (F1 & B0))      -- overlapped pairs; the last rank runs its
   very first F0 and B1 apart;
5. p - r - 1 x (B1, (F1 & B0));
6. r + 1 x (B1, B0), switching to I-only (W queued) half way;
7. p - r - 1 x (W, I0);
8. the queued Ws.

Every I queues its W; each "W" step runs the oldest queued one. Needs m >= 2p. Bubble
(DualPipe README): (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages and chunk times, i.e.
(p - 1)(F&B + B - 3W); rank 0 holds PP + 1 = 2p + 1 chunk activations (p + 1/2
rank-shares).

DualPipe itself (:func:`dualpipe`) is two mirrored DualPipeVs: see its docstring.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..ir.orders import CODE, RankOrder
from ..ir.schedule import Schedule, ScheduleError, make_schedule
from ..sim.formulas import dualpipe_closed_form, dualpipev_closed_form
from .registry import ScheduleSpec, register

if TYPE_CHECKING:
    import numpy as np

    # a rank's order in pieces, each (stage, kind code, microbatch, pair code) arrays
    Parts = list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

_F, _I, _W, _B = (CODE[k] for k in "FIWB")


def dualpipev(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    if m < 2 * p:
        raise ScheduleError(
            f"dualpipev needs microbatches >= 2 x ranks = {2 * p}, got {m}"
        )
    orders = _orders([_rank_parts(p, m, r, (r, 2 * p - 1 - r)) for r in range(p)])
    return make_schedule("dualpipev", orders, 2 * p, m, placement="v")


def _orders(ranks: list[Parts]) -> list[RankOrder]:
    """The ranks' orders from their pieces: every piece copied once into one set of flat
    arrays, rank after rank, which the orders are views of
    (:meth:`~pipebubble.ir.orders.RankOrder.split`, read without a copy by validation)."""
    import numpy as np

    offsets = [0]
    for parts in ranks:
        offsets.append(offsets[-1] + sum(len(piece[0]) for piece in parts))
    columns = []
    for c, dtype in enumerate((np.int64, np.int8, np.int64, np.int8)):
        out = np.empty(offsets[-1], dtype=dtype)
        np.concatenate([piece[c] for parts in ranks for piece in parts], out=out,
                       casting="unsafe")
        columns.append(out)
    stage, kind, mb, pair = columns
    return RankOrder.split(stage, kind, mb, offsets, pair)


def _rank_parts(p: int, m: int, r: int, stage: tuple[int, int]) -> Parts:
    """The eight phases of rank ``r`` of a ``p``-rank DualPipeV with ``m`` microbatches;
    ``stage`` = (its chunk-0 stage, its chunk-1 stage). Rank p - 1 is the turn of the V.

    Built as arrays (:func:`_orders` joins them): the short phases one action at a time,
    the steady state (phase 4, all but O(p) of the actions) with numpy.
    """
    import numpy as np

    next_f = [0, 0]
    next_b = [0, 0]
    weights: deque[tuple[int, int]] = deque()  # (stage, microbatch) of the queued Ws
    head: tuple[list[int], ...] = ([], [], [], [])  # stage, kind code, microbatch, pair code
    tail: tuple[list[int], ...] = ([], [], [], [])
    cols = head

    def emit(s: int, kind: int, mb: int, pair: int = 0) -> None:
        cols[0].append(s)
        cols[1].append(kind)
        cols[2].append(mb)
        cols[3].append(pair)

    def f(chunk: int, pair: int = 0) -> None:
        next_f[chunk] += 1
        emit(stage[chunk], _F, next_f[chunk] - 1, pair)

    def b(chunk: int, split: bool = False, pair: int = 0) -> None:
        next_b[chunk] += 1
        mb = next_b[chunk] - 1
        if split:
            weights.append((stage[chunk], mb))
            emit(stage[chunk], _I, mb, pair)
        else:
            emit(stage[chunk], _B, mb, pair)

    def w() -> None:
        if weights:
            s, mb = weights.popleft()
            emit(s, _W, mb)

    for _ in range(2 * (p - r - 1)):
        f(0)
    for _ in range(r + 1):
        f(0)
        f(1)
    for _ in range(p - r - 1):
        b(1, split=True)
        w()
        f(1)
    # Phase 4, the steady state: k x ((F0 & B1), (F1 & B0)); the last rank runs its very
    # first F0 and B1 apart. No W is queued or run here.
    k = m - 2 * p + r + 1
    i = np.arange(max(k, 0))
    steady = (
        np.tile(np.array([stage[0], stage[1], stage[1], stage[0]]), len(i)),
        np.tile(np.array([_F, _B, _F, _B], dtype=np.int8), len(i)),
        np.stack([next_f[0] + i, next_b[1] + i, next_f[1] + i, next_b[0] + i], axis=1).ravel(),
        np.tile(np.array([1, 2, 1, 2], dtype=np.int8), len(i)),
    )
    if k > 0 and r == p - 1:
        steady[3][:2] = 0
    for chunk in (0, 1):
        next_f[chunk] += len(i)
        next_b[chunk] += len(i)
    cols = tail
    for _ in range(p - r - 1):
        b(1)
        f(1, pair=1)
        b(0, pair=2)
    split = False
    for i_ in range(r + 1):
        if i_ == (r + 1) // 2 and r % 2 == 1:
            split = True
        b(1, split)
        if i_ == (r + 1) // 2 and r % 2 == 0:
            split = True
        b(0, split)
    for _ in range(p - r - 1):
        w()
        b(0, split=True)
    for _ in range(r + 1):
        w()
    return [tuple(np.array(column, dtype=np.int64) for column in head), steady,
            tuple(np.array(column, dtype=np.int64) for column in tail)]


def dualpipe(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """DualPipe (DeepSeek-V3 report, github.com/deepseek-ai/DualPipe): two copies of the
    model, microbatches entering from both ends.

    ``p`` ranks (even), ``microbatches`` = M in total: M/2 enter copy A at rank 0 and run
    down to rank p - 1, M/2 enter copy B at rank p - 1 and run up to rank 0. Copy A is the
    chain of stages 0..p-1, copy B the chain p..2p-1 (``chain_starts=(0, p)``; copy B's stage
    j = global stage p + j lives on rank p - 1 - j), so the placement is exactly ``v``: rank
    r holds copy A's stage r and copy B's stage p - 1 - r (global 2p - 1 - r), and every
    stage is 1/p of one copy. ``Schedule.num_microbatches`` is M/2 (per chain);
    ``total_microbatches`` is M.

    Each rank r works on its *near* direction (the copy entering at its end of the
    pipeline: A for r < p/2, B for r >= p/2) and its *far* one. With h = min(r, p - 1 - r)
    its order is exactly rank h of a DualPipeV on p/2 ranks with M/2 microbatches (see
    :func:`dualpipev`: chunk 0 = near stage, chunk 1 = far stage): the two halves of the
    ranks mirror each other, and the V's turn becomes the hop between the middle ranks
    p/2 - 1 and p/2, the ones that run their first F0 and B1 apart. DeepSeek's reference
    (``DualPipe.step``) has the same phases with ``half_rank`` = h and
    ``half_num_chunks`` = M/2, and requires p even, M even and M >= 2p.

    Bubble (DualPipe README): (PP/2 - 1)(F&B + B - 3W) with PP = p and F, B, W, F&B the
    times of one stage; every rank holds PP + 1 = p + 1 stage activations; 2x the
    parameters. A scalar ``CostModel`` value is one rank's share of one model copy, which
    here is one stage (``chunks`` = stages per rank per chain = 1): the same scalars as
    1F1B describe the same model.

    >>> s = dualpipe(2, 4)
    >>> print(s.to_text())
    0F0 3F0 0F1 3B0 (3F1;0B0) 3B1 0I1 0W1
    2F0 1F0 2F1 1B0 (1F1;2B0) 1B1 2I1 2W1
    """
    p, total = ranks, microbatches
    if p < 2 or p % 2:
        raise ScheduleError(
            f"dualpipe needs an even number of ranks >= 2 (its two halves mirror each other), "
            f"got {p}; try dualpipev for any p"
        )
    if total % 2 or total < 2 * p:
        raise ScheduleError(
            f"dualpipe needs an even number of microbatches >= 2 x ranks = {2 * p} (half "
            f"enter from each end, and each direction needs >= p), got {total}"
        )
    half, m = p // 2, total // 2
    ranks_parts = []
    for r in range(p):
        mine = (r, 2 * p - 1 - r)  # (copy A's stage, copy B's stage)
        near_far = mine if r < half else mine[::-1]
        ranks_parts.append(_rank_parts(half, m, min(r, p - 1 - r), near_far))
    orders = _orders(ranks_parts)
    return make_schedule("dualpipe", orders, 2 * p, m, placement="v", chain_starts=(0, p))


register(
    ScheduleSpec(
        "dualpipev",
        dualpipev,
        "V placement, overlapped F&B pairs, split backward at the ends: bubble "
        "(p-1)(F&B+B-3W), m >= 2p (DeepSeek DualPipe)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=True,
        split_backward=True,
        aliases=("dualpipe-v", "dual-pipe-v"),
        closed_form=dualpipev_closed_form,
        formula="bubble (PP/2−1)(F&B+B−3W), PP = 2p stages",
        placement="v",
        torch_class="ScheduleDualPipeV",
        color="#882255",
    )
)

register(
    ScheduleSpec(
        "dualpipe",
        dualpipe,
        "two model copies, microbatches from both ends, overlapped F&B pairs: bubble "
        "(p/2-1)(F&B+B-3W), p even, M even >= 2p (M/2 per direction; DeepSeek DualPipe)",
        chunks=1,  # stages per rank per chain: one stage of each model copy
        min_chunks=1,
        fixed_chunks=True,
        split_backward=True,
        aliases=("dual-pipe",),
        closed_form=dualpipe_closed_form,
        formula="bubble (PP/2−1)(F&B+B−3W), PP = p",
        placement=None,  # two chains: each rank holds a stage of each model copy
        chains=2,
        color="#AA3377",
    )
)
