"""The exact optimum for small instances: a mixed-integer program solved by HiGHS.

After the Zero Bubble paper's ILP (Qi et al. 2024, appendix G), with the step time (the
makespan) as the objective, over the orders that run each stage's Fs, Is and Ws in
microbatch order (as every schedule here, ``auto`` included, does). For every action ``a``
(F, I, W of a stage and microbatch) a start time ``x_a``; for every two actions ``a, b`` of
one rank whose order the precedences do not already fix, a binary ``y_ab`` (1: a runs
before b) with the big-M pair ``x_a + d_a <= x_b + H (1 - y_ab)`` and
``x_b + d_b <= x_a + H y_ab`` (``H``: a known step time, e.g. ``auto``'s); the precedences:
the dependency rule (``ir/deps.py``) with ``comm`` on hops between ranks, and microbatch
order; and, at the start of every action, the rank's activation memory,
``d0_a + sum over b of y_ba (d0_b + d1_b)``, within the limit. Minimise ``C >= x_a + d_a``.

It is exponential in the worst case: use it for p x m up to about 32 (seconds).

The program itself is built and solved in :mod:`.mip`, which ``auto`` also uses on windows
of its orders (:func:`.mip.polish`).

>>> from pipebubble.costs import CostModel
>>> best = optimal_schedule(2, 2, CostModel(), memory_limit=2, placement="loop")
>>> best.step_time, best.proven
(7.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from ...costs import CostModel
from ...ir.schedule import (
    Schedule,
    ScheduleError,
    loop_placement,
    make_schedule,
    v_placement,
)
from .mip import solve, starts


@dataclass
class Optimum:
    """The solver's answer: the best order found, its step time, the proven lower bound."""

    schedule: Schedule
    step_time: float
    lower_bound: float
    proven: bool  # the solver closed the gap: step_time is optimal


def optimal_schedule(ranks: int, microbatches: int, costs: CostModel | None = None,
                     memory_limit=None, placement: str = "loop",
                     start: Schedule | None = None, time_limit: float = 60.0,
                     gap: float = 1e-6) -> Optimum:
    """Solve the MIP above for ``placement`` ``loop`` (1 stage per rank) or ``v`` (2).

    ``start``: an order that fits (default: ``auto``'s); its step time is the big M and
    the solver starts from it, so the answer is never worse than it, even when the time
    limit stops the search (then ``proven`` is False). ``gap``: the solver stops once its
    order is proven within this fraction of the optimum (``proven`` then says so; the
    default asks for the optimum itself)."""
    try:
        import highspy
    except ImportError:  # pragma: no cover - an optional dependency
        raise ScheduleError("the exact optimum needs highspy: pip install highspy") from None
    from ...sim.kernel import simulate
    from . import auto_schedule

    costs = costs or CostModel()
    if memory_limit is None:
        memory_limit = costs.memory_limit
    if placement not in ("loop", "v"):
        raise ScheduleError(f"placement must be loop or v, got {placement!r}")
    p, m = ranks, microbatches
    where = loop_placement(p, p) if placement == "loop" else v_placement(p)
    S = len(where)
    sc = costs.resolve(S, 1 if placement == "loop" else 2)
    limits = CostModel(memory_limit=memory_limit).rank_limits(p)
    if start is None:
        start = auto_schedule(p, m, costs, memory_limit, placement)
    if start.stage_to_rank != where:
        raise ScheduleError(f"the start order is not in the {placement} placement")
    known = simulate(start, sc)
    began = starts(known)
    orders, bound, proven = solve(highspy, sc, where, m, limits, start.orders, began,
                                   known.step_time, free=None, time_limit=time_limit, gap=gap)
    if orders is None:  # no feasible point: keep the start order
        return Optimum(start, known.step_time, bound, False)
    sched = make_schedule("optimal", orders, S, m, placement=list(where))
    step = simulate(sched, sc).step_time
    if step > known.step_time:  # cannot happen for a feasible point; keep the better one
        sched, step = start, known.step_time
    return Optimum(sched, step, bound, proven)
