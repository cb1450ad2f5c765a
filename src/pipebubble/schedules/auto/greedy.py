"""A greedy list scheduler under a memory limit: the search step of ``auto``.

It builds each rank's order by playing the step forward in time, the way the Zero Bubble
paper's heuristic does (Qi et al. 2024, section 3): a rank that is free picks, among the
actions whose inputs have arrived,

1. an ``I`` (the input gradient: the previous stage waits for it, it is the critical path);
2. else an ``F``, if the rank's activation memory stays within the limit after it (keeping
   room for the microbatches it still has to carry through its later chunk, so a V
   placement never fills up with chunk-0 activations and deadlocks) and the warm-up cap
   allows another microbatch in flight;
3. else a ``W`` (the weight gradient, which nobody waits for): it fills the gap and frees
   ``M_W``; when the limit blocks an F, W runs to make room;
4. else it waits until something arrives.

Each action is timed as it is placed (start = when the rank is free and its inputs are
there, ``comm`` added on hops between ranks), so the order comes out with its step time.
Five *knobs* change the choices: ``cap`` (the warm-up depth: ``p - r``, ``2(p - r) - 1``
microbatches or only what memory allows), ``lazy_w`` (run a W only into a gap at least as
long as it, as the paper does), ``wait_i`` (leave a short hole rather than start an F
when an I arrives before the F would end) and ``deep_first`` (which chunk's F goes first in
the V placement) and ``critical`` (an F whose remaining path to the end of the step is
longer than a ready I's goes first, even if it arrives a little later: list scheduling
by critical path).
:func:`greedy_order` returns the per-rank orders and the step time, or None if those knobs
deadlock.

Example, 1F1B's memory on 2 ranks::

    >>> from pipebubble.costs import CostModel
    >>> sc = CostModel(memory_limit=2).resolve(2)
    >>> orders, step, span_idle = greedy_order(2, 2, sc, (0, 1), [2.0, 2.0], Knobs())
    >>> step   # 3m + p - 1: the lower bound
    7.0
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from ...costs import FIT_TOLERANCE, StageCosts
from ...ir.deps import precedences
from ...ir.schedule import Action, Kind

_INF = float("inf")
_EPS = 1e-12


class Knobs(NamedTuple):
    """One setting of the heuristic's choices (see the module docstring)."""

    cap: str = "memory"  # "1f1b" (p - r), "h2" (2(p - r) - 1) or "memory" (no cap but memory)
    lazy_w: bool = False
    wait_i: bool = False
    deep_first: bool = True
    critical: bool = False  # an F whose remaining path is longer goes before a ready I


def warmup_cap(cap: str, ranks: int, rank: int, chunks: int) -> float:
    """Most microbatches in flight on a rank's first stage under knob ``cap``."""
    depth = ranks - rank if chunks == 1 else 2 * (ranks - rank) - 1  # 1F1B's / ZB-V's
    if cap == "1f1b":
        return depth
    if cap == "h2":
        return 2 * depth - 1 if chunks == 1 else 2 * depth
    return _INF


def greedy_order(
    ranks: int,
    microbatches: int,
    sc: StageCosts,
    stage_to_rank: tuple[int, ...],
    limits: list[float] | None,
    knobs: Knobs,
) -> tuple[list[list[tuple]], float, float] | None:
    """Per-rank orders of one step (``(stage, kind, microbatch)`` tuples: make Actions with
    ``Action(*a)``), its step time and the idle time inside the ranks' spans, built
    greedily; None on deadlock.

    ``sc`` holds one entry per stage (one chain: stage s feeds s + 1); ``stage_to_rank``
    places them; ``limits[r]`` caps rank r's activation memory (None: no cap).
    """
    p, m, S = ranks, microbatches, len(stage_to_rank)
    where = stage_to_rank
    local = [[s for s in range(S) if where[s] == r] for r in range(p)]
    dur_f = [sc.duration(s, "F") for s in range(S)]
    dur_i = [sc.duration(s, "I") for s in range(S)]
    dur_w = [sc.duration(s, "W") for s in range(S)]
    mem = {k: [sc.memory_deltas(s, k) for s in range(S)] for k in "FIW"}
    f0 = [mem["F"][s][0] + mem["F"][s][1] for s in range(S)]
    i0 = [mem["I"][s][0] for s in range(S)]
    i_net = [mem["I"][s][0] + mem["I"][s][1] for s in range(S)]
    w_net = [mem["W"][s][0] + mem["W"][s][1] for s in range(S)]
    up, down = _hops(sc, where)
    lim = [_INF] * p if limits is None else [x + FIT_TOLERANCE * max(1.0, abs(x))
                                               for x in limits]  # fits_limit's test
    # Room kept for what a rank must still hold to make progress: recomputation
    # re-materialises at the start of I; with two chunks, a forward of the first keeps room
    # for one forward of the later chunk. One is enough: every stage runs its Fs and Is in
    # microbatch order, so the oldest unfinished microbatch is the one that room serves,
    # and it can always move on (W frees what else it needs).
    keep = [max((i0[s] for s in local[r]), default=0.0) for r in range(p)]
    caps = [warmup_cap(knobs.cap, p, r, len(local[r])) for r in range(p)]
    # Longest path from an action's start to the end of the step (for ``critical``).
    tail_i = [0.0] * S
    for s in range(S):
        tail_i[s] = dur_i[s] + (down[s - 1] + tail_i[s - 1] if s else dur_w[0])
    tail_f = [0.0] * S
    for s in range(S - 1, -1, -1):
        tail_f[s] = dur_f[s] + (up[s + 1] + tail_f[s + 1] if s < S - 1 else tail_i[s])

    f_end = [[_INF] * m for _ in range(S)]
    i_end = [[_INF] * m for _ in range(S)]
    nf, ni, nw = [0] * S, [0] * S, [0] * S
    used = [0.0] * p
    free = [0.0] * p
    orders: list[list[Action]] = [[] for _ in range(p)]
    left = 3 * S * m
    heap = [(0.0, r) for r in range(p)]
    begin = [_INF] * p  # each rank's first start, and its busy time (for the span)
    busy = [0.0] * p
    F, I, W = Kind.F, Kind.I, Kind.W

    while heap:
        t, r = heapq.heappop(heap)
        if free[r] > t + _EPS:
            continue
        mine = local[r]
        soon = _INF  # earliest known arrival of an I or an allowed F (for the knobs)
        # 1. I: the critical path.
        pick_i = -1
        best = _INF
        for s in mine:
            j = ni[s]
            if j < nf[s]:
                ready = f_end[s][j]
                if s < S - 1:
                    x = i_end[s + 1][j] + down[s]
                    if x > ready:
                        ready = x
                if ready <= t + _EPS:
                    if ready < best and used[r] + i0[s] <= lim[r]:
                        best, pick_i = ready, s
                elif ready < soon:
                    soon = ready
        if pick_i >= 0 and knobs.critical:
            for s in mine:  # an allowed F with a longer way to go, there before the I
                j = nf[s]  # would end, runs first (waiting for it if need be)
                if (j < m and tail_f[s] > tail_i[pick_i]
                        and (s == 0 or f_end[s - 1][j] + up[s] < t + dur_i[pick_i] - _EPS)
                        and used[r] + f0[s] + keep[r]
                        + sum(f0[x] for x in mine if x > s) <= lim[r]
                        and not (s == mine[0] and nf[s] - ni[s] >= caps[r])):
                    pick_i = -1
                    break
        if pick_i >= 0:
            s = pick_i
            j = ni[s]
            e = t + dur_i[s]
            i_end[s][j] = e
            ni[s] = j + 1
            used[r] += i_net[s]
            orders[r].append((s, I, j))
            if t < begin[r]:
                begin[r] = t
            busy[r] += dur_i[s]
            free[r] = e
            heapq.heappush(heap, (e, r))
            if s:
                q, x = where[s - 1], e + down[s - 1]
                if q != r and free[q] < x:
                    heapq.heappush(heap, (x, q))
            left -= 1
            continue
        # 2. F, if memory and the warm-up cap allow.
        pick_f = -1
        blocked = False
        first = mine[0] if mine else -1
        for s in mine:
            j = nf[s]
            if j >= m:
                continue
            ready = 0.0 if s == 0 else f_end[s - 1][j] + up[s]
            if ready == _INF:
                continue
            need = used[r] + f0[s] + keep[r]
            for s2 in mine:
                if s2 > s:
                    need += f0[s2]
            if need > lim[r] or (s == first and nf[s] - ni[s] >= caps[r]):
                blocked = blocked or ready <= t + _EPS
                continue
            if ready <= t + _EPS:
                if pick_f < 0 or (s > pick_f if knobs.deep_first else nf[s] < nf[pick_f]):
                    pick_f = s
            elif ready < soon:
                soon = ready
        if pick_f >= 0 and not (knobs.wait_i and soon < t + dur_f[pick_f] - _EPS
                                and _i_is_next(mine, ni, nf, soon, f_end, i_end, down, S)):
            s = pick_f
            j = nf[s]
            e = t + dur_f[s]
            f_end[s][j] = e
            nf[s] = j + 1
            used[r] += f0[s]
            orders[r].append((s, F, j))
            if t < begin[r]:
                begin[r] = t
            busy[r] += dur_f[s]
            free[r] = e
            heapq.heappush(heap, (e, r))
            if s < S - 1:
                q, x = where[s + 1], e + up[s + 1]
                if q != r and free[q] < x:
                    heapq.heappush(heap, (x, q))
            left -= 1
            continue
        # 3. W: fills a gap, or frees memory for a blocked F.
        pick_w = -1
        oldest = _INF
        for s in mine:
            j = nw[s]
            if j < ni[s] and i_end[s][j] < oldest:
                oldest, pick_w = i_end[s][j], s
        if pick_w >= 0 and (blocked or pick_f >= 0 or not knobs.lazy_w
                            or soon >= t + dur_w[pick_w] - _EPS):
            s = pick_w
            j = nw[s]
            e = t + dur_w[s]
            nw[s] = j + 1
            used[r] += w_net[s]
            orders[r].append((s, W, j))
            if t < begin[r]:
                begin[r] = t
            busy[r] += dur_w[s]
            free[r] = e
            heapq.heappush(heap, (e, r))
            left -= 1
            continue
        if pick_f >= 0 or pick_w >= 0:
            # The knobs chose to wait for something already on its way: wake up then.
            heapq.heappush(heap, (soon, r))
    if left:
        return None
    step = max(free)
    span_idle = sum(free[r] - begin[r] - busy[r] for r in range(p))
    return orders, step, span_idle


class _Topology(NamedTuple):
    num_stages: int
    stage_to_rank: tuple[int, ...]
    chain_starts: tuple[int, ...]


def _hops(sc: StageCosts, where: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """The lags of the rule's neighbour edges (:func:`~pipebubble.ir.deps.precedences` of
    one microbatch): ``up[s]`` into F(s) from the stage before, ``down[s]`` into I(s) from
    the stage after; ``comm`` where the edge crosses ranks."""
    S = len(where)
    up, down = [0.0] * S, [0.0] * S
    acts = [Action(s, k, 0) for s in range(S) for k in "FIW"]
    for e in precedences(acts, _Topology(S, tuple(where), (0,))):
        if e.crosses and e.before.stage != e.after.stage:
            (up if e.after.kind == Kind.F else down)[e.after.stage] = sc.comm
    return up, down


def _i_is_next(mine, ni, nf, soon, f_end, i_end, down, S) -> bool:
    """True if the earliest known arrival on this rank is an I (``wait_i`` waits only for
    those: the input gradient is on the critical path, a later F is not)."""
    for s in mine:
        j = ni[s]
        if j < nf[s]:
            ready = f_end[s][j]
            if s < S - 1:
                ready = max(ready, i_end[s + 1][j] + down[s])
            if ready <= soon + _EPS:
                return True
    return False
