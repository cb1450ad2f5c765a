"""Local search: improve an order by moving actions within their rank.

Start from the best order found (a registered schedule or a greedy one). A *move* takes one
action out of its rank's order and puts it back at any other place its rank allows: after
the same stage's and kind's previous microbatch and before its next (every stage runs its
Fs, Is and Ws in microbatch order), after what it needs on the same rank (its own F before
its I, its I before its W, the other chunk at the V's turn) and before what needs it. A move
is kept when the rank's activation memory stays within the limit (memory depends on the
order only) and the step gets better: a shorter step time, or the same with every action
ending earlier in sum (which lets the search cross flat ground). Passes repeat until none
helps (a local optimum).

:func:`anneal` (what ``auto`` runs first) walks the same moves at random, plus swaps of two
actions of a rank and *column* moves (the same move on every rank: the action of the same
kind, chunk and microbatch put before the same counterpart), taking a worse order with
probability exp(-worse / temperature) as the temperature falls, and keeps the best order
that fits. :func:`improve` then climbs from it (and can kick it: a few random moves and
another climb, an iterated local search). Random choices come from a generator seeded by
the instance: the result depends only on the input, never on a clock, so every process of
a distributed run computes the same. Budgets are numbers of evaluations.

Each evaluation asks the evaluation core (:class:`~pipebubble.sim.program.Compiled`,
compiled once per search): it re-times only what the move changed, with the simulator's
own numbers; an order that deadlocks scores as infinite. It reads the step time first and
the sum of ends only when the step does not decide (a tie, or an annealing draw the step
alone cannot refuse). Memory is the core's walk
(:func:`~pipebubble.sim.program.memory_peak`) under its one tolerance.
"""

from __future__ import annotations

import random

from ...costs import StageCosts, fit_bound, fits_limit
from ...ir.deps import Layout, precedences
from ...ir.schedule import Action, Kind, make_schedule
from ...sim.program import memory_peak

_INF = float("inf")
_KINDS = (Kind.F, Kind.I, Kind.W)
_CODE = {"F": 0, "I": 1, "W": 2}


class _Problem:
    """The instance as flat arrays: action ``x = (kind * S + stage) * m + microbatch``."""

    def __init__(self, sc: StageCosts, where: tuple[int, ...], microbatches: int,
                 limits: list[float] | None):
        S, m = len(where), microbatches
        self.S, self.m, self.where = S, m, where
        self.n = n = 3 * S * m
        comm = sc.comm
        self.dur = [0.0] * n
        self.dep = [-1] * n  # the one action on another stage this one waits for
        self.lag = [0.0] * n
        self.d0 = [0.0] * n  # memory added at the start, and in all (start + end)
        self.net = [0.0] * n
        self.rank = [0] * n
        self.local_pre: list[list[int]] = [[] for _ in range(n)]  # on the same rank, before
        # The rule (ir/deps.precedences) over one microbatch's F, I and W: each action's
        # edges in, the same for every microbatch. ``dep`` is the one the clock waits on
        # with a lag: the neighbour stage's edge (crossing ranks: comm), else the same
        # stage's (F before I, I before W); the other edge only orders the rank.
        one = [Action(s, kind, 0) for kind in _KINDS for s in range(S)]
        into: dict[tuple[int, int], list] = {}
        for e in precedences(one, Layout(S, tuple(where))):
            into.setdefault((_CODE[e.after.kind], e.after.stage), []).append(e)
        for k in range(3):
            kind = _KINDS[k]
            for s in range(S):
                d = sc.duration(s, kind)
                a0, a1 = sc.memory_deltas(s, kind)
                edges = sorted(into.get((k, s), ()), key=lambda e: e.before.stage == s)
                for j in range(m):
                    x = (k * S + s) * m + j
                    self.dur[x], self.d0[x], self.net[x] = d, a0, a0 + a1
                    self.rank[x] = where[s]
                    ids = [self.id(_CODE[e.before.kind], e.before.stage, j) for e in edges]
                    dep, hop = (ids[0], edges[0].crosses) if edges else (-1, False)
                    self.dep[x], self.lag[x] = dep, comm if hop else 0.0
                    pre = [self.id(k, s, j - 1)] if j else []  # microbatches in order
                    pre += [y for y, e in zip(ids, edges, strict=True) if not e.crosses]
                    self.local_pre[x] = [y for y in set(pre) if where[y // m % S] == where[s]]
        self.local_post: list[list[int]] = [[] for _ in range(n)]
        for x in range(n):
            for y in self.local_pre[x]:
                self.local_post[y].append(x)
        self.limits = limits
        self.sc = sc
        self._core = None  # the compiled orders (evaluate builds it on first use)
        p = max(where) + 1
        self.stages = [[s for s in range(S) if where[s] == q] for q in range(p)]

    def id(self, k: int, s: int, j: int) -> int:
        return (k * self.S + s) * self.m + j

    def action(self, x: int) -> Action:
        k, rest = divmod(x, self.S * self.m)
        return Action(rest // self.m, _KINDS[k], rest % self.m)

    def encode(self, orders: list[list[Action]]) -> list[list[int]]:
        """Orders as action numbers; a fused backward B becomes its I then its W (the same
        time and the same memory at every instant), which the search may then pull apart."""
        out = []
        for o in orders:
            row = []
            for a in o:
                kinds = ("I", "W") if a.kind == "B" else (a.kind,)
                row += [self.id(_CODE[k], a.stage, a.microbatch) for k in kinds]
            out.append(row)
        return out

    def evaluate(self, orders: list[list[int]]) -> tuple[float, float]:
        """(step time, sum of ends) of these orders; (inf, inf) on deadlock: :meth:`step`,
        then :meth:`ends`."""
        step = self.step(orders)
        if step == _INF:
            return _INF, _INF
        return step, self.ends()

    def step(self, orders: list[list[int]]) -> float:
        """The step time of these orders, rounded to 9 places (inf on deadlock). The first
        call compiles them (:class:`~pipebubble.sim.program.Compiled`); later ones hand the
        ranks that changed to the core."""
        from ...sim.program import Compiled

        core = self._core
        if core is None:
            acts = [[self.action(x) for x in o] for o in orders]
            sched = make_schedule("search", acts, self.S, self.m, placement=list(self.where))
            core = self._core = Compiled(sched, self.sc)
            self._step_of = [0] * self.n
            for o, ids in zip(orders, core.orders, strict=True):
                for x, i in zip(o, ids, strict=True):
                    self._step_of[x] = i
            self._seen = [list(o) for o in orders]
            self._ids = self._step_of
        else:
            step_of, seen = self._step_of, self._seen
            changed = [r for r, o in enumerate(orders) if o != seen[r]]
            if changed:
                for r in changed:
                    seen[r] = list(orders[r])
                core.reorder({r: [step_of[x] for x in orders[r]] for r in changed})
        step = core.step_time
        if step == _INF:
            return _INF
        return round(step, 9)

    def ends(self) -> float:
        """The sum of every action's end (rounded to 9 places) of the orders :meth:`step`
        was last asked about, which must not deadlock: the tie-break, read only when the
        step time does not decide."""
        core = self._core
        ends = core.ends_of(self._ids)  # in action-number order, as the sum always ran
        return round(sum(ends), 9)

    def fits(self, order: list[int], limit: float | None) -> bool:
        if limit is None:
            return True
        return fits_limit(memory_peak(self.d0, self.net, order, limit), limit)

    def can_swap(self, order: list[int], k: int, k2: int) -> bool:
        """Whether order[k] and order[k2] (k < k2) may trade places."""
        x, y = order[k], order[k2]
        inside = set(order[k:k2 + 1])
        return (not any(z in inside for z in self.local_post[x])
                and not any(z in inside for z in self.local_pre[y]))

    def excess(self, order: list[int], limit: float | None) -> float:
        """How far the rank's peak memory goes over the limit (0 if it fits)."""
        if limit is None:
            return 0.0
        peak = memory_peak(self.d0, self.net, order)
        return 0.0 if fits_limit(peak, limit) else peak - fit_bound(limit)

    def column_move(self, orders: list[list[int]], r: int, k: int, rng) -> bool:
        """Move order[k] of rank r before another action of that rank, and on every other
        rank the action of the same kind, chunk and microbatch before the one of the same
        kind, chunk and microbatch as that (where the rank allows it). True if anything
        moved."""
        order = orders[r]
        lo, hi = self.window(order, k)
        if hi <= lo:
            return False
        to = rng.randint(lo, hi - 1)
        if to >= k:
            to += 1
        rest = order[:k] + order[k + 1:]
        if to >= len(rest):
            return False
        x, y = order[k], rest[to]
        moved = False
        for q, other in enumerate(orders):
            xq, yq = self.twin(x, q), self.twin(y, q)
            if xq < 0 or yq < 0:
                continue
            kq = other.index(xq)
            lo, hi = self.window(other, kq)
            other.pop(kq)
            at = other.index(yq)
            if lo <= at <= hi and at != kq:
                other.insert(at, xq)
                moved = True
            else:
                other.insert(kq, xq)
        return moved

    def twin(self, x: int, q: int) -> int:
        """The action of rank q with x's kind, chunk (place among the rank's stages) and
        microbatch; -1 if q has no such chunk."""
        k, rest = divmod(x, self.S * self.m)
        s, j = divmod(rest, self.m)
        mine = self.stages[self.where[s]]
        theirs = self.stages[q]
        c = mine.index(s)
        if c >= len(theirs):
            return -1
        return self.id(k, theirs[c], j)

    def window(self, order: list[int], k: int) -> tuple[int, int]:
        """Where order[k] may go once taken out: positions lo..hi of the shortened order."""
        x = order[k]
        pos = {y: i for i, y in enumerate(order)}
        lo, hi = 0, len(order) - 1
        for y in self.local_pre[x]:
            lo = max(lo, pos[y] + 1)
        for y in self.local_post[x]:
            hi = min(hi, pos[y] - 1)  # after taking x out, y sits one place earlier
        return lo, hi


def improve(orders: list[list[Action]], sc: StageCosts, where: tuple[int, ...],
            microbatches: int, limits: list[float] | None, budget: int = 4000,
            kicks: int = 0, seed: int = 0) -> tuple[list[list[Action]], tuple[float, float]]:
    """Hill-climb over moves of one action within its rank (see the module docstring),
    then ``kicks`` rounds of a random kick and another climb, within ``budget``
    evaluations; returns the best orders and their (step, sum of ends)."""
    prob = _Problem(sc, where, microbatches, limits)
    cur = prob.encode(orders)
    score = prob.evaluate(cur)
    spent = [1]

    def climb(state: list[list[int]], best: tuple[float, float]) -> tuple[float, float]:
        better = True
        while better and spent[0] < budget:
            better = False
            for r, order in enumerate(state):
                limit = None if limits is None else limits[r]
                k = 0
                while k < len(order) and spent[0] < budget:
                    lo, hi = prob.window(order, k)
                    x = order.pop(k)
                    done = False
                    for to in range(lo, hi + 1):
                        if to == k:
                            continue
                        order.insert(to, x)
                        if prob.fits(order, limit):
                            spent[0] += 1
                            step = prob.step(state)  # the sum of ends only on a tie
                            if step < best[0] or step == best[0] < _INF:
                                got = (step, prob.ends())
                                if got < best:
                                    best, better, done = got, True, True
                                    break
                        order.pop(to)
                        if spent[0] >= budget:
                            break
                    if not done:
                        order.insert(k, x)
                    k += 1
        return best

    score = climb(cur, score)
    best_orders, best = [list(o) for o in cur], score
    rng = random.Random(seed)
    for _ in range(kicks):
        if spent[0] >= budget:
            break
        trial = [list(o) for o in best_orders]
        for _ in range(rng.randint(2, 4)):
            r = rng.randrange(len(trial))
            order = trial[r]
            if len(order) < 2:
                continue
            limit = None if limits is None else limits[r]
            for _ in range(10):  # a random move that fits the memory
                k = rng.randrange(len(order))
                lo, hi = prob.window(order, k)
                if hi <= lo:
                    continue
                x = order.pop(k)
                to = rng.randint(lo, hi)
                order.insert(to, x)
                if prob.fits(order, limit):
                    break
                order.pop(to)
                order.insert(k, x)
        spent[0] += 1
        got = prob.evaluate(trial)
        if got[0] == _INF:
            continue
        got = climb(trial, got)
        if got < best:
            best_orders, best = [list(o) for o in trial], got
    return [[prob.action(x) for x in o] for o in best_orders], best


def anneal(orders: list[list[Action]], sc: StageCosts, where: tuple[int, ...],
           microbatches: int, limits: list[float] | None, budget: int = 20000,
           seed: int = 0, hot: float = 0.03, cold: float = 0.0005,
           swaps: float = 0.3, soft: bool = False, tie: float = 1.0,
           columns: float = 0.2) -> tuple[list[list[Action]],
                                                            tuple[float, float]]:
    """Simulated annealing over the same moves (random ones; a worse order is taken with
    probability exp(-worse / temperature), the temperature falling geometrically), then a
    climb; returns the best orders seen and their (step, sum of ends)."""
    import math

    prob = _Problem(sc, where, microbatches, limits)
    cur = prob.encode(orders)
    got = prob.evaluate(cur)
    n = prob.n

    def value(score: tuple[float, float]) -> float:
        return score[0] + tie * score[1] / (n * n)

    now = value(got)
    best, best_orders = got, [list(o) for o in cur]
    rng = random.Random(seed)
    hot, cold = hot * got[0], cold * got[0]
    # soft: an order over the limit is allowed, at a price per unit of excess memory that
    # rises from a fraction of the step to several steps (so the walk ends where it fits)
    over = [0.0] * len(cur)
    spill = 0.0
    soft_from, soft_to = 0.05 * got[0], 5.0 * got[0]
    sizes = [len(o) for o in cur]
    ranks = [r for r, size in enumerate(sizes) for _ in range(size)]
    draw = [None]  # the random number drawn by judge for this move, if it drew one

    def judge(penalty: float) -> tuple[tuple[float, float] | None, float]:
        """The score of ``cur`` and its value plus ``penalty``, reading the sum of ends
        only where the step time does not decide. The value is at least the step time's
        (the tie term is not negative), so a step above ``now`` means a worse order, taken
        with probability below exp((now - that) / temp); if the random number drawn for it
        is above that bound, the move is refused as it would be with the exact value (the
        same draw, the same answer): score None."""
        draw[0] = None
        step = prob.step(cur)
        if step == _INF:
            return (_INF, _INF), value((_INF, _INF)) + penalty
        low = step + penalty
        if tie >= 0 and low > now and low < _INF:
            u = draw[0] = rng.random()
            if u > math.exp((now - low) / temp) * (1 + 1e-9):
                return None, _INF
        score = (step, prob.ends())
        return score, value(score) + penalty

    def chance(v: float) -> bool:
        """Take a worse order (value v) with probability exp((now - v) / temp), with the
        number judge drew, or a new one."""
        u = draw[0] if draw[0] is not None else rng.random()
        return u < math.exp((now - v) / temp)

    for step in range(budget):
        temp = hot * (cold / hot) ** (step / budget)
        r = ranks[rng.randrange(len(ranks))]
        order = cur[r]
        k = rng.randrange(len(order))
        if rng.random() < columns:  # the same move on every rank
            saved = [list(o) for o in cur]
            if not prob.column_move(cur, r, k, rng):
                continue
            if soft:
                extra = sum(prob.excess(o, None if limits is None else limits[q])
                            for q, o in enumerate(cur))
                weight = soft_from * (soft_to / soft_from) ** (step / budget)
                ok = True
            else:
                ok = limits is None or all(prob.fits(o, limits[q]) for q, o in enumerate(cur))
                extra = weight = 0.0
            if ok:
                score, v = judge(weight * extra)
                if v <= now or (v < _INF and chance(v)):
                    now = v
                    if soft:
                        spill = extra
                        over = [prob.excess(o, None if limits is None else limits[q])
                                for q, o in enumerate(cur)]
                    if score < best and extra <= 1e-12:
                        best, best_orders = score, [list(o) for o in cur]
                    continue
            cur[:] = saved
            continue
        if rng.random() < swaps:  # swap two actions of the rank
            k2 = rng.randrange(len(order))
            if k2 == k:
                continue
            k, k2 = min(k, k2), max(k, k2)
            if not prob.can_swap(order, k, k2):
                continue
            order[k], order[k2] = order[k2], order[k]
            undo = (k, k2, -1)
        else:  # move one action
            lo, hi = prob.window(order, k)
            if hi <= lo:
                continue
            x = order.pop(k)
            to = rng.randint(lo, hi - 1)
            if to >= k:
                to += 1
            order.insert(to, x)
            undo = (k, to, x)
        limit = None if limits is None else limits[r]
        if soft:
            extra = prob.excess(order, limit)
            weight = soft_from * (soft_to / soft_from) ** (step / budget)
            total = spill - over[r] + extra
        elif prob.fits(order, limit):
            extra = total = weight = 0.0
        else:
            extra = -1.0
        if extra >= 0:
            score, v = judge(weight * total)
            if v <= now or (v < _INF and chance(v)):
                now = v
                if soft:
                    spill, over[r] = total, extra
                if score < best and total <= 1e-12:
                    best, best_orders = score, [list(o) for o in cur]
                continue
        a, b, x = undo
        if x < 0:
            order[a], order[b] = order[b], order[a]
        else:
            order.pop(b)
            order.insert(a, x)
    return [[prob.action(x) for x in o] for o in best_orders], best
