"""The planner's search loop: every point of every axis, bounded, scored by simulation.

A plan is (tp, sp, cp, sharding) around the pipeline's (pp, dp, microbatch size, schedule,
chunks, recompute). The loop:

1. for each point of the outer axes (:class:`~pipebubble.plan.axes.Point`: TP degrees that
   divide the heads, with and without sequence parallelism; CP degrees that divide the
   sequence; every sharding) build the layers' costs at that point and a
   :class:`~pipebubble.plan.scoring.Searcher`, which lists the point's pipeline
   configurations with a true lower bound on each one's step;
2. visit all configurations of all points in order of a rough estimate (the mean work with
   a 1F1B-like fill and drain), skipping any whose bound cannot beat the K-th best step
   found; ``auto`` (an order search, seconds each) comes after the families, in order of its
   cut's bound, so it runs only where it can still beat the K-th best plan of every family
   (and a bound for every order it can return, :meth:`~.auto_plans.AutoPlans.ruled_out`,
   does too); its search is bounded by counted work, never the clock
   (:mod:`~pipebubble.schedules.auto.budget`), so a plan run twice gives the same plans on
   any machine;
   families whose schedule would take long to generate (:meth:`Searcher.costly`: over
   :data:`~pipebubble.plan.scoring.COSTLY` actions, counted from pp x m x chunks, never
   timed, so the work is the same on any machine and load) wait until after ``auto``, for
   its tighter threshold, or, while the cheaper families have found fewer than K plans
   that fit (no threshold yet: a memory-bound model), until just before ``auto``, as many
   as it takes to find them (only the order changes, never what is found);
3. score the others by simulation (:meth:`Searcher.evaluate`: cut, price, simulate) and keep
   the K fastest that fit.

Only true bounds prune, so the K plans are the K fastest of everything searched (the cut
rules of :mod:`pipebubble.plan.planner` aside). Ties go to the plan that needs less memory,
then to one a framework can run (DualPipe's two model copies run nowhere), then fewer GPUs
in model parallelism: a plan that ties the K-th step is still scored, so the order of the
visit never decides a tie.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from ..errors import UserError, param
from ..schedules import lookup
from .axes import Axes, Point
from .configs import visit_estimate
from .plans import Config, Plan, Request, Result
from .scoring import SearchCache, Searcher
from .search_pool import counts_of, parallel_search, runs_parallel
from .visits import Side, Visits, auto_order, plan_order, runnable_nowhere

TIE = 5e-4  # a margin that prints as 0.0 %


def search_points(points: list[tuple[Point, object, Axes]], req: Request,
                  keep: Callable[[Plan], bool] | None = None,
                  sides: tuple[Side, ...] = ()) -> Result:
    """The ``req.top`` fastest plans over ``points`` (``(point, layer costs, axes)``); with
    ``keep``, of the plans it keeps only (a framework's runnable plans: the threshold is set
    by those, so the search stays as tight as for the top ``req.top`` of all). Each of
    ``sides`` (:class:`~.visits.Side`) also gets its fastest plan, in ``Result.sides`` by
    name (None where none fits)."""
    req.check()
    with collector_paused():
        return _search_points(points, req, keep, sides)


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block, back as it was after it. The
    search allocates millions of short-lived objects (orders, timelines) whose reference
    counts free them, while its caches keep hundreds of thousands alive: each full
    collection walks all of those, and they came to a fifth of the search's CPU (DeepSeek-V3
    on 2,048 GPUs: 4 of 17 s, for a peak memory 2 % lower). What a cycle holds is freed at
    the next collection after the block."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _search_points(points: list[tuple[Point, object, Axes]], req: Request,
                   keep: Callable[[Plan], bool] | None, sides: tuple[Side, ...]) -> Result:
    """:func:`search_points`, with the collector paused: in one process, or over
    ``req.jobs`` worker processes when the listing is large (:mod:`.search_pool`)."""
    t0 = time.perf_counter()
    shared = SearchCache()
    searchers = [Searcher(costs, req, axes, shared) for _, costs, axes in points]
    listed = Listed(searchers)
    if not len(listed.estimates) and not listed.autos:
        raise UserError(searchers[0].nothing_divides() if searchers else
                        f"no point of {param('tp')}, {param('cp')} and {param('shardings')} "
                        "applies to these GPUs")
    # the visit order: by the estimate, ties in listing order (a stable sort)
    visit_order = np.argsort(listed.estimates, kind="stable")
    if runs_parallel(req, listed):
        found, side_found, counts = parallel_search(req, keep, searchers, listed, visit_order,
                                                    sides)
    else:
        found, side_found = one_process(req, keep, listed, visit_order, sides)
        counts = counts_of(searchers)
    if not found:
        raise least_memory(searchers, [listed.config(j) for j in visit_order.tolist()]
                           + listed.autos)
    best = ranked(found, req.top)
    simulated, auto_runs, auto_seconds = counts
    return Result(best, len(listed.estimates) + len(listed.autos), simulated,
                  time.perf_counter() - t0, req, auto_runs, auto_seconds,
                  sides={side.name: min(side_found[i], key=plan_order, default=None)
                         for i, side in enumerate(sides)})


def one_process(req: Request, keep: Callable[[Plan], bool] | None, listed: Listed,
                visit_order: np.ndarray, sides: tuple[Side, ...] = ()
                ) -> tuple[list[Plan], list[list[Plan]]]:
    """The search in this process: the families in ``visit_order``, then auto's
    configurations, then the costly families deferred (module doc); the plans found, and
    each side's (its fastest, or none)."""
    v = Visits(req, keep, sides)
    bounds = listed.bounds
    late: list[int] = []  # costly: visited after the rest
    ahead = visit_order  # the family configurations not visited yet, in order
    todo, k, seen = ahead.tolist(), 0, math.inf
    while k < len(todo):
        limit = v.loosest()
        if limit < seen:  # the threshold fell: drop those it rules out (visit would)
            rest = ahead[k:]
            ahead = rest[bounds[rest] < limit]
            todo, k, seen = ahead.tolist(), 0, limit
            continue
        if v.visit(*listed.config(todo[k]), may_defer=True):
            late.append(todo[k])
        k += 1
    # auto searches orders (seconds each): after the families, by the bound of its cut,
    # against the threshold they have set (while the cheap families have set none, the
    # costly ones first, until one is known); then the rest of the costly schedules, in the
    # order of the estimate, against the threshold auto has tightened.
    first = 0
    while first < len(late) and v.threshold() == math.inf:
        v.visit(*listed.config(late[first]))
        first += 1
    late = late[first:]
    autos = listed.autos
    for k in auto_order(autos, v.loosest(autos=True)):
        v.visit(*autos[k])
    for j in late:
        v.visit(*listed.config(j))
    return v.best, [[p] if p is not None else [] for p in v.side_best]


def ranked(found: list[Plan], top: int) -> list[Plan]:
    """The ``top`` first of ``found`` by :func:`plan_order` (a total order of
    configurations: the same whatever order they were found in), then no 0.0 % win for a
    schedule no framework runs."""
    best = sorted(found, key=plan_order)[:top]
    for k in range(len(best) - 1):
        a, b = best[k], best[k + 1]
        if (runnable_nowhere(a.schedule) and not runnable_nowhere(b.schedule)
                and b.step_time <= a.step_time * (1 + TIE)):
            best[k], best[k + 1] = b, a
    return best


class Listed:
    """Every configuration of ``searchers``, listed once, without building a
    :class:`Config` for those the search never visits: the families' in listing order as
    parallel lists (:attr:`estimates`, :attr:`bounds`, and where each is: its group and
    member, :meth:`config`), ``auto``'s as ``(config, searcher)`` in :attr:`autos`."""

    def __init__(self, searchers: list[Searcher]):
        est: list[float] = []
        bnd: list[float] = []
        at_group: list[int] = []
        at_member: list[int] = []
        groups: list[tuple] = []
        self._groups = groups  # (searcher, dims, size, m, recompute, kinds, bounds)
        self.autos: list[tuple[Config, Searcher]] = []
        split: dict[tuple, tuple] = {}  # per kinds (by value): families' and auto's members
        for s in searchers:
            sharding = s.point.sharding
            for dims, size, m, rec, kinds, bounds in s.listing.groups():
                g = len(groups)
                groups.append((s, dims, size, m, rec, kinds, bounds))
                got = split.get(tuple(kinds))
                if got is None:
                    fam = [k for k, (name, _, _) in enumerate(kinds)
                           if not lookup(name).searched]
                    got = split[tuple(kinds)] = (
                        fam, [kinds[k][1] for k in fam], [kinds[k][2] for k in fam],
                        [kind for kind in kinds if lookup(kind[0]).searched])
                fam, vs, chs, auto = got
                work = s.listing.work(size, rec)
                ests = {v: visit_estimate(work, m, dims.pp, v) for v in set(vs)}  # per chunks
                est += [ests[v] for v in vs]
                bnd += [bounds[ch] for ch in chs]
                at_group += [g] * len(fam)
                at_member += fam
                for name, v, ch in auto:
                    self.autos.append((Config(dims, size, m, name, v, rec, bounds[ch],
                                              sharding), s))
        # arrays, not lists: nothing the garbage collector walks in the rest of the search
        self.estimates = np.array(est, dtype=float)
        self.bounds = np.array(bnd, dtype=float)
        self._group = at_group
        self._member = at_member

    def config(self, j: int) -> tuple[Config, Searcher]:
        """The ``j``-th family configuration listed, and its searcher."""
        s, dims, size, m, rec, kinds, bounds = self._groups[self._group[j]]
        name, v, ch = kinds[self._member[j]]
        return Config(dims, size, m, name, v, rec, bounds[ch], s.point.sharding), s


def least_memory(searchers: list[Searcher], work: list[tuple[Config, Searcher]]):
    """Nothing fits: the error naming the least memory any point's plan needs and that plan
    (each searcher's :meth:`~Searcher.no_fit` over its own configurations)."""
    by: dict[int, list[Config]] = {}
    for c, s in work:
        by.setdefault(id(s), []).append(c)
    errors = [s.no_fit(by[id(s)]) for s in searchers if id(s) in by]
    return min(errors, key=lambda e: e.smallest)

