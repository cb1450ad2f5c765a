"""What no order can beat: a lower bound on the step time, and the smallest memory limit.

**Lower bound** (provable for every order of the same actions on the same placement). Rank
r's first action is a forward, which cannot start before its input has gone through every
earlier stage: ``head_r`` = the least, over r's stages s, of the forwards of stages
``0..s-1`` plus ``comm`` for each hop between ranks. From then on the rank is busy for
``busy_r`` = m x its F + I + W. And the last of its F and I actions is an I (each F comes
before its own I on the same rank), after which the gradient still has to go down to
stage 0 and stage 0 has to run that microbatch's W: ``tail(s)`` = the Is of stages
``0..s-1`` plus their hops plus ``W(0)`` (at least ``W(s)``). So::

    step >= head_r + max(busy_r, m x (F + I of r's stages) + min over r's stages of tail(s))

for every rank, and step >= one microbatch's whole path (all Fs, all Is, W(0), all hops).

>>> from pipebubble.costs import CostModel
>>> lower_bound(CostModel().resolve(4), (0, 1, 2, 3), 8)  # 3m + p - 1 with F = I = W = 1
27.0

**Smallest limit.** A microbatch's activation stays on a rank from its F on a stage until
the I of the rank's *last* stage it passes through starts (that I needs the gradient that
comes back through the later stages), so a rank holds, at the very least, one forward of
each of its stages at once, plus what recomputation re-materialises at an I:
``need_r = sum of M_B over r's stages (+ the largest recomputed M_B)``. Any limit at or above
it is feasible (one microbatch at a time); below it nothing is.
"""

from __future__ import annotations

from ...costs import StageCosts


def _stages_of(stage_to_rank: tuple[int, ...]) -> list[list[int]]:
    p = max(stage_to_rank) + 1
    return [[s for s, r in enumerate(stage_to_rank) if r == q] for q in range(p)]


def lower_bound(sc: StageCosts, stage_to_rank: tuple[int, ...], microbatches: int) -> float:
    """A step time no order of the split-backward (F, I, W) actions can beat; see above."""
    S, m = len(stage_to_rank), microbatches
    f = [sc.duration(s, "F") for s in range(S)]
    i = [sc.duration(s, "I") for s in range(S)]
    w = [sc.duration(s, "W") for s in range(S)]
    hop = [sc.comm if s and stage_to_rank[s] != stage_to_rank[s - 1] else 0.0
           for s in range(S)]  # hop[s]: between stage s - 1 and stage s
    arrive = [0.0] * S
    for s in range(1, S):
        arrive[s] = arrive[s - 1] + f[s - 1] + hop[s]
    down = [0.0] * S  # gradient path below stage s: Is of 0..s-1 and their hops
    for s in range(1, S):
        down[s] = down[s - 1] + i[s - 1] + hop[s]
    best = arrive[S - 1] + f[S - 1] + down[S - 1] + i[S - 1] + w[0]
    for mine in _stages_of(stage_to_rank):
        if not mine:
            continue
        head = min(arrive[s] for s in mine)
        busy = m * sum(f[s] + i[s] + w[s] for s in mine)
        fi = m * sum(f[s] + i[s] for s in mine)
        tail = min(max(w[s], down[s] + w[0] if s else w[0]) for s in mine)
        best = max(best, head + max(busy, fi + tail))
    return best


def min_limits(sc: StageCosts, stage_to_rank: tuple[int, ...]) -> list[float]:
    """Per rank, the smallest activation-memory limit any order can run under; see above."""
    out = []
    for mine in _stages_of(stage_to_rank):
        held = sum(sum(sc.memory_deltas(s, "F")) for s in mine)
        extra = max((sc.memory_deltas(s, "I")[0] for s in mine), default=0.0)
        out.append(held + extra)
    return out
