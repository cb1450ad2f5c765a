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
2. count each block's steady-state peak per rank without building it
   (:func:`steady_peaks`), keep those within the limit, most memory first (the unit-cost
   bound ``6m + 6p - 1 - 3k`` falls as the peak k grows), then the shortest block (least
   fill);
3. build the few best as orders (on ``2p + 6`` microbatches, the steady state then
   repeated up to m: ``schedules/periodic.py``): repeated, warm-up and cool-down
   reordered without raising the peak (``building_block.reorder_ends``, which keeps the
   block's steady state and so stays free of a repeating bubble under comm and W != F),
   and the list-scheduled reorder; under a limit, each warm-up-filled order also with its
   cool-down laid out as a wave (:func:`wave_cooldown`); the caller scores every order
   with the simulator and keeps what fits.

It stops when its :class:`~.budget.Budget` is spent; every pass of a block is charged
(:func:`_build_cost`: its list schedules, the deep warm-up, the cool-down wave) and the
caller charges the scoring of each order (:func:`score_cost`). Deterministic: the
enumeration's order is fixed, nothing is random, and the budget counts work, not time.
What depends on neither the costs nor the limit is kept between requests (the blocks of a
``p`` with their steady peaks, and the orders built from a block): a planner or a memory
sweep asks for the same blocks many times. The ledger is charged as for a cold request,
so a warm one finds the same orders, only sooner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache

from ...costs import StageCosts, fit_bound, fits_limit
from ...ir.schedule import Action, PackedOrder, ScheduleError, v_placement
from ...sim.clock import Clock
from ..building_block import PERIOD, block, peak, place_w, reorder, reorder_ends, repeat
from ..periodic import extend
from .budget import WORK_PER_SECOND, Budget

__all__ = ["WORK_PER_SECOND", "Budget", "adaptive_orders", "candidate_blocks", "steady_peaks",
           "switched_block", "wave_cooldown", "warmup_targets", "score_cost"]

# Blocks built first, where they fit: V-Half's chunk offsets with the turn 4/5 and top 1
# (under the controllable-memory paper's Table 8 costs faster than V-Half itself from
# p = 16 on: p = 24, m = 72 in 88.89 microbatches against 89.08), and its mirror.
PREFERRED = [(2, 1, 1, 2, 4, 5, 1), (1, 2, 2, 1, 4, 5, 1)]
BUILD_AT_MOST = 16  # blocks built and scored, at most (each costs about one small reorder)
PASS_WORK = 0.5  # work units of one list-schedule pass, per p x microbatch of the small instance
GROW_WORK = 0.3  # work units of growing one order to m (``periodic.extend``), per action
SCORE_WORK = 0.2  # work units of the simulator's scoring of an order, per action
ENUMERATE_WORK = (1 / 20, 1 / 10)  # work units per rank and turn tried (uniform, switched)
RANK_WORK = 1.0  # work units per rank of counting one block's steady peaks (ranking it)


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
    return t_f, t_i, place_w(t_i, taken, rank)


def _switched_free(p: int, near: int, far: int, switch: int) -> list[bool]:
    """Per turn of :data:`_TURNS`, whether :func:`switched_block` finds no collision (its
    forward and input-gradient times in closed form, every turn at once by numpy): tF of
    stage s is its hops' sum, plus ``turn_f`` from stage p on; tI is tF of the last stage
    plus ``top`` plus the hops back, plus ``turn_i`` from stage p - 1 down. A rank's two
    stages' four times must differ modulo 6."""
    import numpy as np

    S = 2 * p
    step = [near if r < switch else far for r in range(p - 1)]
    base_f = [0] * S  # tF without turn_f
    for s in range(1, S):
        base_f[s] = base_f[s - 1] + (0 if s == p else step[s - 1] if s < p else 1)
    base_i = [0] * S  # tI - (tF[S-1] + top) without turn_i
    for s in range(S - 2, -1, -1):
        gap = 0 if s == p - 1 else 1 if s < p - 1 else step[S - 2 - s]
        base_i[s] = base_i[s + 1] + gap
    turns = np.array(_TURNS, dtype=np.int64)  # (turn_f, turn_i, top)
    tf, ti, top = turns[:, 0:1], turns[:, 1:2], turns[:, 2:3]
    up = np.arange(S) >= p  # stages past the turn of the forwards
    t_f = np.array(base_f)[None, :] + tf * up
    t_i = t_f[:, S - 1:S] + top + np.array(base_i)[None, :] + ti * ~up
    r = np.arange(p)
    four = np.stack([t_f[:, r], t_i[:, r], t_f[:, S - 1 - r], t_i[:, S - 1 - r]], axis=2)
    four = np.sort(four % PERIOD, axis=2)
    return (np.diff(four, axis=2) != 0).all(axis=(1, 2)).tolist()


def _collides(p: int, a: int, b: int, turn_f: int, turn_i: int, top: int) -> bool:
    """Whether the uniform block (a, b, b, a, turns) puts two F or I of a rank in one slot
    modulo 6 (``building_block.block``'s test, on the closed-form times of rank r's two
    stages r and 2p-1-r, without building the block)."""
    f_top = a * (p - 1) + turn_f + b * (p - 1)  # tF of stage 2p-1
    i_turn = f_top + top + a * (p - 1) + turn_i  # tI of stage p-1
    for r in range(p):
        f0 = a * r
        f1 = f_top - b * r
        i1 = f_top + top + a * r
        i0 = i_turn + b * (p - 1 - r)
        if len({f0 % PERIOD, f1 % PERIOD, i1 % PERIOD, i0 % PERIOD}) < 4:
            return True
    return False


def candidate_blocks(p: int, budget: Budget | None = None, family: str = "all"
                     ) -> list[tuple[tuple[int, ...], tuple[list[int], ...]]]:
    """The collision-free blocks of ``family`` (``uniform``: a, b in 1..5; ``switched``:
    near/far offsets that switch at a rank; ``all``: both, in that order) while
    ``budget`` lasts (charged per group of turns tried)."""
    return [(offsets, times) for offsets, times, _ in _candidates(p, budget, family)]


def _candidates(p: int, budget: Budget | None, family: str
                ) -> list[tuple[tuple[int, ...], tuple[list[int], ...], tuple[int, ...]]]:
    """:func:`candidate_blocks` with each block's :func:`steady_peaks`. The blocks depend
    on ``p`` alone, so each group is enumerated once (:func:`_group`) and kept; the ledger
    is charged per group as if it were enumerated again (the same charges, so the same
    search, whether or not an earlier request made them)."""
    out = []
    for fam, work in (("uniform", ENUMERATE_WORK[0]), ("switched", ENUMERATE_WORK[1])):
        if family not in ("all", fam):
            continue
        for n in range(_group_count(p, fam)):
            if budget is not None and not budget.spend(work * p * len(_TURNS), "adaptive V"):
                return out
            out += _group(p, fam, n)
    return out


_TURNS = [(tf, ti, top) for tf in range(1, 7) for ti in range(1, 7) for top in range(1, 7)]
_SWITCHED = [(near, far) for near in range(2, 6) for far in range(1, near)]


def _group_count(p: int, family: str) -> int:
    """How many groups :func:`_group` has: one per (a, b) in 1..5 (uniform), one per
    (near, far, switch) (switched)."""
    return 25 if family == "uniform" else len(_SWITCHED) * max(0, p - 2)


@lru_cache(maxsize=16384)
def _group(p: int, family: str, n: int) -> tuple:
    """Group ``n`` of ``family``'s blocks (uniform: (a, b) = divmod(n, 5) + 1; switched:
    (near, far) = _SWITCHED[n // (p - 2)], switch n % (p - 2) + 1) over every turn, each
    as (offsets, times, steady peaks); made once (they depend on nothing else)."""
    group = []
    if family == "uniform":
        a, b = n // 5 + 1, n % 5 + 1
        for turn in _TURNS:
            if _collides(p, a, b, *turn):
                continue
            offsets = (a, b, b, a, *turn)
            try:
                times = block(p, offsets)
            except ScheduleError:
                continue
            group.append((offsets, times, tuple(steady_peaks(p, times))))
    else:
        (near, far), switch = _SWITCHED[n // (p - 2)], n % (p - 2) + 1
        free = _switched_free(p, near, far, switch)
        for turn, ok in zip(_TURNS, free, strict=True):
            if not ok:
                continue  # switched_block would return None
            times = switched_block(p, near, far, switch, *turn)
            if times is not None:
                group.append(((near, far, switch, *turn), times,
                              tuple(steady_peaks(p, times))))
    return tuple(group)


def steady_peaks(p: int, times: tuple[list[int], ...]) -> list[int]:
    """Chunk activations each rank holds at most once the block repeats every 6 units (F
    adds one as it starts, W frees it as it starts): at phase ``x mod 6`` stage s holds
    one activation for every unit of ``[tF, tW)`` with that phase (counted in closed form:
    the units of ``[a, b)`` at phase ``ph`` are ``ceil((b - ph) / 6) - ceil((a - ph) / 6)``).
    The warm-up, a part of the same pattern, holds no more.

    >>> steady_peaks(1, ([0, 1], [3, 2], [9, 4]))  # [0, 9) and [1, 4): phases 1-2 hold 3
    [3]
    """
    import numpy as np

    t_f, _, t_w = times
    S = 2 * p
    ph = np.arange(PERIOD, dtype=np.int64)[None, :]  # (integer floor division, as Python's)
    a = np.asarray(t_f, dtype=np.int64)[:, None]
    b = np.asarray(t_w, dtype=np.int64)[:, None]
    held = np.maximum(0, (b - ph + PERIOD - 1) // PERIOD - (a - ph + PERIOD - 1) // PERIOD)
    per_phase = held[:p] + held[S - 1:p - 1:-1]  # rank r: stages r and S - 1 - r
    return per_phase.max(axis=1).tolist()


def adaptive_orders(p: int, m: int, sc: StageCosts, limits: list[float] | None,
                    budget: Budget) -> Iterator[tuple[str, list[list[Action]]]]:
    """(source, per-rank orders) of the most promising blocks within ``limits`` (per rank,
    in the units of ``sc``'s memory), best first, while ``budget`` lasts."""
    chunk_mb = [max(sum(sc.memory_deltas(s, "F")) for s in (r, 2 * p - 1 - r))
                for r in range(p)]
    preferred = []  # built before the enumeration, in this order
    for offsets in PREFERRED:
        try:
            preferred.append((offsets, block(p, offsets)))
        except ScheduleError:
            continue
    k = None  # chunk activations the limit allows every rank (for the warm-up fill)
    if limits is not None:
        k = min(2 * p, min(int(fit_bound(lim) / c) for lim, c in zip(limits, chunk_mb,
                                                                   strict=True)))
    ranked = []
    for n, (offsets, times) in enumerate(preferred):
        held = steady_peaks(p, times)
        if limits is None or all(fits_limit(h * c, lim) for h, c, lim
                                 in zip(held, chunk_mb, limits, strict=True)):
            ranked.append((n, offsets, times))
    seen: set[tuple] = set()
    small = min(m, 2 * p + 6)  # built on a few microbatches, the steady state repeated
    for _n, offsets, times in ranked:  # V-Half's kin: their own warm-up is the best one
        if not budget.spend(_build_cost(p, m, small, times, None), "adaptive V"):
            return
        seen.add((tuple(times[0]), tuple(times[1]), tuple(times[2])))
        yield from _built(p, m, small, offsets, times, None, budget)
    for family in ("uniform", "switched"):  # each enumerated, ranked and built in turn
        ranked = []
        for offsets, times, held in _candidates(p, budget, family):
            if not budget.spend(RANK_WORK * p, "adaptive V"):
                return
            if limits is not None and any(not fits_limit(h * c, lim) for h, c, lim
                                          in zip(held, chunk_mb, limits, strict=True)):
                continue
            length = times[2][0] - times[0][0]  # a microbatch's whole block on rank 0
            ranked.append((-max(held), length, offsets, times))
        ranked.sort(key=lambda x: x[:3])
        built = 0
        for _neg, _length, offsets, times in ranked:
            key = (tuple(times[0]), tuple(times[1]), tuple(times[2]))
            if key in seen:
                continue
            if built >= BUILD_AT_MOST:
                break
            if not budget.spend(_build_cost(p, m, small, times, k), "adaptive V"):
                return
            seen.add(key)
            built += 1
            yield from _built(p, m, small, offsets, times, k, budget)


KEEP_ACTIONS = 4_000_000  # actions of built orders kept for later requests (_built), at most
_KEPT: OrderedDict[tuple, tuple] = OrderedDict()  # (p, m, small, offsets, times, k) -> built orders
_kept_actions = 0


def _built(p: int, m: int, small: int, offsets: tuple[int, ...],
           times: tuple[list[int], ...], k: int | None, budget: Budget | None = None
           ) -> Iterator[tuple[str, list[list[Action]]]]:
    """:func:`_build`'s orders, which depend on the block, ``p``, ``m`` and ``k`` alone (no
    cost, no limit): kept for later requests (a planner or a memory sweep asks for the
    same blocks under other costs), the least recently used dropped past
    :data:`KEEP_ACTIONS` actions. The caller charges the ledger the same either way."""
    global _kept_actions
    key = (p, m, small, offsets, tuple(map(tuple, times)), k)
    got = _KEPT.get(key)
    if got is not None:
        _KEPT.move_to_end(key)
        for name, orders in got:
            if budget is not None and budget.late():
                return
            yield name, [o if isinstance(o, PackedOrder) else list(o) for o in orders]
        return
    made = []
    for name, orders in _build(p, m, small, offsets, times, k, budget):
        # a packed order (periodic.extend's RankOrder, immutable) is kept as it is: made
        # into a tuple of Actions it cost as much as the build, and came back unpacked
        made.append((name, tuple(o if isinstance(o, PackedOrder) else tuple(o)
                                 for o in orders)))
        yield name, orders
    if budget is not None and budget.late():
        return  # cut short: not kept
    _KEPT[key] = tuple(made)
    _kept_actions += sum(len(o) for _, orders in made for o in orders)
    while _kept_actions > KEEP_ACTIONS and len(_KEPT) > 1:
        _, old = _KEPT.popitem(last=False)
        _kept_actions -= sum(len(o) for _, orders in old for o in orders)


def _build(p: int, m: int, small: int, offsets: tuple[int, ...],
           times: tuple[list[int], ...], k: int | None, budget: Budget | None = None
           ) -> Iterator[tuple[str, list[list[Action]]]]:
    """The block's orders, built on ``small`` microbatches and extended to ``m``: ends
    reordered, list-scheduled reorder, and (when the limit allows ``k`` chunk activations
    a rank, at least the block's peak) the ends-reordered block with its warm-up filled up
    to ``k`` (:func:`warmup_targets`), with and without filling holes, and with the
    deep warm-up (``building_block.reorder``'s ``deep``: the memory kept full through
    the input gradients of the later chunk, up to the rank's first chunk-0 one)."""
    rows = repeat(p, small, times)
    cap, cap_i = peak(p, rows), peak(p, rows, frees="I")
    name = "adaptive block " + ",".join(map(str, offsets))
    moved = reorder_ends(p, small, times, cap, cap_i)
    # (label, base orders, cap, cap_i, fill, warm-up targets, deep)
    tries = [(" (ends reordered)", moved, cap, cap_i, False, None, 0),
             (" (reordered)", rows, cap, cap_i, True, None, 0)]
    if k is not None and k >= cap:
        targets = warmup_targets(p, small, k)
        for fill in (True, False):
            tries.append((f" (warm-up to {k}{', holes filled' if fill else ''})", moved, k,
                          max(k, cap_i), fill, targets, 0))
        # the memory kept full up to the rank's first chunk-0 I (the paper's warm-up)
        tries.append((f" (deep warm-up to {k}, holes filled)", moved, k, max(k, cap_i),
                      True, targets, 1))
    for label, base, c, c_i, fill, targets, deep in tries:
        if budget is not None and budget.late():
            return  # past an asked-for deadline: the block is charged already, its rest not built
        got = reorder(p, small, base, c, c_i, fill=fill, warmup=targets, deep=deep)
        if got is None:
            continue
        if (grown := extend(got[1], small, m, [6] * p, packed=True)) is not None:
            yield name + label, grown
        if targets is not None and (waved := wave_cooldown(p, small, got[1], k)) is not None:
            if (grown := extend(waved, small, m, [6] * p, packed=True)) is not None:
                yield name + label + " (cool-down wave)", grown


def wave_cooldown(p: int, m: int, orders: list[list[Action]], k: int
                  ) -> list[list[Action]] | None:
    """``orders`` (V placement, ``m`` microbatches) with the cool-down laid out as a wave,
    the controllable-memory paper's cool-down for a peak of ``k`` chunk activations: after
    the last forward of the last stage (at unit time ``t0``, every pass one unit, no comm)
    rank i runs the input gradients of its chunk-0 stage for the last ``ceil(k/2)``
    microbatches at ``t0 + 2p - i - 2j`` (j = 0, 1, ...: a wave from rank p-1 down to
    rank 0, two units apart, each I one unit after the one it waits for) and those of its
    chunk-1 stage for the last ``min(i + 1, k - ceil(k/2))`` at ``t0 + 1 + i - 2j`` (the
    wave up from rank 0). Every other pass keeps its unit time; the weight gradients of
    the moved I and those after the rank's last forward wait in a pool. Then each rank
    runs its passes in that time order, and in a hole (the next one not ready) a ready
    pooled W (oldest first), else the first ready I it has later; a W or an I run early
    never raises the memory (only a forward adds). None if the order stalls. Both the
    unit times and that list schedule run on the kernel's clock of unit passes
    (``sim/clock.Clock.units``: the rule of ``ir/deps.py``), passes by its numbers.

    Under unit costs at p = 8, m = 32 this turns the adaptive stage's 213 (k = 9) and 207
    (k = 11) into 212 and 206, the bound ``6m + 6p - 1 - 3k``: the cool-down had idle
    units where the wave has none. The caller scores the result and checks the limit
    (moving an I later keeps its activation longer).
    """
    S = 2 * p
    base = {"F": 0, "I": S, "W": 2 * S}  # kind S, by kind: x = (kind S + stage) m + j
    ids = [[(base[a.kind] + a.stage) * m + a.microbatch for a in order] for order in orders]
    start = _unit_times(p, m, ids)
    if start is None:
        return None
    t0 = start[(S - 1) * m + m - 1]  # the last F of the last stage
    late0 = min(m, (k + 1) // 2)
    target: dict[int, int] = {}  # clock number -> its unit in the wave
    for i in range(p):
        for j in range(late0):
            target[(S + i) * m + m - 1 - j] = t0 + 2 * p - i - 2 * j
        for j in range(max(0, min(i + 1, k - late0, m))):
            target[(2 * S - 1 - i) * m + m - 1 - j] = t0 + 1 + i - 2 * j
    fixed, pools = [], []
    Sm = S * m  # the first I's number; a W's I is Sm before it
    for row_ids in ids:
        last_f = max(start[x] for x in row_ids if x < Sm)
        row, pool = [], []
        for n, x in enumerate(row_ids):
            if x >= 2 * Sm and (start[x] > last_f or x - Sm in target):
                pool.append(x)
            else:
                t = target.get(x)
                row.append((start[x] if t is None else t, t is not None, n, x))
        row.sort()
        fixed.append([e[3] for e in row])
        pools.append(pool)
    got = _fill_holes(p, m, fixed, pools)
    if got is None:
        return None
    by_id: list = [None] * (3 * Sm)
    for row_ids, order in zip(ids, orders, strict=True):
        for x, a in zip(row_ids, order, strict=True):
            by_id[x] = a
    return [[by_id[x] for x in row] for row in got]


def _unit_times(p: int, m: int, ids: list[list[int]]) -> list[int] | None:
    """Each pass's start, by its clock number, with every pass one unit and no comm, run
    in the given orders ``ids`` (squeezed: as early as its order and its inputs allow;
    the kernel's rule on :meth:`~pipebubble.sim.clock.Clock.units`); None if they stall."""
    clock = Clock.units(v_placement(p), m)
    earliest, place, end = clock.earliest, clock.place, clock.end
    head = [0] * p
    left = sum(len(o) for o in ids)
    never = float("inf")
    while left:
        moved = False
        for r, row in enumerate(ids):
            h, n = head[r], len(row)
            while h < n:
                x = row[h]
                t = earliest(x)
                if t == never:
                    break
                place(x, t)
                h += 1
            if h != head[r]:
                left -= h - head[r]
                head[r], moved = h, True
        if not moved:
            return None
    return [e - 1 for e in end]


def _first_ready(rows: list[int], where: list[int], nxt: list[int], ready: list[float],
                 m: int, t: int) -> int:
    """Of the next passes of ``rows`` (``nxt``: each row's next microbatch) that sit in a
    list (``where``: their place in it, -1 if absent) and are ready by ``t``, the one
    earliest in the list; -1 if none."""
    pick, at = -1, -1
    for row in rows:
        j = nxt[row]
        if j < m:
            x = row * m + j
            q = where[x]
            if q >= 0 and ready[x] <= t and (pick < 0 or q < at):
                pick, at = x, q
    return pick


def _fill_holes(p: int, m: int, fixed: list[list[int]], pools: list[list[int]]
                ) -> list[list[int]] | None:
    """A unit-time list schedule on :meth:`~pipebubble.sim.clock.Clock.units` (passes by
    clock number): each rank runs ``fixed`` in order; when its next pass is not ready it
    runs a ready W of its ``pool`` (in pool order), else the first ready I later in
    ``fixed``; every stage's passes of a kind in microbatch order."""
    S = 2 * p
    clock = Clock.units(v_placement(p), m)
    ready, place_at = clock.ready, clock.place_at
    rank = v_placement(p)
    nxt = [0] * (3 * S)  # next microbatch per row (kind S + stage)
    ran = [False] * (3 * S * m)
    head = [0] * p
    out: list[list[int]] = [[] for _ in range(p)]
    left = sum(len(f) + len(q) for f, q in zip(fixed, pools, strict=True))
    t, idle = 0, 0
    # Where each pass sits in its rank's ``fixed`` and ``pool`` (-1: not there). A pass
    # that may run is its row's next (microbatch order), so the first ready one of a
    # list is the ready next pass of one of the rank's rows that sits earliest there:
    # every earlier entry of the list ran already (a row's passes run in order), or is
    # not its row's next.
    in_fixed, in_pool = [-1] * (3 * S * m), [-1] * (3 * S * m)
    for seq in fixed:
        for n, x in enumerate(seq):
            in_fixed[x] = n
    for pool in pools:
        for n, x in enumerate(pool):
            in_pool[x] = n
    stages = [[s for s in range(S) if rank[s] == r] for r in range(p)]
    rows_i = [[S + s for s in mine] for mine in stages]  # the rank's I rows
    rows_all = [[k * S + s for k in range(3) for s in mine] for mine in stages]

    while left:
        picks = []
        for r in range(p):
            seq = fixed[r]
            h, n = head[r], len(seq)
            while h < n and ran[seq[h]]:
                h += 1
            head[r] = h
            if h < n:
                x = seq[h]
                if nxt[x // m] == x % m and ready[x] <= t:
                    picks.append(x)
                    continue
            # the first ready pass of its pool (in pool order), else its first ready I
            # later in ``fixed``
            pick = _first_ready(rows_all[r], in_pool, nxt, ready, m, t)
            if pick < 0:
                pick = _first_ready(rows_i[r], in_fixed, nxt, ready, m, t)
            if pick >= 0:
                picks.append(pick)
        idle = idle + 1 if not picks else 0
        if idle > 1:  # nothing ran for two units: nothing will (unit passes)
            return None
        for x in picks:
            nxt[x // m] += 1
            ran[x] = True
            out[rank[x // m % S]].append(x)
        left -= len(picks)
        place_at(picks, t)
        t += 1
    return out


def warmup_targets(p: int, m: int, k: int) -> list[tuple[int, int]]:
    """(chunk-0, chunk-1) forwards rank r runs before its first I to hold ``k`` chunk
    activations then (the paper's warm-up, which fills the memory the block leaves): as
    many of the later chunk as the V lets arrive, ``min(r + 1, k // 2)``, the rest of the
    earlier one."""
    out = []
    for r in range(p):
        late = min(r + 1, k // 2, m)
        out.append((min(k - late, m), late))
    return out


def _build_cost(p: int, m: int, small: int, times: tuple[list[int], ...],
                k: int | None) -> float:
    """Work units of one block's orders: its passes over the small instance (``PASS_WORK``
    a rank and microbatch each: the ends reorder and the list-scheduled reorder; when the
    warm-up is filled, its two list schedules, the deep warm-up's and the cool-down wave of
    each of the three, :func:`wave_cooldown`: a unit-time pass and a list schedule) and
    the growing of each order to ``m`` (``GROW_WORK`` an action: two orders, or six with
    the warm-up filled). Measured, the growing is most of it from p = 16, m = 64 on. The
    scoring of the orders is the caller's (:func:`score_cost`)."""
    filled = k is not None and k >= max(steady_peaks(p, times))
    passes, orders = (11, 6) if filled else (2, 2)
    return passes * PASS_WORK * p * small + orders * GROW_WORK * 6 * p * m


def score_cost(orders: list[list[Action]]) -> float:
    """Work units of scoring one order with the simulator (``SCORE_WORK`` an action)."""
    return SCORE_WORK * sum(len(o) for o in orders)
