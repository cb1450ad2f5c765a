"""The building-block construction of Qi et al. 2024, *Pipeline Parallelism with
Controllable Memory* (NeurIPS 2024), for the V placement.

A *building block* is where one microbatch's passes sit in time, with every pass (F, I, W
of one chunk) one time unit: stage s's forward at ``tF[s]``, its input gradient at
``tI[s]``, its weight gradient at ``tW[s]``. Repeating the block every ``T = 6`` units (each
rank runs six passes per microbatch: F, I, W of two chunks) gives a schedule without two
passes of a rank colliding as long as each rank's six start times differ modulo 6. A
stage's activation lives from its F to the end of its W (the lifespan ``l``), so a rank
holds about ``sum over its stages of ceil(l / 6)`` chunk activations in the steady state:
short offsets between consecutive stages mean short lifespans and little memory.

The block is set by the *offsets* between consecutive stages: ``dF0``/``dF1`` between the
forwards of consecutive chunk-0/chunk-1 stages, ``dI0``/``dI1`` between their input
gradients, ``turn_f`` between the forwards of stages p-1 and p (both on rank p-1, the turn of
the V), ``turn_i`` between their input gradients, and ``top`` between the forward and the
input gradient of the last stage (on rank 0). Each W goes in the first free slot after its
I. The per-rank order is the repeated block sorted by time; the simulator then *squeezes*
it (every action as early as its order allows), which shortens warm-up and cool-down.

Every rank's two stages' F-to-I times add up to the same sum (``(p-1)(dF0 + dI0 + dF1 +
dI1) + 2 top + turn_f + turn_i``), so the memory is even across ranks; how that time splits
on rank p-1 decides whether the step reaches the bound of ``sim/formulas.v_shape_bound``:
at its last forward that rank must hold the full peak, every activation still waiting for
its I. V-Half (``v_half.py``) and V-Min (``v_min.py``) pick ``top`` (and V-Half the turn)
for that.

:func:`reorder_ends` then *reorders warm-up and cool-down* (the paper's last step): the
passes before the first microbatch's last I and after stage 0's last F move to earlier free
units within the block's peak, and the steady state between keeps its block times (so an
order that has no repeating bubble with unit passes keeps none under real costs: comm on
every hop, W shorter than F). :func:`reorder` re-times every pass as a list scheduler with
unit passes (with ``fill=False`` only in the cool-down); :func:`build` keeps the shortest.

>>> tF, tI, tW = block(2, (1, 1, 1, 1, 1, 1, 1))
>>> tF, tI, tW
([0, 1, 2, 3], [7, 6, 5, 4], [8, 10, 9, 5])
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache
from operator import itemgetter

from ..ir.schedule import Action, ScheduleError, make_schedule, v_placement
from ..sim.clock import Clock
from ..sim.program import memory_peak

PERIOD = 6
_ADDS = (1.0, 0.0, 0.0)  # chunk activations a pass adds at its start, by kind F, I, W


def block(p: int, offsets: tuple[int, ...], period: int = PERIOD
          ) -> tuple[list[int], list[int], list[int]]:
    """(tF, tI, tW) of one microbatch for ``p`` ranks; ``offsets`` = (dF0, dF1, dI0, dI1,
    turn_f, turn_i, top). Raises ScheduleError if two passes of a rank collide modulo
    ``period`` (6: no idle slot in the steady state; more: a microbatch every ``period``
    units, fewer activations in flight, for memory limits below the 6-unit block's)."""
    d_f0, d_f1, d_i0, d_i1, turn_f, turn_i, top = offsets
    S = 2 * p
    rank = [s if s < p else S - 1 - s for s in range(S)]
    t_f = [0] * S
    for s in range(1, S):
        t_f[s] = t_f[s - 1] + (turn_f if s == p else d_f0 if s < p else d_f1)
    t_i = [0] * S
    t_i[S - 1] = t_f[S - 1] + top
    for s in range(S - 2, -1, -1):
        t_i[s] = t_i[s + 1] + (turn_i if s == p - 1 else d_i0 if s < p - 1 else d_i1)
    taken: list[set[int]] = [set() for _ in range(p)]
    for s in range(S):
        for t in (t_f[s], t_i[s]):
            if t % period in taken[rank[s]]:
                raise ScheduleError(f"building block {offsets} collides on rank {rank[s]} "
                                    f"for p={p}")
            taken[rank[s]].add(t % period)
    return t_f, t_i, place_w(t_i, taken, rank, period)


def place_w(t_i: list[int], taken: list[set[int]], rank: list[int],
            period: int = PERIOD) -> list[int]:
    """Each stage's W in the first free slot of its rank after its I, stages in the order
    of their I (``taken``: each rank's slots mod ``period`` already used; updated)."""
    t_w = [0] * len(t_i)
    for s in sorted(range(len(t_i)), key=lambda s: t_i[s]):
        t = t_i[s] + 1
        while t % period in taken[rank[s]]:
            t += 1
        taken[rank[s]].add(t % period)
        t_w[s] = t
    return t_w


def repeat(p: int, microbatches: int, times: tuple[list[int], list[int], list[int]],
           period: int = PERIOD, packed: bool = False) -> list[list[Action]]:
    """Per-rank orders: the block repeated every ``period`` units, sorted by time (then by
    the clock's pass number). With ``packed``: as RankOrders, sorted by numpy (the same
    actions)."""
    t_f, t_i, t_w = times
    S, m = 2 * p, microbatches
    if packed:
        return _repeat_packed(p, m, times, period)
    acts = _actions(S, m)
    timed: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # (time, pass id)
    for s in range(S):
        row = timed[s if s < p else S - 1 - s]
        for k, t0 in enumerate((t_f[s], t_i[s], t_w[s])):
            lo = (k * S + s) * m
            row.extend(zip(range(t0, t0 + period * m, period), range(lo, lo + m), strict=True))
    return [[acts[x] for _, x in sorted(row)] for row in timed]


def _repeat_packed(p: int, m: int, times: tuple[list[int], list[int], list[int]],
                   period: int) -> list:
    """:func:`repeat` as RankOrders: each rank's (time, pass number) pairs sorted by
    ``np.lexsort``, the pass numbers ``(k S + s) m + j`` read back as stage, kind, j."""
    import numpy as np

    from ..ir.orders import RankOrder

    S = 2 * p
    j = np.arange(m, dtype=np.int64)
    out = []
    for r in range(p):
        at, ids = [], []
        for s in (r, S - 1 - r):
            for k, t0 in enumerate((times[0][s], times[1][s], times[2][s])):
                at.append(t0 + period * j)
                ids.append((k * S + s) * m + j)
        t, x = np.concatenate(at), np.concatenate(ids)
        x = x[np.lexsort((x, t))]
        out.append(RankOrder((x // m) % S, (x // (S * m)).astype(np.int8), x % m))
    return out


@lru_cache(maxsize=4)
def _actions(stages: int, m: int) -> tuple[Action, ...]:
    """Every pass of ``stages`` stages and ``m`` microbatches, by the clock's number
    ``(k stages + s) m + j`` (kind k 0, 1, 2 = F, I, W; ``sim/clock.py``): made once,
    shared by the orders (an Action is immutable). Made a row at a time with the tuple's
    own constructor (a NamedTuple's is a Python function: most of the cost)."""
    new, out = tuple.__new__, []
    for k in "FIW":
        for s in range(stages):
            out += map(new, [Action] * m, zip([s] * m, [k] * m, range(m), strict=True))
    return tuple(out)


DEEP_PRIORITY = "I0 I1 W0 W1 F1 F0"  # the deep warm-up's default pick order


def reorder(p: int, microbatches: int, orders: list[list[Action]], cap: int,
            cap_i: int | None = None, fill: bool = True,
            warmup: list[tuple[int, int]] | None = None, deep: int = 0
            ) -> tuple[int, list[list[Action]]] | None:
    """Re-time the block orders ``orders`` with every pass one unit long (the block's own
    units) and return ``(step, new orders)``, or None if the rules below stall.

    The paper reaches its step-time bound by squeezing the repeated block and then
    *reordering warm-up and cool-down*: the memory peak sits in the steady state, so passes
    at both ends may move as long as no rank holds more than it did. Here every rank, at
    every unit of time, runs one of its ready passes (``ir/deps.py``; each stage runs its
    F, I and W in microbatch order), chosen by these rules:

    1. *cool-down* (the rank has run all its forwards): an input gradient ``I`` before a
       weight gradient ``W`` (``I`` is on the critical path; ``W`` only frees memory, which
       no longer matters), each in block order;
    2. otherwise the rank's next pass in block order, if it is ready (the steady state is
       the block itself);
    3. else, to fill the hole, the first ready pass in block order: an ``I`` or a ``W``, or
       an ``F`` that the block runs later, but only if the rank's activations, counting it
       and every forward the block runs before it and that has not run yet, stay within
       ``cap`` (so no rank's peak grows and the skipped forwards still fit).

    A forward adds one chunk activation and its ``W`` frees it (``M_W = M_B``): ``cap`` is
    the most chunk activations a rank may hold so. ``cap_i`` (default: no cap) is the most
    it may hold counted from a forward to its ``I`` (``M_W = 0``). With both caps at the
    plain block's own peaks, neither end case holds more than the block; an ``M_W`` in
    between mixes the two counts (``tests/test_vshape.py`` checks ``M_W = M_B/2`` too).
    ``warmup`` (per rank: chunk-0 and chunk-1 forwards) fills the memory before the rank's
    first ``I``: it runs those forwards as they arrive, within the caps. With ``deep`` =
    n > 0 the warm-up lasts until the rank has run n passes (I or W) of its chunk-0 stage,
    and after its first ``I`` it picks by :data:`DEEP_PRIORITY` (the chunk-0 ``I``, the
    chunk-1 ``I``, their ``W`` s, then forwards while they fit): the controllable-memory
    paper's warm-up, which keeps the memory full through the V's first turn.
    Deterministic: the same input, the same order.

    >>> rows = repeat(2, 2, block(2, (1, 1, 1, 1, 1, 1, 1)))
    >>> step, new = reorder(2, 2, rows, cap=4)
    >>> unit_step(2, 2, rows), step   # squeezed block, reordered
    (15, 13)
    >>> " ".join(str(a) for a in new[0])
    '0F0 0F1 3F0 3I0 3W0 3F1 0I0 3I1 0W0 3W1 0I1 0W1'
    """
    got = _reorder_kept(p, microbatches, tuple(map(tuple, orders)), cap, cap_i, fill,
                        None if warmup is None else tuple(map(tuple, warmup)), deep)
    return None if got is None else (got[0], [list(row) for row in got[1]])


@lru_cache(maxsize=64)
def _reorder_kept(p: int, microbatches: int, orders: tuple[tuple[Action, ...], ...], cap: int,
                  cap_i: int | None, fill: bool, warmup: tuple[tuple[int, int], ...] | None,
                  deep: int) -> tuple[int, tuple[tuple[Action, ...], ...]] | None:
    """:func:`reorder`, kept: the planner asks the same block and caps for several
    configurations (pure: the same input, the same order; callers get fresh lists)."""
    got = _reorder(p, microbatches, orders, cap, cap_i, fill, warmup, deep)
    return None if got is None else (got[0], tuple(map(tuple, got[1])))


def _reorder(p: int, microbatches: int, orders, cap: int, cap_i: int | None, fill: bool,
             warmup, deep: int, every_unit: bool = False
             ) -> tuple[int, list[list[Action]]] | None:
    """The body of :func:`reorder`: a list scheduler in unit time steps on the evaluation
    core's clock (``sim/clock.py``, :meth:`Clock.units`): the clock knows when each pass's
    inputs are there (the rule of ``ir/deps.py``) and what each rank holds (``used``
    until W against ``cap``, ``used_i`` until I against ``cap_i``, the one tolerance);
    this function keeps only the choices. ``every_unit``: look at every rank at every
    unit, none asleep (the same picks, slower: the tests' reference)."""
    S, m = 2 * p, microbatches
    Sm = S * m
    clock = Clock.units(tuple(v_placement(p)), m, [cap] * p,
                        limits_i=None if cap_i is None else [cap_i] * p)
    ready, used, used_i = clock.ready, clock.used, clock.used_i
    # one more F fits while used <= room - 1 (room: the cap under the one tolerance)
    lim, lim_i = [x - 1 for x in clock.room], [x - 1 for x in clock.room_i]
    place_at = clock.place_at
    # Every pass by its clock number x = (kind S + stage) m + microbatch (kind 0, 1, 2 = F,
    # I, W; its row x // m = kind S + stage); ``where[x]``: its place in its rank's block
    # order. A pass is ready at t when ready[x] <= t (its inputs ended by t).
    base = {"F": 0, "I": S, "W": 2 * S}  # kind S, by kind
    ids = [[(base[a[1]] + a[0]) * m + a[2] for a in order] for order in orders]
    where = [-1] * (3 * Sm)
    for row in ids:
        for i, x in enumerate(row):
            where[x] = i
    # each rank's forwards not run yet, by place in its block order (rule 3 counts them)
    pending_f = [[i for i, x in enumerate(row) if x < Sm] for row in ids]
    ran = [[False] * len(order) for order in orders]
    head = [0] * p  # the first pass of each rank's block order not run yet
    nxt = [0] * (3 * S)  # next microbatch per row (stage and kind)
    forwards = [0] * p
    out: list[list[Action]] = [[] for _ in range(p)]
    left, t = sum(len(o) for o in orders), 0
    priority = [("FIW".index(code[0]), code[1] == "1") for code in DEEP_PRIORITY.split()]
    kind_stage = [divmod(row, S) for row in range(3 * S)]

    def place(row: int) -> int:
        """Where the next pass of ``row`` (kind S + stage) is in its rank's order, or -1."""
        j = nxt[row]
        return where[row * m + j] if j < m else -1

    started = [False] * p  # the rank has run an input gradient (deep: its chunk-0 one)
    begun = [False] * p  # the rank has run an input gradient
    late_done = [0] * p  # I and W of its chunk-0 stage the rank has run (deep)

    # A rank that picked nothing at t picks nothing later until its own state changes (it
    # runs a pass), a pass of a neighbouring rank runs (the only ones its passes wait for:
    # adjacent stages sit on the same or a neighbouring rank in the V placement), or t
    # reaches the ready time of one of the passes it looks at (each row's next pass and
    # its head): until then it sleeps, and the picks are the same as looking every unit.
    awake, wake, looked = [True] * p, [0] * p, []
    inf = float("inf")

    while left:
        chosen = []
        looked.clear()
        for r in range(p):
            if not awake[r] and t < wake[r]:
                continue
            looked.append(r)
            rids, rran, n = ids[r], ran[r], len(ids[r])
            h = head[r]
            while h < n and rran[h]:
                h += 1
            head[r] = h
            if warmup is not None and not started[r]:  # fill the memory before the first I
                fits = used[r] <= lim[r] and used_i[r] <= lim_i[r]  # one more F
                pick = -1
                if deep and begun[r]:  # past the first I: I, then W, then F while it fits
                    for k, later in priority:  # the deep warm-up's pick (DEEP_PRIORITY)
                        if k == 0 and not fits:
                            continue
                        i = place(k * S + (S - 1 - r if later else r))
                        if i >= 0 and ready[rids[i]] <= t:
                            pick = i
                            break
                    if pick >= 0:
                        chosen.append((r, pick))
                    continue
                for c, s in ((1, S - 1 - r), (0, r)):  # the later chunk first
                    i = place(s)
                    if i >= 0 and nxt[s] < warmup[r][c] and fits and ready[rids[i]] <= t:
                        pick = i
                        break
                if h < n and Sm <= rids[h] < 2 * Sm and ready[rids[h]] <= t:
                    pick = h
                if pick >= 0:
                    chosen.append((r, pick))
                continue
            if forwards[r] < 2 * m and h < n:  # rule 2, the fast path
                x = rids[h]
                if (x >= Sm or used[r] <= lim[r] and used_i[r] <= lim_i[r]) and ready[x] <= t:
                    chosen.append((r, h))
                    continue
                if not fill:
                    continue  # rule 3 only in the cool-down: the rank waits for its pass
            best_key, best = None, -1
            cool = forwards[r] == 2 * m
            for s in (r, S - 1 - r):
                for row in (s, S + s, 2 * S + s):  # F, I, W (place(row), inline)
                    j = nxt[row]
                    if j >= m:
                        continue
                    i = where[row * m + j]
                    if i < 0 or ready[rids[i]] > t:
                        continue
                    k = row // S
                    if k == 0:  # the forwards the block runs before it, still to run
                        pf = pending_f[r]
                        more = bisect_left(pf, i) - bisect_left(pf, h)
                        if used[r] + more > lim[r] or used_i[r] + more > lim_i[r]:
                            continue
                    if cool:  # rule 1
                        key = (0 if k == 1 else 1, i)
                    else:  # rules 2 and 3
                        key = (0 if i == h else 2, i)
                    if best_key is None or key < best_key:
                        best_key, best = key, i
            if best >= 0:
                chosen.append((r, best))
        if not chosen:
            return None  # nothing can run and nothing is running: the rules stalled
        for r in () if every_unit else looked:
            awake[r] = False
        for r, _ in chosen:
            awake[r] = True
            if r:
                awake[r - 1] = True
            if r + 1 < p:
                awake[r + 1] = True
        for r in looked:
            if not awake[r]:  # asleep until one of the passes it looks at is ready
                soon = inf
                h = head[r]
                if h < len(ids[r]):
                    soon = ready[ids[r][h]]
                    if soon <= t:
                        soon = inf
                for s in (r, S - 1 - r):
                    for row in (s, S + s, 2 * S + s):
                        j = nxt[row]
                        if j < m:
                            at = ready[row * m + j]
                            if t < at < soon:
                                soon = at
                wake[r] = soon
        xs = []
        for r, i in chosen:
            x = ids[r][i]
            row = x // m
            k, s = kind_stage[row]
            ran[r][i] = True
            out[r].append(orders[r][i])
            nxt[row] += 1
            if k == 0:
                forwards[r] += 1
                pf = pending_f[r]
                del pf[bisect_left(pf, i)]
            elif warmup is None:  # (the warm-up's state, read only with warm-up targets)
                pass
            else:
                begun[r] = begun[r] or k == 1
                if not deep or s == r:
                    late_done[r] += 1
                    started[r] = started[r] or late_done[r] >= max(1, deep)
            xs.append(x)
        left -= len(xs)
        place_at(xs, t)  # each at t, one unit long: the clock books ends and memory
        t += 1
    return clock.step_time, out


def reorder_ends(p: int, microbatches: int,
                 times: tuple[list[int], list[int], list[int]], cap: int,
                 cap_i: int | None = None) -> list[list[Action]]:
    """The block repeated every 6 units with only its *warm-up and cool-down* moved earlier
    (the paper's reorder, which leaves the steady state as the block has it).

    Every pass starts at its block time ``t + 6 j``. Passes before the first microbatch's
    last input gradient (stage 0's ``I`` of microbatch 0: the end of the warm-up) and after
    stage 0's last forward (the start of the cool-down) are visited in time order and each
    moves to the earliest free unit of its rank after everything it waits for (the rule of
    ``ir/deps.py``, at the times already chosen), if the rank's chunk activations stay
    within ``cap`` (counted until W) and ``cap_i`` (counted until I) at every unit; the
    steady state between keeps its block times. :func:`reorder` instead re-times every pass
    as a list scheduler, which reaches the same unit step but may settle into another
    steady state: one whose cycle through the ranks has no slack for a hop's ``comm`` or a
    W shorter than F (``tests/test_vshape.py`` times both under the controllable-memory
    paper's costs). Returns per-rank orders sorted by the chosen times.
    """
    t_f, t_i, t_w = times
    got = _reorder_ends_kept(p, microbatches, (tuple(t_f), tuple(t_i), tuple(t_w)), cap, cap_i)
    return [list(row) for row in got]


@lru_cache(maxsize=64)
def _reorder_ends_kept(p: int, microbatches: int,
                       times: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
                       cap: int, cap_i: int | None) -> tuple[tuple[Action, ...], ...]:
    """:func:`reorder_ends`, kept (pure; callers get fresh lists)."""
    return tuple(map(tuple, _reorder_ends(p, microbatches, times, cap, cap_i)))


def _reorder_ends(p: int, microbatches: int, times, cap: int, cap_i: int | None
                  ) -> list[list[Action]]:
    """The body of :func:`reorder_ends`, on the evaluation core's clock of unit passes
    (``sim/clock.py``) and its unit calendar: every pass is booked at its block time, then
    visited in block-time order, when its inputs are all placed (each waits only for
    passes the block runs before it), so the clock's ready time is the rule's earliest
    start; the calendar answers which units are free and what the rank will hold at each
    (every pass not visited yet at its block time) against ``cap`` and ``cap_i`` (the
    one tolerance). This function keeps only the choices."""
    t_f, t_i, t_w = times
    S, m = 2 * p, microbatches
    # Events sorted by time, as keys t X + x with x the clock's number of the pass: each
    # (stage, kind) is an arithmetic progression of them, one per microbatch. The order
    # within a unit does not matter: passes of one unit are on different ranks (the block
    # collides nowhere), and what each waits for the block runs earlier.
    bases = (t_f, t_i, t_w)
    X = 3 * S * m
    clock = Clock.units(tuple(v_placement(p)), m, [cap] * p,
                        limits_i=None if cap_i is None else [cap_i] * p)
    clock.calendar(max(max(b) for b in bases) + PERIOD * (m - 1) + 2)
    book = clock.book
    keys: list[int] = []
    step = PERIOD * X + 1
    for s in range(S):
        for k in range(3):
            b, x0 = bases[k][s], (k * S + s) * m
            keys.extend(range(b * X + x0, b * X + x0 + step * m, step))
            book(x0, b, m, PERIOD)
    keys.sort()
    ev_t = [key // X for key in keys]  # each event's time and clock number
    ev_x = [key % X for key in keys]
    ready, end, place, place_at = clock.ready, clock.end, clock.place, clock.place_at
    pull = clock.pull
    start, stop = t_i[0], t_f[0] + PERIOD * (m - 1)
    lo_n, hi_n = bisect_left(ev_t, start), bisect_left(ev_t, stop + 1)
    n, count = 0, len(ev_t)
    while n < count:
        t = ev_t[n]
        if lo_n <= n < hi_n:  # the steady state keeps its block times: a unit at a time
            g = bisect_right(ev_t, t, n, hi_n)
            place_at(ev_x[n:g], t)
            n = g
            continue
        x = ev_x[n]
        n += 1
        at = ready[x]  # its inputs are there (the rule), and its stage's previous pass
        if x % m and end[x - 1] > at:  # of that kind has ended (microbatch order)
            at = end[x - 1]
        if at >= t:  # it cannot start earlier: it keeps its block time
            place(x, t)
            continue
        # the first free unit from there, a forward only from where one more activation
        # stays within the caps at every unit up to its block time
        pull(x, t, at)
    # Each rank's passes by the unit they are booked at (the calendar's orders).
    return clock.booked(_actions(S, m))


def unit_step(p: int, microbatches: int, orders: list[list[Action]]) -> int:
    """Step time of ``orders`` run as given (squeezed) with every pass one unit long: the
    evaluation core (``sim/program.py``) under F = I = W = 1 per chunk."""
    from ..costs import CostModel
    from ..sim.program import Compiled

    sched = make_schedule("block", orders, 2 * p, microbatches, placement="v")
    step = Compiled(sched, CostModel(f=2, b=4, w=2)).step_time  # per chunk: 1, 2 = I + W, 1
    if step == float("inf"):
        raise ScheduleError("the block order deadlocks")
    return round(step)


def peak(p: int, orders: list[list[Action]], frees: str = "W") -> int:
    """The most chunk activations any rank holds: F adds one, ``frees`` (W, or I when W
    keeps nothing) frees it; the core's memory walk (``sim/program.memory_peak``) over
    each rank's order, with the deltas by kind."""
    if frees not in ("I", "W"):
        raise ValueError(f"frees must be 'I' or 'W', got {frees!r}")
    # by kind F, I, W; floats, as the walk sums them (exact for counts)
    net = (1.0, -1.0, 0.0) if frees == "I" else (1.0, 0.0, -1.0)
    kind, second = {"F": 0, "I": 1, "W": 2}.__getitem__, itemgetter(1)
    return max((round(memory_peak(_ADDS, net, list(map(kind, map(second, order)))))
                for order in orders), default=0)


def build(p: int, microbatches: int, candidates: list[tuple[int, ...]], cap: int
          ) -> list[list[Action]]:
    """The shortest order, with unit passes, among each candidate block (offsets) repeated,
    as is or :func:`reorder`-ed, that holds no more on any rank than the first candidate
    (the family's own block, which must hold at most ``cap`` chunk activations):
    ``cap`` counted until W, and the first block's own peak counted until I (``M_W = 0``),
    so the peak does not grow for any ``M_W``. Ties keep the earlier candidate."""
    best: tuple[int, list[list[Action]]] | None = None
    cap_i = None
    for n, offsets in enumerate(candidates):
        try:
            orders = repeat(p, microbatches, block(p, offsets))
        except ScheduleError:
            if cap_i is None:
                raise
            continue
        held, held_i = peak(p, orders), peak(p, orders, frees="I")
        if cap_i is None:
            if held > cap:
                raise ScheduleError(f"block {offsets} holds more than {cap} chunk activations")
            cap_i = held_i
        # First the block with only its ends reordered (its steady state is the block's:
        # no repeating bubble under real costs); at the unit bound nothing is shorter.
        ends = reorder_ends(p, microbatches, block(p, offsets), cap, cap_i)
        ends = reorder(p, microbatches, ends, cap, cap_i, fill=False)
        if ends is not None and 2 * microbatches > cap and ends[0] <= (
                6 * microbatches + 6 * p - 1 - 3 * cap):
            return ends[1]
        tries = [ends, reorder(p, microbatches, orders, cap, cap_i)]
        if n == 0 or (held <= cap and held_i <= cap_i):
            tries.insert(1, (unit_step(p, microbatches, orders), orders))
        for got in tries:
            if got is not None and (best is None or got[0] < best[0]):
                best = got
    assert best is not None
    return best[1]


def build_periodic(p: int, microbatches: int, candidates: list[tuple[int, ...]], cap: int
                   ) -> list[list[Action]]:
    """:func:`build` for ``2p + 6`` microbatches, its steady state then repeated up to
    ``microbatches`` (``schedules/periodic.py``): the same order as :func:`build` gives
    (``tests/test_auto_adaptive.py`` compares them), at a fraction of the cost for large m.
    Falls back to :func:`build` when the small order has no steady state to repeat."""
    from .periodic import extend

    small_m = 2 * p + 6
    if microbatches <= small_m:
        return [list(row) for row in _build_kept(p, microbatches, tuple(candidates), cap)]
    small = _build_kept(p, small_m, tuple(candidates), cap)
    grown = extend(small, small_m, microbatches, [6] * p, packed=True)
    return grown if grown is not None else build(p, microbatches, candidates, cap)


@lru_cache(maxsize=128)
def _build_kept(p: int, microbatches: int, candidates: tuple[tuple[int, ...], ...], cap: int
                ) -> tuple[tuple[Action, ...], ...]:
    """:func:`build`, kept: every m past ``2p + 6`` extends the same small order, and the
    registry's cache keeps finished schedules, not this one (callers copy, never mutate)."""
    return tuple(tuple(row) for row in build(p, microbatches, list(candidates), cap))
