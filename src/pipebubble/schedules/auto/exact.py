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

It is exponential in the worst case: use it for p x m up to about 32 (seconds). HiGHS
(``highspy``) is an optional dependency (``pip install highspy``), imported here only.

>>> from pipebubble.costs import CostModel
>>> best = optimal_schedule(2, 2, CostModel(), memory_limit=2, placement="loop")
>>> best.step_time, best.proven
(7.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from ...costs import CostModel
from ...ir.schedule import (
    Action,
    Schedule,
    ScheduleError,
    loop_placement,
    make_schedule,
    v_placement,
)


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
    from .bounds import lower_bound

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
    began = {Action(s, k, j): t for s, k, j, t in
             zip(known.stage, known.kind, known.microbatch, known.start, strict=True)}
    horizon = known.step_time + 1e-6

    acts = [Action(s, k, j) for s in range(S) for j in range(m) for k in "FIW"]
    dur = {a: sc.duration(a.stage, a.kind) for a in acts}
    mem = {a: sc.memory_deltas(a.stage, a.kind) for a in acts}
    # Precedences, each "a ends before b starts" (after a lag): the dependency rule
    # (ir/deps.py, with comm on hops) and, per stage and kind, microbatch order (as every
    # schedule here runs).
    comm = sc.comm
    edges: list[tuple[Action, Action, float]] = []
    for s in range(S):
        up = comm if s and where[s - 1] != where[s] else 0.0
        down = comm if s < S - 1 and where[s + 1] != where[s] else 0.0
        for j in range(m):
            f, i, w = Action(s, "F", j), Action(s, "I", j), Action(s, "W", j)
            edges += [(f, i, 0.0), (i, w, 0.0)]
            if s:
                edges.append((Action(s - 1, "F", j), f, up))
            if s < S - 1:
                edges.append((Action(s + 1, "I", j), i, down))
            if j:
                edges += [(Action(s, k, j - 1), Action(s, k, j), 0.0) for k in "FIW"]
    succ: dict[Action, list[Action]] = {a: [] for a in acts}
    for a, b, _ in edges:
        succ[a].append(b)
    after = _reach(acts, succ)
    # Time windows: no action starts before its longest path from the start (its release)
    # nor later than the horizon less its longest path to the end (its tail, itself
    # included). They bound every start, tighten each big M, and fix the order of two
    # actions of a rank whose windows cannot overlap that way round.
    release, tail = _windows(acts, edges, dur)
    floor = max(lower_bound(sc, where, m), max(release[a] + tail[a] for a in acts))
    latest = {a: horizon - tail[a] for a in acts}
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(gap))
    x = {a: h.addVariable(lb=release[a], ub=max(release[a], latest[a])) for a in acts}
    makespan = h.addVariable(lb=min(floor, horizon), ub=horizon)
    guess = [began[a] for a in acts] + [known.step_time]  # the start order, column by column
    for a in acts:
        h.addConstr(makespan >= x[a] + dur[a])
    for a, b, lag in edges:
        h.addConstr(x[b] >= x[a] + dur[a] + lag)
    for r in range(p):
        mine = [a for a in acts if where[a.stage] == r]
        before = {}  # (a, b) -> 1 if a runs before b (a constant where the rules decide)
        for u in range(len(mine)):
            for v in range(u + 1, len(mine)):
                a, b = mine[u], mine[v]
                if b in after[a]:  # the precedences already order them
                    before[a, b], before[b, a] = 1, 0
                    continue
                if a in after[b]:
                    before[a, b], before[b, a] = 0, 1
                    continue
                # b cannot end before a's latest start: a goes first (and the reverse)
                ab = release[b] + dur[b] > latest[a] + 1e-9
                ba = release[a] + dur[a] > latest[b] + 1e-9
                if ab != ba:
                    first, then = (a, b) if ab else (b, a)
                    h.addConstr(x[first] + dur[first] <= x[then])
                    before[first, then], before[then, first] = 1, 0
                    continue
                y = h.addBinary()
                guess.append(1.0 if (began[a], a.kind) < (began[b], b.kind) else 0.0)
                # a before b: x_a + d_a <= x_b, relaxed by the most it can be off otherwise
                big_ab = max(0.0, latest[a] + dur[a] - release[b])
                big_ba = max(0.0, latest[b] + dur[b] - release[a])
                h.addConstr(x[a] + dur[a] <= x[b] + big_ab * (1 - y))
                h.addConstr(x[b] + dur[b] <= x[a] + big_ba * y)
                before[a, b], before[b, a] = y, 1 - y
        if limits is None:
            continue
        for a in mine:
            load = mem[a][0]
            for b in mine:
                if b != a:
                    load = load + (mem[b][0] + mem[b][1]) * before[b, a]
            if isinstance(load, int | float):  # every order around a is fixed
                if load > limits[r] + 1e-9:
                    raise ScheduleError(f"no order fits memory limit {limits[r]:g} on rank {r}")
                continue
            h.addConstr(load <= limits[r] + 1e-9)
    warm = highspy.HighsSolution()
    warm.col_value = guess
    warm.value_valid = True
    h.setSolution(warm)
    h.minimize(makespan)
    info = h.getInfo()
    values = h.getSolution().col_value
    if info.primal_solution_status != 2:  # no feasible point: keep the start order
        return Optimum(start, known.step_time, float(info.mip_dual_bound), False)
    at = {a: values[x[a].index] for a in acts}
    orders = [sorted((a for a in acts if where[a.stage] == r), key=lambda a: (at[a], a.kind))
              for r in range(p)]
    sched = make_schedule("optimal", orders, S, m, placement=list(where))
    step = simulate(sched, sc).step_time
    bound = float(info.mip_dual_bound)
    if step > known.step_time:  # cannot happen for a feasible point; keep the better one
        sched, step = start, known.step_time
    return Optimum(sched, step, bound, h.getModelStatus() == highspy.HighsModelStatus.kOptimal)


def _windows(acts: list[Action], edges: list[tuple[Action, Action, float]],
             dur: dict[Action, float]) -> tuple[dict[Action, float], dict[Action, float]]:
    """Per action, the longest path of durations and lags before its start (release) and
    from its start to the end of the step (tail, its own duration included)."""
    succ: dict[Action, list[tuple[Action, float]]] = {a: [] for a in acts}
    pred: dict[Action, list[tuple[Action, float]]] = {a: [] for a in acts}
    for a, b, lag in edges:
        succ[a].append((b, lag))
        pred[b].append((a, lag))
    order: list[Action] = []  # topological, by Kahn's rule
    count = {a: len(pred[a]) for a in acts}
    ready = [a for a in acts if not count[a]]
    while ready:
        a = ready.pop()
        order.append(a)
        for b, _ in succ[a]:
            count[b] -= 1
            if not count[b]:
                ready.append(b)
    release = {a: 0.0 for a in acts}
    for a in order:
        for b, lag in succ[a]:
            release[b] = max(release[b], release[a] + dur[a] + lag)
    tail = {a: dur[a] for a in acts}
    for a in reversed(order):
        for b, lag in succ[a]:
            tail[a] = max(tail[a], dur[a] + lag + tail[b])
    return release, tail


def _reach(acts: list[Action], succ: dict[Action, list[Action]]) -> dict[Action, set[Action]]:
    """Every action each action must precede (transitive closure of the precedences)."""
    out: dict[Action, set[Action]] = {}

    def visit(a: Action) -> set[Action]:
        if a not in out:
            seen: set[Action] = set()
            for b in succ[a]:
                seen.add(b)
                seen |= visit(b)
            out[a] = seen
        return out[a]

    for a in acts:
        visit(a)
    return out
