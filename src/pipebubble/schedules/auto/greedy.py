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

Each action is timed as it is placed, by the evaluation core's step-by-step clock
(:class:`~pipebubble.sim.clock.Clock`: the kernel's rule, start = when the rank is free and
its inputs are there, ``comm`` added on hops between ranks, and the memory in use under
the one tolerance), so the order comes out with the simulator's step time.
Five *knobs* change the choices: ``cap`` (the warm-up depth: ``p - r``, ``2(p - r) - 1``
microbatches or only what memory allows), ``lazy_w`` (run a W only into a gap at least as
long as it, as the paper does), ``wait_i`` (leave a short hole rather than start an F
when an I arrives before the F would end) and ``deep_first`` (which chunk's F goes first in
the V placement) and ``critical`` (an F whose remaining path to the end of the step is
longer than a ready I's goes first, even if it arrives a little later: list scheduling
by critical path). Whom a placed action wakes (the rank of the stage its output feeds) and
those paths are read off the clock's edges, the rule's (:func:`rule_links`).
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

from ...costs import StageCosts
from ...ir.schedule import Kind
from ...sim.clock import Clock

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
    packed: bool = False,
) -> tuple[list, float, float] | None:
    """Per-rank orders of one step (``(stage, kind, microbatch)`` tuples: make Actions with
    ``Action(*a)``; with ``packed``, one :class:`~pipebubble.ir.orders.RankOrder` a rank
    instead, the arrays the simulator reads), its step time and the idle time inside the
    ranks' spans, built greedily; None on deadlock.

    ``sc`` holds one entry per stage (one chain: stage s feeds s + 1); ``stage_to_rank``
    places them; ``limits[r]`` caps rank r's activation memory (None: no cap).
    """
    got = _greedy_ids(ranks, microbatches, sc, stage_to_rank, limits, knobs)
    if got is None:
        return None
    ids, step, span_idle = got
    S, m = len(stage_to_rank), microbatches
    if packed:
        return [_packed(row, S, m) for row in ids], step, span_idle
    kinds = (Kind.F, Kind.I, Kind.W)
    return [[(x // m % S, kinds[x // (S * m)], x % m) for x in row] for row in ids], \
        step, span_idle


def _packed(row: list[int], S: int, m: int):
    """One rank's clock numbers (``x = (kind S + stage) m + microbatch``) as a RankOrder:
    the same arrays as ``RankOrder.build`` of its (stage, kind, microbatch) steps."""
    import numpy as np

    from ...ir.orders import RankOrder

    x = np.array(row, dtype=np.int64)
    return RankOrder.build(x // m % S, (x // (S * m)).astype(np.int8), x % m)


def _greedy_ids(p: int, m: int, sc: StageCosts, where: tuple[int, ...],
                limits: list[float] | None, knobs: Knobs, one_stage: bool = True
                ) -> tuple[list[list[int]], float, float] | None:
    """:func:`greedy_order` with each rank's order as the clock's action numbers. Where
    every rank holds one stage (the loop placement) or two (the V placement) a copy of the
    loop with the scans over the rank's stages unrolled runs: these are the hot path of the
    planner's auto searches (about 10 % of greedy's time saved on the V calls), and the
    copies are kept deliberately (``one_stage=False``: the general loop, which makes the same
    choices; tests/test_auto_greedy.py keeps all three equal, bit for bit)."""
    S = len(where)
    clock = Clock(sc, where, m, limits)  # the times, the rule and the memory in use
    ready, end, free, used, lim = clock.ready, clock.end, clock.free, clock.used, clock.room
    place = clock.place
    local = [[s for s in range(S) if where[s] == r] for r in range(p)]
    # Action numbers (the clock's): F, I and W of stage s on microbatch j are xf[s] + j, ...
    xf = [s * m for s in range(S)]
    xi = [(S + s) * m for s in range(S)]
    xw = [(2 * S + s) * m for s in range(S)]
    dur_f = [sc.duration(s, "F") for s in range(S)]
    dur_i = [sc.duration(s, "I") for s in range(S)]
    dur_w = [sc.duration(s, "W") for s in range(S)]
    f0 = [clock.rows[s][3] for s in range(S)]  # an F's net memory, an I's at its start
    i0 = [clock.rows[S + s][2] for s in range(S)]
    # The rule, as the clock has it (its edges are ir/deps.precedences'): whom an F or an
    # I of each stage wakes on another rank, and each action's longest path to the end.
    links = rule_links(clock)
    wake_f, wake_i = links.wake_rank[:S], links.wake_rank[S:2 * S]
    at_f, at_i = links.wake_at[:S], links.wake_at[S:2 * S]
    # Room kept for what a rank must still hold to make progress: recomputation
    # re-materialises at the start of I; with two chunks, a forward of the first keeps room
    # for one forward of the later chunk. One is enough: every stage runs its Fs and Is in
    # microbatch order, so the oldest unfinished microbatch is the one that room serves,
    # and it can always move on (W frees what else it needs).
    keep = [max((i0[s] for s in local[r]), default=0.0) for r in range(p)]
    later = [[f0[x] for x in local[where[s]] if x > s] for s in range(S)]  # (the rank's
    later_sum = [sum(v) for v in later]  # later chunks' F, one each: the room they keep)
    caps = [warmup_cap(knobs.cap, p, r, len(local[r])) for r in range(p)]
    tail_f, tail_i = links.tail[:S], links.tail[S:2 * S]  # (for ``critical``)

    nf, ni, nw = [0] * S, [0] * S, [0] * S
    orders: list[list[int]] = [[] for _ in range(p)]
    left = 3 * S * m
    heap = [(0.0, r) for r in range(p)]
    pop, push, pushpop = heapq.heappop, heapq.heappush, heapq.heappushpop
    wake = None  # the rank's own next wake-up, pushed and popped in one (heappushpop)
    append = [o.append for o in orders]  # (locals: read once per action)
    critical, deep_first, wait_i, lazy_w = (knobs.critical, knobs.deep_first, knobs.wait_i,
                                            knobs.lazy_w)

    if one_stage and all(len(mine) == 1 for mine in local):  # (the loop placement)
        one = [mine[0] for mine in local]
        while heap or wake:
            t, r = pop(heap) if wake is None else pushpop(heap, wake)
            wake = None
            te = t + _EPS
            if free[r] > te:
                continue
            s = one[r]
            u, room = used[r], lim[r]
            soon = _INF
            # 1. I (the same choices as the loop below, with one stage to choose from)
            j = ni[s]
            pick_i = False
            if j < nf[s]:
                at = ready[xi[s] + j]
                if at <= te:
                    pick_i = u + i0[s] <= room
                else:
                    soon = at
            if pick_i and critical:
                jf = nf[s]
                if (jf < m and tail_f[s] > tail_i[s]
                        and (s == 0 or ready[xf[s] + jf] < t + dur_i[s] - _EPS)
                        and u + f0[s] + keep[r] + later_sum[s] <= room
                        and not jf - j >= caps[r]):
                    pick_i = False
            if pick_i:
                x = xi[s] + j
                wake = (place(x, t), r)
                ni[s] = j + 1
                append[r](x)
                q = wake_i[s]
                if q >= 0:
                    x = ready[at_i[s] + j]
                    if free[q] < x:
                        push(heap, (x, q))
                left -= 1
                continue
            # 2. F
            pick_f = blocked = False
            jf = nf[s]
            if jf < m:
                at = ready[xf[s] + jf]
                if at != _INF:
                    if u + f0[s] + keep[r] > room or jf - j >= caps[r]:
                        blocked = at <= te
                    elif at <= te:
                        pick_f = True
                    elif at < soon:
                        soon = at
            if pick_f and not (wait_i and soon < t + dur_f[s] - _EPS and j < jf
                               and ready[xi[s] + j] <= soon + _EPS):
                x = xf[s] + jf
                wake = (place(x, t), r)
                nf[s] = jf + 1
                append[r](x)
                q = wake_f[s]
                if q >= 0:
                    x = ready[at_f[s] + jf]
                    if free[q] < x:
                        push(heap, (x, q))
                left -= 1
                continue
            # 3. W
            jw = nw[s]
            pick_w = jw < j
            if pick_w and (blocked or pick_f or not lazy_w or soon >= t + dur_w[s] - _EPS):
                x = xw[s] + jw
                wake = (place(x, t), r)
                nw[s] = jw + 1
                append[r](x)
                left -= 1
                continue
            if pick_f or pick_w:
                wake = (soon, r)
        return (None if left else (orders, clock.step_time, clock.span_idle))

    if one_stage and all(len(mine) == 2 for mine in local):  # (the V placement)
        while heap or wake:
            t, r = pop(heap) if wake is None else pushpop(heap, wake)
            wake = None
            te = t + _EPS
            if free[r] > te:
                continue
            mine = local[r]
            a, b = mine  # a < b: b is a's later chunk
            u, room = used[r], lim[r]
            soon = _INF
            # 1. I (the loop below's choices, its scans over the rank's two stages unrolled)
            pick_i = -1
            j = ni[a]
            if j < nf[a]:
                at = ready[xi[a] + j]
                if at <= te:
                    if u + i0[a] <= room:
                        best, pick_i = at, a
                else:
                    soon = at
            j = ni[b]
            if j < nf[b]:
                at = ready[xi[b] + j]
                if at <= te:
                    if (pick_i < 0 or at < best) and u + i0[b] <= room:
                        pick_i = b
                elif at < soon:
                    soon = at
            if pick_i >= 0 and critical:
                for s in mine:
                    j = nf[s]
                    if (j < m and tail_f[s] > tail_i[pick_i]
                            and (s == 0 or ready[xf[s] + j] < t + dur_i[pick_i] - _EPS)
                            and u + f0[s] + keep[r] + later_sum[s] <= room
                            and not (s == a and nf[s] - ni[s] >= caps[r])):
                        pick_i = -1
                        break
            if pick_i >= 0:
                s = pick_i
                j = ni[s]
                x = xi[s] + j
                wake = (place(x, t), r)
                ni[s] = j + 1
                append[r](x)
                q = wake_i[s]
                if q >= 0:
                    x = ready[at_i[s] + j]
                    if free[q] < x:
                        push(heap, (x, q))
                left -= 1
                continue
            # 2. F (a keeps room for one F of b; the warm-up cap counts a)
            pick_f = -1
            blocked = False
            j = nf[a]
            if j < m:
                at = ready[xf[a] + j]
                if at != _INF:
                    need = u + f0[a] + keep[r]
                    for v in later[a]:
                        need += v
                    if need > room or j - ni[a] >= caps[r]:
                        blocked = at <= te
                    elif at <= te:
                        pick_f = a
                    else:
                        soon = at if at < soon else soon
            j = nf[b]
            if j < m:
                at = ready[xf[b] + j]
                if at != _INF:
                    need = u + f0[b] + keep[r]
                    for v in later[b]:
                        need += v
                    if need > room:
                        blocked = blocked or at <= te
                    elif at <= te:
                        if pick_f < 0 or (deep_first or j < nf[a]):
                            pick_f = b
                    elif at < soon:
                        soon = at
            if pick_f >= 0 and not (wait_i and soon < t + dur_f[pick_f] - _EPS
                                    and _i_is_next(mine, ni, nf, soon, ready, xi)):
                s = pick_f
                j = nf[s]
                x = xf[s] + j
                wake = (place(x, t), r)
                nf[s] = j + 1
                append[r](x)
                q = wake_f[s]
                if q >= 0:
                    x = ready[at_f[s] + j]
                    if free[q] < x:
                        push(heap, (x, q))
                left -= 1
                continue
            # 3. W: the older I's
            pick_w = -1
            j = nw[a]
            if j < ni[a]:
                oldest, pick_w = end[xi[a] + j], a
            j = nw[b]
            if j < ni[b] and (pick_w < 0 or end[xi[b] + j] < oldest):
                pick_w = b
            if pick_w >= 0 and (blocked or pick_f >= 0 or not lazy_w
                                or soon >= t + dur_w[pick_w] - _EPS):
                s = pick_w
                x = xw[s] + nw[s]
                wake = (place(x, t), r)
                nw[s] += 1
                append[r](x)
                left -= 1
                continue
            if pick_f >= 0 or pick_w >= 0:
                wake = (soon, r)
        return (None if left else (orders, clock.step_time, clock.span_idle))

    while heap or wake:
        t, r = pop(heap) if wake is None else pushpop(heap, wake)
        wake = None
        te = t + _EPS
        if free[r] > te:
            continue
        mine = local[r]
        u, room = used[r], lim[r]  # (placing an action ends the turn: read once)
        soon = _INF  # earliest known arrival of an I or an allowed F (for the knobs)
        # 1. I: the critical path.
        pick_i = -1
        best = _INF
        for s in mine:
            j = ni[s]
            if j < nf[s]:
                at = ready[xi[s] + j]
                if at <= te:
                    if at < best and u + i0[s] <= room:
                        best, pick_i = at, s
                elif at < soon:
                    soon = at
        if pick_i >= 0 and critical:
            for s in mine:  # an allowed F with a longer way to go, there before the I
                j = nf[s]  # would end, runs first (waiting for it if need be)
                if (j < m and tail_f[s] > tail_i[pick_i]
                        and (s == 0 or ready[xf[s] + j] < t + dur_i[pick_i] - _EPS)
                        and u + f0[s] + keep[r] + later_sum[s] <= room
                        and not (s == mine[0] and nf[s] - ni[s] >= caps[r])):
                    pick_i = -1
                    break
        if pick_i >= 0:
            s = pick_i
            j = ni[s]
            x = xi[s] + j
            wake = (place(x, t), r)
            ni[s] = j + 1
            append[r](x)
            q = wake_i[s]  # the stage before, if it lives on another rank
            if q >= 0:
                x = ready[at_i[s] + j]
                if free[q] < x:
                    push(heap, (x, q))
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
            at = ready[xf[s] + j]
            if at == _INF:
                continue
            need = u + f0[s] + keep[r]
            if later[s]:  # (mostly empty: one chunk, or the rank's last)
                for v in later[s]:
                    need += v
            if need > room or (s == first and j - ni[s] >= caps[r]):
                blocked = blocked or at <= te
                continue
            if at <= te:
                if pick_f < 0 or (s > pick_f if deep_first else j < nf[pick_f]):
                    pick_f = s
            elif at < soon:
                soon = at
        if pick_f >= 0 and not (wait_i and soon < t + dur_f[pick_f] - _EPS
                                and _i_is_next(mine, ni, nf, soon, ready, xi)):
            s = pick_f
            j = nf[s]
            x = xf[s] + j
            wake = (place(x, t), r)
            nf[s] = j + 1
            append[r](x)
            q = wake_f[s]  # the stage after, if it lives on another rank
            if q >= 0:
                x = ready[at_f[s] + j]
                if free[q] < x:
                    push(heap, (x, q))
            left -= 1
            continue
        # 3. W: fills a gap, or frees memory for a blocked F.
        pick_w = -1
        oldest = _INF
        for s in mine:
            j = nw[s]
            if j < ni[s] and end[xi[s] + j] < oldest:
                oldest, pick_w = end[xi[s] + j], s
        if pick_w >= 0 and (blocked or pick_f >= 0 or not lazy_w
                            or soon >= t + dur_w[pick_w] - _EPS):
            s = pick_w
            x = xw[s] + nw[s]
            wake = (place(x, t), r)
            nw[s] += 1
            append[r](x)
            left -= 1
            continue
        if pick_f >= 0 or pick_w >= 0:
            # The knobs chose to wait for something already on its way: wake up then.
            wake = (soon, r)
    if left:
        return None
    return orders, clock.step_time, clock.span_idle


class Links(NamedTuple):
    """What the greedy reads of the dependency rule, per clock row (``kind S + stage``,
    kinds F, I, W), all from :attr:`Clock.consumers <pipebubble.sim.clock.Clock>` (the
    edges of :func:`~pipebubble.ir.deps.precedences`, with their lags):

    - ``wake_rank``: the other rank whose action waits for this row's output (-1: none;
      the rule hands an output to one neighbour stage at most), and ``wake_at`` that
      waiter's first action number (its row times m): placing this row's action for
      microbatch j may let that rank start action ``wake_at + j``;
    - ``tail``: the longest path from the action's start to the end of its microbatch
      (the W of its chain's first stage, where the gradient arrives last): its own
      duration, then the edge lag and tail of the longest waiter on that way (None for a
      row with no path there: the W of a later stage).
    """

    wake_rank: list[int]
    wake_at: list[int]
    tail: list[float | None]


def rule_links(clock: Clock) -> Links:
    """The :class:`Links` of ``clock``'s rule (once per greedy run: O(stages))."""
    S, m = clock.S, clock.m
    rows = clock.rows  # (rank, duration, ...) per row
    wake_rank, wake_at = [-1] * (3 * S), [0] * (3 * S)
    for row, waiters in enumerate(clock.consumers):
        others = [a for a, _ in waiters if rows[a][0] != rows[row][0]]
        if len(others) > 1:
            raise ValueError("the rule handed one output to two other ranks")
        if others:
            wake_rank[row], wake_at[row] = rows[others[0]][0], others[0] * m
    # Longest paths to the sinks, waiters first: the rows in the reverse of a topological
    # order of the rule's graph (Kahn's, on the clock's producer counts).
    sinks = {2 * S + s for s in clock.chain_starts}  # the Ws of the chains' first stages
    left = [0] * (3 * S)
    for waiters in clock.consumers:
        for a, _ in waiters:
            left[a] += 1
    order = [row for row in range(3 * S) if not left[row]]
    for row in order:  # (grows as it goes)
        for a, _ in clock.consumers[row]:
            left[a] -= 1
            if not left[a]:
                order.append(a)
    if len(order) != 3 * S:
        raise ValueError("the rule's graph has a cycle")
    tail: list[float | None] = [None] * (3 * S)
    for row in reversed(order):
        if row in sinks:
            tail[row] = rows[row][1]
            continue
        best = None
        for a, lag in clock.consumers[row]:
            t = tail[a]
            if t is not None and (best is None or lag + t > best):
                best = lag + t
        if best is not None:
            tail[row] = rows[row][1] + best
    return Links(wake_rank, wake_at, tail)


def _i_is_next(mine, ni, nf, soon, ready, xi) -> bool:
    """True if the earliest known arrival on this rank is an I (``wait_i`` waits only for
    those: the input gradient is on the critical path, a later F is not)."""
    for s in mine:
        j = ni[s]
        if j < nf[s] and ready[xi[s] + j] <= soon + _EPS:
            return True
    return False
