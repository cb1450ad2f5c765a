"""An adaptive V scheduler: many building blocks, the fastest one that fits, for real costs.

V-Half and V-Min are two points of a family (``building_block.py``): a block is set by the
offsets between consecutive stages (``dF0, dF1, dI0, dI1``), the turn of the V
(``turn_f, turn_i``) and its top. The controllable-memory paper (Qi et al. 2024, Appendix
A) builds its adaptive scheduler from that family: try many blocks, repeat, squeeze and
reorder each, and keep the fastest whose peak fits. This module does the same with its own
search order, so that it costs little at the sizes people run:

1. enumerate the blocks with ``dF0 = dI1 = a`` and ``dF1 = dI0 = b`` (a, b in 1..5: a
   microbatch's chunk-0 forward and chunk-1 input gradient travel alike, as do the other
   two; V-Min is a = b = 1, V-Half a, b = 2, 1 or 1, 2, ZB-V 4, 2 or 2, 4) and every turn and
   top in 1..6 that collides with nothing modulo 6;
2. estimate each block's peak per rank without building it (a stage's activation lives
   from its F to its W, ``ceil(lifespan / 6)`` microbatches of it at once in the steady
   state: an upper bound, as a rank's two stages need not peak together), count it on the
   block repeated for a few microbatches where the estimate is near the limit, keep those
   within it, most memory first (the unit-cost bound
   ``6m + 6p - 1 - 3k`` falls as the peak k grows), then the shortest block (least fill);
3. build the few best as orders: repeated, warm-up and cool-down reordered without raising
   the peak (``building_block.reorder_ends``, which keeps the block's steady state and so
   stays free of a repeating bubble under comm and W != F), and the list-scheduled
   reorder; the caller scores every order with the simulator and keeps what fits.

It stops at ``deadline`` (a ``time.perf_counter()`` value). Deterministic: the order of
the enumeration is fixed and nothing is random.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from ...costs import StageCosts
from ...ir.schedule import Action, ScheduleError
from ..building_block import PERIOD, block, peak, reorder, reorder_ends, repeat

BUILD_AT_MOST = 8  # blocks built and scored, at most (each costs about one reorder)
SLACK = 6  # blocks whose estimated peak is this far above the limit are counted exactly


def switched_block(p: int, near: int, far: int, switch: int, turn_f: int, turn_i: int,
                   top: int) -> tuple[list[int], list[int], list[int]] | None:
    """(tF, tI, tW) of the block whose chunk-0 forwards and chunk-1 input gradients are
    ``near`` units apart between ranks ``0..switch`` and ``far`` beyond (the other two
    kinds 1 unit apart), with these turns; None if two passes of a rank collide modulo 6.
    ``near == far`` is the uniform block of ``building_block.block``."""
    S = 2 * p
    step = [near if r < switch else far for r in range(p - 1)]  # hop r -> r + 1
    t_f = [0] * S
    for s in range(1, S):
        t_f[s] = t_f[s - 1] + (turn_f if s == p else step[s - 1] if s < p else 1)
    t_i = [0] * S
    t_i[S - 1] = t_f[S - 1] + top
    for s in range(S - 2, -1, -1):  # stage s + 1 -> s
        if s == p - 1:
            gap = turn_i
        elif s < p - 1:
            gap = 1
        else:  # chunk 1: stage s on rank S-1-s, from rank S-2-s
            gap = step[S - 2 - s]
        t_i[s] = t_i[s + 1] + gap
    taken: list[set[int]] = [set() for _ in range(p)]
    rank = [s if s < p else S - 1 - s for s in range(S)]
    for s in range(S):
        for t in (t_f[s], t_i[s]):
            if t % PERIOD in taken[rank[s]]:
                return None
            taken[rank[s]].add(t % PERIOD)
    t_w = [0] * S
    for s in sorted(range(S), key=lambda s: t_i[s]):
        t = t_i[s] + 1
        while t % PERIOD in taken[rank[s]]:
            t += 1
        taken[rank[s]].add(t % PERIOD)
        t_w[s] = t
    return t_f, t_i, t_w


def candidate_blocks(p: int, deadline: float = float("inf")
                     ) -> list[tuple[tuple[int, ...], tuple[list[int], ...]]]:
    """The collision-free blocks of the family: the uniform ones first (a, b in 1..5),
    then those whose near/far offsets switch at a rank (until ``deadline``)."""
    out = []
    turns = [(tf, ti, top) for tf in range(1, 7) for ti in range(1, 7) for top in range(1, 7)]
    for a in range(1, 6):
        for b in range(1, 6):
            if time.perf_counter() > deadline:
                return out
            for turn in turns:
                offsets = (a, b, b, a, *turn)
                try:
                    out.append((offsets, block(p, offsets)))
                except ScheduleError:
                    continue
    for near in range(2, 6):
        for far in range(1, near):
            for switch in range(1, p - 1):
                if time.perf_counter() > deadline:
                    return out
                for turn in turns:
                    times = switched_block(p, near, far, switch, *turn)
                    if times is not None:
                        out.append(((near, far, switch, *turn), times))
    return out


def estimated_peaks(p: int, times: tuple[list[int], ...]) -> list[int]:
    """Chunk activations each rank holds in the block's steady state (F adds, W frees)."""
    t_f, _, t_w = times
    S = 2 * p
    held = [0] * p
    for s in range(S):
        r = s if s < p else S - 1 - s
        held[r] += math.ceil((t_w[s] + 1 - t_f[s]) / PERIOD)
    return held


def adaptive_orders(p: int, m: int, sc: StageCosts, limits: list[float] | None,
                    deadline: float) -> Iterator[tuple[str, list[list[Action]]]]:
    """(source, per-rank orders) of the most promising blocks within ``limits`` (per rank,
    in the units of ``sc``'s memory), best first, until ``deadline``."""
    chunk_mb = [max(sum(sc.memory_deltas(s, "F")) for s in (r, 2 * p - 1 - r))
                for r in range(p)]
    ranked = []
    probe = min(m, 3 * p)  # enough microbatches to reach the steady state's peak
    for offsets, times in candidate_blocks(p, deadline):
        held = estimated_peaks(p, times)  # an upper bound: two stages' peaks may not meet
        if limits is not None and any((h - SLACK) * c > lim + 1e-9 for h, c, lim
                                      in zip(held, chunk_mb, limits, strict=True)):
            continue
        if time.perf_counter() > deadline:
            break
        rows = repeat(p, probe, times)
        held = [peak(p, [row]) for row in rows]
        if limits is not None and any(h * c > lim + 1e-9 for h, c, lim
                                      in zip(held, chunk_mb, limits, strict=True)):
            continue
        length = times[2][0] - times[0][0]  # a microbatch's whole block on rank 0
        ranked.append((-max(held), length, offsets, times))
    ranked.sort(key=lambda x: x[:3])
    seen: set[tuple] = set()
    built = 0
    for _neg, _length, offsets, times in ranked:
        if built >= BUILD_AT_MOST or time.perf_counter() > deadline:
            return
        key = (tuple(times[0]), tuple(times[1]), tuple(times[2]))
        if key in seen:
            continue
        seen.add(key)
        built += 1
        rows = repeat(p, m, times)
        cap, cap_i = peak(p, rows), peak(p, rows, frees="I")
        name = "adaptive block " + ",".join(map(str, offsets))
        ends = reorder(p, m, reorder_ends(p, m, times, cap, cap_i), cap, cap_i, fill=False)
        if ends is not None:
            yield name + " (ends reordered)", ends[1]
        if time.perf_counter() > deadline:
            return
        listed = reorder(p, m, rows, cap, cap_i)
        if listed is not None:
            yield name + " (reordered)", listed[1]
