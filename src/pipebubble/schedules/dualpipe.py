"""DualPipeV (DeepSeek, github.com/deepseek-ai/DualPipe; DeepSeek-V3 report 2024).

DualPipe feeds microbatches from both ends of the pipeline into two copies of the model;
DualPipeV is its "cut in half" form: one copy, 2p stages in the ``v`` placement (rank r
holds stage r, chunk 0, and stage 2p - 1 - r, chunk 1), every microbatch going down and back
up the V. Its steady state runs a forward of one chunk and a full backward of the other as
one *overlapped* pair (an :class:`~pipebubble.schedule.Overlap`), so communication of one
hides behind computation of the other. ``CostModel.overlap`` is the pair's time as a
fraction of F + B (1.0: no gain). Rank r, with F0/F1 and B0/B1 the chunk-0/1 work:

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

DualPipe itself (two model copies, p even) is not generated here: its two copies are two
independent chains of stages, and the simulator's dependency rule follows one chain per
microbatch (stage s after stage s - 1); see the README.
"""

from __future__ import annotations

from collections import deque

from ..formulas import dualpipev_closed_form
from ..schedule import Action, Overlap, Schedule, ScheduleError, Step, make_schedule
from .registry import ScheduleSpec, register


def dualpipev(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    if m < 2 * p:
        raise ScheduleError(
            f"dualpipev needs microbatches >= 2 x ranks = {2 * p}, got {m}"
        )
    orders = [_rank_order(p, m, r) for r in range(p)]
    return make_schedule("dualpipev", orders, 2 * p, m, placement="v")


def _rank_order(p: int, m: int, r: int) -> list[Step]:
    stage = (r, 2 * p - 1 - r)
    next_f = [0, 0]
    next_b = [0, 0]
    weights: deque[Action] = deque()
    order: list[Step] = []

    def f(chunk: int) -> Action:
        next_f[chunk] += 1
        return Action(stage[chunk], "F", next_f[chunk] - 1)

    def b(chunk: int, split: bool = False) -> Action:
        next_b[chunk] += 1
        mb = next_b[chunk] - 1
        if split:
            weights.append(Action(stage[chunk], "W", mb))
            return Action(stage[chunk], "I", mb)
        return Action(stage[chunk], "B", mb)

    def w() -> None:
        if weights:
            order.append(weights.popleft())

    order += [f(0) for _ in range(2 * (p - r - 1))]
    for _ in range(r + 1):
        order += [f(0), f(1)]
    for _ in range(p - r - 1):
        order.append(b(1, split=True))
        w()
        order.append(f(1))
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:
            order += [f(0), b(1)]
        else:
            order.append(Overlap(f(0), b(1)))
        order.append(Overlap(f(1), b(0)))
    for _ in range(p - r - 1):
        order.append(b(1))
        order.append(Overlap(f(1), b(0)))
    split = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        order.append(b(1, split))
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        order.append(b(0, split))
    for _ in range(p - r - 1):
        w()
        order.append(b(0, split=True))
    for _ in range(r + 1):
        w()
    return order


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
    )
)
