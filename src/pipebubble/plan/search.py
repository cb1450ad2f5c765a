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
   its tighter threshold (only the order changes, never what is found);
3. score the others by simulation (:meth:`Searcher.evaluate`: cut, price, simulate) and keep
   the K fastest that fit.

Only true bounds prune, so the K plans are the K fastest of everything searched (the cut
rules of :mod:`pipebubble.plan.planner` aside). Ties go to the plan that needs less memory,
then to one a framework can run (DualPipe's two model copies run nowhere), then fewer GPUs
in model parallelism: a plan that ties the K-th step is still scored, so the order of the
visit never decides a tie.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..errors import UserError, param
from ..schedules import lookup
from .axes import Axes, Point
from .plans import Config, Plan, Request, Result
from .scoring import SearchCache, Searcher


def runnable_nowhere(name: str) -> bool:
    """Whether no framework runs the family: more than one chain (DualPipe's two model
    copies: torch.distributed.pipelining runs one, Megatron-LM pipelines neither)."""
    return lookup(name).chains > 1

TIE = 5e-4  # a margin that prints as 0.0 %


def search_points(points: list[tuple[Point, object, Axes]], req: Request,
                  keep: Callable[[Plan], bool] | None = None) -> Result:
    """The ``req.top`` fastest plans over ``points`` (``(point, layer costs, axes)``); with
    ``keep``, of the plans it keeps only (a framework's runnable plans: the threshold is set
    by those, so the search stays as tight as for the top ``req.top`` of all)."""
    req.check()
    t0 = time.perf_counter()
    shared = SearchCache()
    searchers = [Searcher(costs, req, axes, shared) for _, costs, axes in points]
    work: list[tuple[float, Config, Searcher]] = []
    autos: list[tuple[Config, Searcher]] = []
    for s in searchers:
        for c in s.configs():
            if lookup(c.schedule).searched:
                autos.append((c, s))
            else:
                work.append((s.estimate(c), c, s))
    if not work and not autos:
        raise UserError(searchers[0].nothing_divides() if searchers else
                        f"no point of {param('tp')}, {param('cp')} and {param('shardings')} "
                        "applies to these GPUs")
    work.sort(key=lambda x: x[0])
    best: list[Plan] = []

    late: list[tuple[float, Config, Searcher]] = []  # costly: visited after the rest

    def threshold() -> float:
        """What a plan must beat: nothing until K plans are known, then the K-th step, a
        tie included (it may still sort before the K-th: ties go by plan_order, whatever
        the order of the visit)."""
        if not req.prune or len(best) < req.top:
            return math.inf
        return math.nextafter(best[-1].step_time, math.inf)

    def visit(c: Config, s: Searcher, may_defer: bool = False) -> None:
        limit = threshold()
        if c.bound >= limit:
            return  # no cut of c can enter the top K
        if may_defer and limit < math.inf and s.costly(c):
            late.append((0.0, c, s))
            return
        plan = s.evaluate(c, limit, req.gpu_memory)
        if plan is not None and (keep is None or keep(plan)):
            best.append(plan)
            best.sort(key=plan_order)
            del best[req.top:]

    for _, c, s in work:
        visit(c, s, may_defer=True)
    # auto searches orders (seconds each): after the families, by the bound of its cut,
    # against the threshold they have set; then the costly schedules, in the order of the
    # estimate, against the threshold auto has tightened.
    order = autos
    if threshold() < math.inf:
        order = sorted(((c, s) for c, s in autos if c.bound < threshold()),
                       key=lambda cs: cs[1].auto_bound(cs[0]))
    for c, s in order + [(c, s) for _, c, s in late]:
        visit(c, s)
    work += [(0.0, c, s) for c, s in autos]
    if not best:
        raise least_memory(searchers, [(c, s) for _, c, s in work])
    for k in range(len(best) - 1):  # no 0.0 % win for a schedule no framework runs
        a, b = best[k], best[k + 1]
        if (runnable_nowhere(a.schedule) and not runnable_nowhere(b.schedule)
                and b.step_time <= a.step_time * (1 + TIE)):
            best[k], best[k + 1] = b, a
    simulated = sum(s.simulated for s in searchers)
    return Result(best, len(work), simulated, time.perf_counter() - t0, req,
                  sum(s.auto_runs for s in searchers), sum(s.auto_seconds for s in searchers))


def plan_order(p: Plan) -> tuple:
    """Fastest first; on a tie the lighter plan, then one some framework runs, then the
    least model parallelism."""
    c = p.config
    return (p.step_time, max(p.peak_memory), runnable_nowhere(c.schedule), c.dims.model_parallel,
            c.pp, c.schedule, c.chunks, c.microbatch_size, c.recompute, c.sharding, c.sp)


def least_memory(searchers: list[Searcher], work: list[tuple[Config, Searcher]]):
    """Nothing fits: the error naming the least memory any point's plan needs and that plan
    (each searcher's :meth:`~Searcher.no_fit` over its own configurations)."""
    by: dict[int, list[Config]] = {}
    for c, s in work:
        by.setdefault(id(s), []).append(c)
    errors = [s.no_fit(by[id(s)]) for s in searchers if id(s) in by]
    return min(errors, key=lambda e: e.smallest)

