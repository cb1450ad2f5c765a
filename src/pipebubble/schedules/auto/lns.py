"""Large-neighbourhood search over the tail of a large order: the cool-down re-solved exact.

On large orders the steady state of a good order is tight (a repeated block, or the
greedy's fill); what the search can still win is at the ends, where ranks drain one after
another. The local search and the MIP windows of :mod:`.mip` (``mip.polish``) stop at
small sizes because their program holds every action. This stage does not: a *tail
window* is every action that starts at or after a cut time ``t``. Nothing before ``t``
waits for anything after it, so the part before the cut keeps its times whatever the tail
does, and the tail alone is a small program (:func:`.mip.solve` with ``tail_from``): each
rank's free time, each action's release and each rank's memory at the cut are constants.
HiGHS then picks any order of the tail's actions (every rank at once, which moves of one
action cannot do) with the shortest step that fits the limit.

The cut is placed so the window opens ``LNS_PER_RANK`` actions a rank, smallest first;
a window that shortens the step (or keeps it and ends every action earlier in sum) is
kept, re-simulated by the one simulator and checked against the limit, and the sizes
start over from the smallest. It stops when its :class:`~.budget.Budget` (the search's
one ledger) is spent: a window starts only while ``START_WORK`` work units per squared
action count are left, and is charged after its solve by :func:`.mip.window_work` (its
setup, and the solver's simplex iterations and checks times its size: counts, not the
clock; one solver thread and a node limit per window). HiGHS's root (presolve, cut
rounds, heuristics) ignores the node limit, so each solve is also given a cap on its
checks, what is left of the ledger (:func:`.mip.check_cap`): a fruitless root stops there
instead of running past the budget. So the result is the same on every machine, it is
never slower than its start and never over the limit. (A wall-clock deadline, when one
is asked for, is the solver's time limit too: see :mod:`.budget`.)

Under unit costs (F = I = W = 1 a chunk) at p = 4, m = 16 and a limit of 5 chunk
activations, the adaptive V stage's best order takes 105 passes; one window of 16
actions a rank brings it to 104, the optimum (``6m + 6p - 1 - 3k``).
"""

from __future__ import annotations

from ...costs import StageCosts
from ...ir.schedule import Action, make_schedule
from .adaptive import SCORE_WORK
from .budget import Budget
from .mip import _score, _within, check_cap, solve, starts, window_work

LNS_PER_RANK = (8, 16, 24)  # actions a rank a tail window opens, smallest first
LNS_NODES = 50  # branch-and-bound nodes per window, at most (deterministic)
LNS_GAP = 1e-3  # relative gap a window's solve stops at
LNS_GUARD_SECONDS = 60.0  # a time limit per window, a guard the node limit reaches first
START_WORK = 8.0  # work units a window needs left, per squared action count


def tail_windows(orders: list[list[Action]], sc: StageCosts, where: tuple[int, ...],
                 microbatches: int, limits: list[float] | None, budget: Budget
                 ) -> tuple[list[list[Action]], float, int] | None:
    """Re-solve tail windows of ``orders`` (see the module docstring) while ``budget``
    lasts. Returns (orders, step time, windows solved), the orders never slower than
    the start and within ``limits``; None when highspy is missing."""
    try:
        import highspy
    except ImportError:  # pragma: no cover - installed with pipebubble; kept for safety
        return None
    from ...sim.kernel import simulate

    S, m = len(where), microbatches
    p = len(orders)
    cur = []  # a fused backward B as its I then its W (never later, never more memory)
    for o in orders:
        row = []
        for a in o:
            a = a if isinstance(a, Action) else Action(*a)
            row += ([Action(a.stage, "I", a.microbatch), Action(a.stage, "W", a.microbatch)]
                    if a.kind == "B" else [a])
        cur.append(row)
    total = sum(len(o) for o in cur)
    if not budget.spend(SCORE_WORK * total, "tail windows"):
        return None  # not even the start's timing fits
    timed = simulate(make_schedule("lns", cur, S, m, placement=list(where)), sc)
    score = _score(timed)
    solved_windows = 0
    effort: list[tuple[int, int]] = []
    n = 0
    while n < len(LNS_PER_RANK):
        size = min(total, LNS_PER_RANK[n] * p)
        if budget.left < START_WORK * size * size:
            break  # too little left for a window this size: the smaller ones ran
        checks = check_cap(budget, size, total)
        if checks is None:
            break
        began = starts(timed)
        cut = sorted(began.values(), reverse=True)[size - 1]
        new = solve(highspy, sc, where, m, limits, cur, began, score[0], None,
                    time_limit=min(LNS_GUARD_SECONDS, budget.seconds_left()), gap=LNS_GAP,
                    nodes=LNS_NODES, tail_from=cut, effort=effort, checks=checks)[0]
        solved_windows += 1
        budget.charge(window_work(size, total, *effort[-1]), "tail windows")
        if new is not None:
            got = simulate(make_schedule("lns", new, S, m, placement=list(where)), sc)
            if _score(got) < score and _within(got, limits):
                cur, timed, score = new, got, _score(got)
                n = 0
                continue
        if size == total:
            break
        n += 1
    return cur, score[0], solved_windows
