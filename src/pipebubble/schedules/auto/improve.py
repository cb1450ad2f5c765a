"""Local search: improve an order by swapping neighbouring actions on a rank.

Start from the best order found (a registered schedule or a greedy one) and try, rank by
rank, to swap each pair of neighbouring actions that do not depend on each other (not the
same stage and microbatch, not the same stage and kind, not consecutive stages of one
microbatch). A swap is kept when the rank's memory stays within the limit (memory depends on
the order only) and the simulator says the step got better: a shorter step time, or the
same with every action ending earlier in sum (which lets the search cross flat ground).
Passes repeat until none helps or the budget of simulations is spent; the result depends
only on the input (no clock), so every process of a distributed run computes the same.

On very small instances it first tries wider moves: one action taken out and put back up
to ``reach`` places earlier or later (an order that deadlocks is simply rejected).
It costs one simulation per tried move: ``auto`` runs it on small instances only.
"""

from __future__ import annotations

from ...costs import StageCosts
from ...ir.schedule import Action, make_schedule


def _independent(a: Action, b: Action) -> bool:
    if a.stage == b.stage and (a.microbatch == b.microbatch or a.kind == b.kind):
        return False
    return not (a.microbatch == b.microbatch and abs(a.stage - b.stage) == 1)


def _rank_fits(order: list[Action], sc: StageCosts, limit: float | None) -> bool:
    if limit is None:
        return True
    used = 0.0
    for a in order:
        d0, d1 = sc.memory_deltas(a.stage, a.kind)
        if used + d0 > limit + 1e-9:
            return False
        used += d0 + d1
    return True


def improve(orders: list[list[Action]], sc: StageCosts, where: tuple[int, ...],
            microbatches: int, limits: list[float] | None, budget: int = 4000,
            reach: int = 1) -> tuple[list[list[Action]], tuple[float, float]]:
    """Hill-climb over neighbour swaps (and, with ``reach`` > 1, moves of one action up to
    ``reach`` places); returns the orders and their (step, sum of ends)."""
    from ...sim.kernel import simulate

    S = len(where)
    orders = [list(o) for o in orders]

    def score() -> tuple[float, float] | None:
        try:
            t = simulate(make_schedule("auto", orders, S, microbatches,
                                       placement=list(where)), sc)
        except ValueError:  # a deadlock: the swap broke the order
            return None
        return round(t.step_time, 9), round(sum(t.end), 9)

    best = score()
    tries = 0
    better = True
    if reach > 1:  # small instances: moves of an action up to ``reach`` places either way
        while better and tries < budget:
            better = False
            for r, order in enumerate(orders):
                limit = None if limits is None else limits[r]
                for k in range(len(order)):
                    for to in range(max(0, k - reach), min(len(order), k + reach + 1)):
                        if to == k or tries >= budget:
                            continue
                        a = order.pop(k)
                        order.insert(to, a)
                        if _rank_fits(order, sc, limit):
                            tries += 1
                            got = score()
                            if got is not None and got < best:
                                best, better = got, True
                                break
                        order.pop(to)
                        order.insert(k, a)
        better = True
    while better and tries < budget:
        better = False
        for r, order in enumerate(orders):
            limit = None if limits is None else limits[r]
            for k in range(1, len(order)):
                a, b = order[k - 1], order[k]
                if not _independent(a, b):
                    continue
                order[k - 1], order[k] = b, a
                if _rank_fits(order, sc, limit):
                    tries += 1
                    got = score()
                    if got is not None and got < best:
                        best, better = got, True
                        continue
                order[k - 1], order[k] = a, b
                if tries >= budget:
                    break
    return orders, best
