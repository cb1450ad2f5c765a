"""The visit of one configuration by the planner's search (:mod:`.search`, and each worker
of :mod:`.search_pool`), and the one order of plans.

:class:`Visits` scores a configuration unless its true bound cannot beat the K-th best step
found; :func:`plan_order` ranks plans, a total order of configurations, so the plans kept do
not depend on the order they were found in; :func:`auto_order` is the order ``auto``'s
configurations are visited in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..schedules import lookup
from .plans import Config, Plan, Request
from .scoring import Searcher


def runnable_nowhere(name: str) -> bool:
    """Whether no framework runs the family: more than one chain (DualPipe's two model
    copies: torch.distributed.pipelining runs one, Megatron-LM pipelines neither)."""
    return lookup(name).chains > 1


def plan_order(p: Plan) -> tuple:
    """Fastest first; on a tie the lighter plan, then one some framework runs, then the
    least model parallelism, then the rest of the configuration: no two configurations
    tie, so the order plans are found in (one process or several) never decides."""
    c, d = p.config, p.config.dims
    return (p.step_time, max(p.peak_memory), runnable_nowhere(c.schedule), d.model_parallel,
            c.pp, c.schedule, c.chunks, c.microbatch_size, c.recompute, c.sharding, c.sp,
            d.tp, d.cp, d.ep, d.etp, d.dp_replicate, d.dp_shard)


def threshold_of(kth: float, prune: bool) -> float:
    """What a plan must beat given the K-th best step found (inf until K are): nothing
    without pruning, else that step, a tie included (a tie may still sort before the K-th:
    ties go by plan_order, whatever the order of the visit)."""
    return math.nextafter(kth, math.inf) if prune else math.inf


@dataclass(frozen=True)
class Side:
    """A second answer the search gives on the way: the fastest plan ``keep`` keeps (a
    framework's runnable plans), among the configurations ``may`` admits (a superset of
    those whose plans it keeps, known from the configuration alone; ``autos``: whether it
    admits any of auto's). A configuration it admits is scored against the looser of the
    two thresholds, so the side's plan is the one a search of its own would find (the
    same configurations, the same true bounds), without a second search's listing, costs
    and simulations (``plan``'s Megatron paste: "the best plan it runs instead")."""

    name: str
    may: Callable[[Config], bool]
    keep: Callable[[Plan], bool]
    autos: bool = False


class Visits:
    """The visit of one configuration against the K-th best step found (the one rule of the
    one-process search and of each worker's, :mod:`.search_pool`): :attr:`best` holds the
    K plans that fit (``keep`` them) that this visitor found, by :func:`plan_order`. The
    threshold reads the K-th best step from :meth:`kth`: by default this visitor's own,
    a worker's reads the K-th of every worker's (a true bound either way)."""

    def __init__(self, req: Request, keep: Callable[[Plan], bool] | None,
                 sides: tuple[Side, ...] = ()):
        self.req, self.keep = req, keep
        self.best: list[Plan] = []
        self.sides = sides
        self.side_best: list[Plan | None] = [None] * len(sides)  # each side's fastest

    def kth(self) -> float:
        """The K-th best step found (inf until K are)."""
        best = self.best
        return best[-1].step_time if len(best) >= self.req.top else math.inf

    def found(self, plan: Plan) -> None:
        """A plan that fits and is kept: into :attr:`best`."""
        best = self.best
        best.append(plan)
        best.sort(key=plan_order)
        del best[self.req.top:]

    def threshold(self) -> float:
        """What a plan must beat: :func:`threshold_of` the K-th best step."""
        return threshold_of(self.kth(), self.req.prune)

    def side_step(self, i: int) -> float:
        """Side ``i``'s fastest step found (inf until one is)."""
        got = self.side_best[i]
        return math.inf if got is None else got.step_time

    def side_found(self, i: int, plan: Plan) -> None:
        """A plan side ``i`` keeps: its fastest, by :func:`plan_order`."""
        got = self.side_best[i]
        if got is None or plan_order(plan) < plan_order(got):
            self.side_best[i] = plan

    def loosest(self, autos: bool = False) -> float:
        """The loosest threshold any configuration faces (of auto's only, ``autos``): what
        the visit's filters may drop by."""
        limit = self.threshold()
        for i, side in enumerate(self.sides):
            if side.autos or not autos:
                limit = max(limit, threshold_of(self.side_step(i), self.req.prune))
        return limit

    def limit_of(self, c: Config) -> float:
        """What ``c``'s plan must beat: the threshold, or a side's where ``c`` may be that
        side's and its threshold is looser."""
        limit = self.threshold()
        for i, side in enumerate(self.sides):
            t = threshold_of(self.side_step(i), self.req.prune)
            if t > limit and side.may(c):
                limit = t
        return limit

    def visit(self, c: Config, s: Searcher, may_defer: bool = False) -> bool:
        """Score ``c`` unless its bound rules it out; with ``may_defer``, a costly one
        (:meth:`Searcher.costly`) is not scored but deferred: True then (the caller visits
        it late: after auto, or before it while no threshold is known)."""
        limit = self.limit_of(c)
        if c.bound >= limit:
            return False  # no cut of c can enter the top K (nor a side's best)
        if may_defer and s.costly(c):
            return True
        plan = s.evaluate(c, limit, self.req.gpu_memory)
        if plan is None:
            return False
        if self.keep is None or self.keep(plan):
            self.found(plan)  # (one slower than the K-th falls off the end)
        for i, side in enumerate(self.sides):
            if side.may(c) and plan.step_time <= self.side_step(i) and side.keep(plan):
                self.side_found(i, plan)
        return False


def auto_order(autos: list[tuple[Config, Searcher]], limit: float) -> list[int]:
    """The order auto's configurations are visited in (after the families): by the bound
    of their cut, those whose own bound beats ``limit`` (all of them, in listing order,
    while no threshold is known)."""
    if limit == math.inf:
        return list(range(len(autos)))
    return sorted((k for k, (c, _) in enumerate(autos) if c.bound < limit),
                  key=lambda k: autos[k][1].auto_bound(autos[k][0]))
