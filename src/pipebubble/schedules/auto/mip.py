"""The scheduling MIP, built and solved by HiGHS, and the window search ``auto`` runs on it.

:func:`solve` builds the program of :mod:`.exact` (start times, an order binary per pair of
actions of a rank, the dependency rule with comm, memory at the start of every action,
minimise the step) from a known order: its step time is the big M and its times the
solver's start. With ``free`` given, only those actions' order among themselves is open
and every other pair of a rank keeps its order.

:func:`polish` is a large-neighbourhood search with it: a window slides over the step,
opening every rank's next few actions at once, which reaches orders that moves of one
action at a time cannot (they need several ranks to change together). ``auto`` runs it on
small instances after its local search: an order 5.3 % above the optimum at p=2, m=5
under a tight limit comes out optimal. HiGHS (``highspy``) is imported when a solve starts.
"""

from __future__ import annotations

from itertools import pairwise

from ...costs import StageCosts, fit_bound, fits_limit
from ...ir.deps import Layout, precedences
from ...ir.schedule import Action, ScheduleError, make_schedule
from .bounds import lower_bound

POLISH_PASSES = (24, 36)  # actions a window opens over all ranks (6 a rank at least), per
# pass of the window over the step; a pass is skipped when one of its size found nothing since
POLISH_WIDE_UP_TO = 120  # actions: the wider pass runs only up to this size (it costs most)
POLISH_NODES = 50  # branch-and-bound nodes per window, at most (deterministic)
POLISH_GAP = 1e-3  # relative gap a window's solve stops at
POLISH_SECONDS = 5.0  # and a time limit per window, a guard that a node limit reaches first
WINDOW_WORK = 2_000  # work units a window costs whatever its size (the solver's setup)
ITERATION_WORK = 0.2  # work units per simplex iteration and window action (measured: 23 589
# iterations took 3-4 s at 192 actions, 0.16 a unit)
CHECK_WORK = 0.3  # work units per solver check and squared window action (about a root
# cut round, whose LP grows with the pairs of a rank: 38 checks took 2.15 s at 192 actions)
MIN_CHECKS = 8  # a window is not started with fewer checks than this left to it


def window_work(size: int, total: int, iterations: int, checks: int) -> float:
    """Work units of one window of ``size`` actions in an order of ``total``: the
    setup (building the program, simulating the result), then the solver's work, the
    larger of its simplex iterations' charge (times the size) and its checks' (times the
    size squared)."""
    return (WINDOW_WORK + size * size + total
            + max(ITERATION_WORK * iterations * size, CHECK_WORK * checks * size * size))


def check_cap(budget, size: int, total: int) -> int | None:
    """The solver checks a window of ``size`` actions may run to within what is left of
    ``budget``; None when fewer than ``MIN_CHECKS`` fit (the window is not started)."""
    room = budget.left - window_work(size, total, 0, 0)
    checks = int(room // (CHECK_WORK * size * size)) if room > 0 else 0
    if checks < MIN_CHECKS or budget.late():
        return None
    return checks


def polish(orders: list[list[Action]], sc: StageCosts, where: tuple[int, ...],
           microbatches: int, limits: list[float] | None,
           budget=None) -> tuple[list[list[Action]], float] | None:
    """Large-neighbourhood search with the MIP: slide a window over the step; in it, each
    rank's next few actions may take any order (the program of :func:`solve`, every
    other action kept in its place in its rank's order), and the solver picks the order of
    the window with the shortest step. A window that gives a shorter step, or the same
    step with every action ending earlier in sum, is kept. The passes open
    ``POLISH_PASSES`` actions over all ranks. A window whose actions all have slack is
    skipped. Deterministic: one
    thread and a node limit per window (its time limit is a guard that is not reached).
    With ``budget`` (a :class:`~.budget.Budget`) each window is charged
    (:func:`window_work`), its solver capped at the checks left (:func:`check_cap`), and
    the search stops when too little is left for one more. Returns the orders and their
    step time, or None when highspy is missing."""
    try:
        import highspy
    except ImportError:  # pragma: no cover - installed with pipebubble; kept for safety
        return None
    from ...sim.kernel import simulate

    S, m = len(where), microbatches
    p = len(orders)
    passes = POLISH_PASSES if 3 * S * m <= POLISH_WIDE_UP_TO else POLISH_PASSES[:1]
    sizes = [max(6, n // p) for n in passes]  # a rank's share (the same for p >= 6)
    edges = _edges(sc, where, m)
    cur = [[a if isinstance(a, Action) else Action(*a) for a in o] for o in orders]
    known = simulate(make_schedule("polish", cur, S, m, placement=list(where)), sc)
    score = _score(known)
    longest = max(len(o) for o in cur)
    fruitless: dict[int, tuple[float, float]] = {}  # window size -> the score it left alone
    total = sum(len(o) for o in cur)
    effort: list[tuple[int, int]] = []
    for size in sizes:
        if fruitless.get(size) == score:
            continue  # a pass of this size found nothing here already
        before = score
        t0 = 0.0
        while t0 < score[0]:
            began = starts(known)
            free = set()
            for o in cur:
                at = next((k for k, a in enumerate(o) if began[a] >= t0 - 1e-9), len(o))
                free.update(o[at:at + size])
            start = t0
            t0 += score[0] * size / (2 * longest)  # half a window on
            if len(free) < 2 or not free & _critical(cur, began, sc, edges, score[0]):
                continue  # reordering actions that all have slack cannot shorten the step
            checks, limit = None, POLISH_SECONDS
            if budget is not None:
                checks = check_cap(budget, len(free), total)
                if checks is None:
                    return cur, score[0]
                limit = min(limit, budget.seconds_left())
            solved = solve(highspy, sc, where, m, limits, cur, began, score[0], free=free,
                           time_limit=limit, gap=POLISH_GAP, nodes=POLISH_NODES,
                           settled=start, effort=effort, checks=checks)
            if budget is not None:
                budget.charge(window_work(len(free), total, *effort[-1]), "MIP windows")
            if solved[0] is None:
                continue
            timed = simulate(make_schedule("polish", solved[0], S, m, placement=list(where)),
                             sc)
            if _score(timed) < score and _within(timed, limits):
                cur, known, score = solved[0], timed, _score(timed)
        if score == before:
            fruitless[size] = score
    return cur, score[0]


def _critical(orders: list[list[Action]], began: dict[Action, float], sc: StageCosts,
              edges: list[tuple[Action, Action, float]], step: float) -> set[Action]:
    """The actions without slack: delaying one delays the step. Latest starts, from the
    end back, over the precedences (:func:`_edges`) and each rank's order."""
    succ: dict[Action, list[tuple[Action, float]]] = {a: [] for a in began}
    for a, b, lag in edges:
        succ[a].append((b, lag))
    for o in orders:
        for a, b in pairwise(o):
            succ[a].append((b, 0.0))
    waiting = dict.fromkeys(began, 0)
    for a in began:
        for b, _ in succ[a]:
            waiting[b] += 1
    order = [a for a in began if not waiting[a]]  # topological (Kahn), then walked back
    for a in order:
        for b, _ in succ[a]:
            waiting[b] -= 1
            if not waiting[b]:
                order.append(b)
    latest: dict[Action, float] = {}
    for a in reversed(order):
        end = step
        for b, lag in succ[a]:
            end = min(end, latest[b] - lag)
        latest[a] = end - sc.duration(a.stage, a.kind)
    return {a for a, t in latest.items() if t <= began[a] + 1e-9}


def starts(timeline) -> dict[Action, float]:
    return {Action(s, k, j): t for s, k, j, t in
            zip(timeline.stage, timeline.kind, timeline.microbatch, timeline.start, strict=True)}


def _score(timeline) -> tuple[float, float]:
    """(step time, sum of ends): a window is kept when it lowers this, in that order."""
    return (round(timeline.step_time, 9),
            round(float(sum(timeline.end)), 9))


def _within(timeline, limits: list[float] | None) -> bool:
    """Every rank's peak (the simulator's) within its limit."""
    return limits is None or all(
        fits_limit(x.peak_memory, cap)
        for x, cap in zip(timeline.rank_stats(), limits, strict=True))


def _edges(sc: StageCosts, where: tuple[int, ...], m: int) -> list[tuple[Action, Action, float]]:
    """The precedences, each "a ends before b starts" (after a lag): the dependency rule
    (:func:`~pipebubble.ir.deps.precedences`, with comm on hops) and, per stage and kind,
    microbatch order (as every schedule here runs). Listed per stage and microbatch: into
    I from its F, into W, into F, into I from the next stage, then microbatch order."""
    topo = Layout(len(where), tuple(where), (0,))
    S, comm = len(where), sc.comm
    acts = [Action(s, k, j) for s in range(S) for j in range(m) for k in "FIW"]
    into: dict[Action, list[tuple[Action, Action, float]]] = {a: [] for a in acts}
    for e in precedences(acts, topo):
        into[e.after].append((e.before, e.after, comm if e.crosses else 0.0))
    edges: list[tuple[Action, Action, float]] = []
    for s in range(S):
        for j in range(m):
            f, i, w = Action(s, "F", j), Action(s, "I", j), Action(s, "W", j)
            edges += into[i][:1] + into[w] + into[f] + into[i][1:]
            if j:
                edges += [(Action(s, k, j - 1), Action(s, k, j), 0.0) for k in "FIW"]
    return edges


def solve(highspy, sc: StageCosts, where: tuple[int, ...], m: int,
           limits: list[float] | None, orders: list[list[Action]],
           began: dict[Action, float], step: float, free: set[Action] | None,
           time_limit: float, gap: float, nodes: int | None = None,
           settled: float | None = None, tail_from: float | None = None,
           effort: list[tuple[int, int]] | None = None, checks: int | None = None):
    """The program of the module docstring, started from ``orders`` (timed: ``began``,
    ``step``, the big M). ``free``: only these actions' order among themselves is open,
    every other pair of a rank keeps its order in ``orders`` (None: all open); what starts
    before ``settled`` keeps its start (nothing after it can move it). Returns (orders,
    proven lower bound, proven optimal); orders None when the solver has no feasible
    point.

    ``tail_from``: only the actions starting at or after it are in the program (every
    order among them open), the rest kept in place as constants: nothing that starts
    before it waits for anything that starts after, so their times stay; they give each
    rank's free time, each action's release and each rank's memory at the cut.
    ``effort``, a list, gets (simplex iterations, checks) appended: counts of the solver's
    work that are the same on every machine (one thread), the checks being its interrupt
    callbacks (a few a cut round of the root, one every few nodes after). ``checks``
    caps them: the solve stops at the next check past it, with the best order found so
    far (the start order at worst), which bounds the root's work, which the node limit
    does not."""
    S = len(where)
    p = max(where) + 1
    horizon = step + 1e-6
    acts = [Action(s, k, j) for s in range(S) for j in range(m) for k in "FIW"]
    dur = {a: sc.duration(a.stage, a.kind) for a in acts}
    mem = {a: sc.memory_deltas(a.stage, a.kind) for a in acts}
    edges = _edges(sc, where, m)
    given: dict[Action, float] = {}  # release from the kept prefix (tail_from)
    offset = [0.0] * p  # memory each rank holds at the cut
    prefix_end = 0.0
    prefix: list[list[Action]] = [[] for _ in range(p)]
    if tail_from is not None:
        cut = tail_from - 1e-9
        window = {a for a in acts if began[a] >= cut}
        for r, o in enumerate(orders):
            ends = 0.0
            for a in o:
                if a in window:
                    given[a] = max(given.get(a, 0.0), ends)
                else:
                    prefix[r].append(a)
                    ends = max(ends, began[a] + dur[a])
                    offset[r] += mem[a][0] + mem[a][1]
            prefix_end = max(prefix_end, ends)
        kept = []
        for a, b, lag in edges:
            if a in window:
                kept.append((a, b, lag))
            elif b in window:
                given[b] = max(given.get(b, 0.0), began[a] + dur[a] + lag)
        edges = kept
        acts = [a for a in acts if a in window]
        orders = [[a for a in o if a in window] for o in orders]
        free = set(acts)
    pos: dict[Action, int] = {}
    if free is not None:  # the rest keeps its order: a chain per rank, free ones inside it
        for o in orders:
            pos.update((a, k) for k, a in enumerate(o))
            kept = [a for a in o if a not in free]
            edges += [(a, b, 0.0) for a, b in pairwise(kept)]
            last = None
            for k, a in enumerate(o):
                if a not in free:
                    last = a
                    continue
                if last is not None:
                    edges.append((last, a, 0.0))
                after_a = next((b for b in o[k + 1:] if b not in free), None)
                if after_a is not None:
                    edges.append((a, after_a, 0.0))
    succ: dict[Action, list[Action]] = {a: [] for a in acts}
    for a, b, _ in edges:
        succ[a].append(b)
    after = _reach(acts, succ)
    # Time windows: no action starts before its longest path from the start (its release)
    # nor later than the horizon less its longest path to the end (its tail, itself
    # included). They bound every start, tighten each big M, and fix the order of two
    # actions of a rank whose windows cannot overlap that way round.
    release, tail = _windows(acts, edges, dur, given)
    floor = max(lower_bound(sc, where, m), prefix_end,
                max((release[a] + tail[a] for a in acts), default=0.0))
    latest = {a: horizon - tail[a] for a in acts}
    if settled is not None and tail_from is None:  # what starts before keeps its start
        for a in acts:
            if began[a] < settled - 1e-9:
                release[a] = latest[a] = began[a]
    # Columns: a start per action, the step (the objective), then the order binaries.
    col = {a: n for n, a in enumerate(acts)}
    makespan = len(acts)
    rows = _Rows()
    binaries: list[float] = []  # the start order's value of each binary (its warm start)

    def binary(value: float) -> int:
        binaries.append(value)
        return makespan + len(binaries)

    fixed = {a for a in acts if latest[a] <= release[a]}
    for a in acts:
        if not succ[a]:  # the step ends after every last action (the rest follow one)
            rows.add(dur[a], [(makespan, 1.0), (col[a], -1.0)])
    for a, b, lag in edges:
        if not (a in fixed and b in fixed):
            rows.add(dur[a] + lag, [(col[b], 1.0), (col[a], -1.0)])
    for r in range(p):
        mine = [a for a in acts if where[a.stage] == r]
        before = {}  # (a, b) -> 1 if a runs before b, or its binary's column
        for u in range(len(mine)):
            for v in range(u + 1, len(mine)):
                a, b = mine[u], mine[v]
                if b in after[a]:  # the precedences already order them
                    before[a, b], before[b, a] = 1, 0
                    continue
                if a in after[b]:
                    before[a, b], before[b, a] = 0, 1
                    continue
                if free is not None and not (a in free and b in free):
                    first, then = (a, b) if pos[a] < pos[b] else (b, a)
                    before[first, then], before[then, first] = 1, 0
                    continue
                # b cannot end before a's latest start: a goes first (and the reverse)
                ab = release[b] + dur[b] > latest[a] + 1e-9
                ba = release[a] + dur[a] > latest[b] + 1e-9
                if ab != ba:
                    first, then = (a, b) if ab else (b, a)
                    rows.add(dur[first], [(col[then], 1.0), (col[first], -1.0)])
                    before[first, then], before[then, first] = 1, 0
                    continue
                y = binary(1.0 if (began[a], a.kind) < (began[b], b.kind) else 0.0)
                # a before b: x_a + d_a <= x_b, relaxed by the most it can be off otherwise
                big_ab = max(0.0, latest[a] + dur[a] - release[b])
                big_ba = max(0.0, latest[b] + dur[b] - release[a])
                # x_b - x_a + big_ab (1 - y) >= d_a;  x_a - x_b + big_ba y >= d_b
                rows.add(dur[a] - big_ab, [(col[b], 1.0), (col[a], -1.0), (y, -big_ab)])
                rows.add(dur[b], [(col[a], 1.0), (col[b], -1.0), (y, big_ba)])
                before[a, b], before[b, a] = ("y", y), ("not y", y)
        if limits is None:
            continue
        for a in mine:
            if free is not None and a not in free:
                continue  # the same actions run before it as in the start order: it fits
            load, terms = mem[a][0] + offset[r], {}
            for b in mine:
                if b == a:
                    continue
                net, how = mem[b][0] + mem[b][1], before[b, a]
                if isinstance(how, int):
                    load += net * how
                elif how[0] == "y":
                    terms[how[1]] = terms.get(how[1], 0.0) + net
                else:  # 1 - y
                    load += net
                    terms[how[1]] = terms.get(how[1], 0.0) - net
            if not terms:  # every order around a is fixed
                if not fits_limit(load, limits[r]):
                    raise ScheduleError(f"no order fits memory limit {limits[r]:g} on rank {r}")
                continue
            rows.add(-_INF, list(terms.items()),
                     upper=fit_bound(limits[r]) - load)
    h = _new_highs(highspy)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(gap))
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", int(nodes))
    lower = [release[a] for a in acts] + [min(floor, horizon)] + [0.0] * len(binaries)
    upper = ([max(release[a], latest[a]) for a in acts] + [horizon]
             + [1.0] * len(binaries))
    rows.load(h, lower, upper, makespan, len(binaries))
    warm = highspy.HighsSolution()
    warm.col_value = [began[a] for a in acts] + [step] + binaries  # the start order
    warm.value_valid = True
    h.setSolution(warm)
    seen = [0]

    def check(event) -> None:
        seen[0] += 1
        if checks is not None and seen[0] > checks:
            event.interrupt()

    h.cbMipInterrupt.subscribe(check)
    h.run()
    info = h.getInfo()
    if effort is not None:
        effort.append((max(0, int(info.simplex_iteration_count)), seen[0]))
    bound = float(info.mip_dual_bound)
    if info.primal_solution_status != 2:
        return None, bound, False
    values = h.getSolution().col_value
    at = {a: values[col[a]] for a in acts}
    key = (lambda a: (at[a], pos[a])) if free is not None else (lambda a: (at[a], a.kind))
    new = [prefix[r] + sorted((a for a in acts if where[a.stage] == r), key=key)
           for r in range(p)]
    return new, bound, h.getModelStatus() == highspy.HighsModelStatus.kOptimal


_INF = float("inf")


class _Rows:
    """Constraints ``lower <= sum of value * column <= upper``, gathered, then passed to
    HiGHS in one call (building them one by one through its expressions costs more than
    solving a window)."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.starts: list[int] = []
        self.index: list[int] = []
        self.value: list[float] = []

    def add(self, lower: float, terms: list[tuple[int, float]], upper: float = _INF) -> None:
        self.lower.append(lower)
        self.upper.append(upper)
        self.starts.append(len(self.index))
        for column, value in terms:
            self.index.append(column)
            self.value.append(value)

    def load(self, h, lower: list[float], upper: list[float], objective: int,
             binaries: int) -> None:
        """Columns with these bounds (the last ``binaries`` integer), the rows, and the
        objective: minimise column ``objective``."""
        import numpy as np

        n = len(lower)
        h.addVars(n, np.array(lower), np.array(upper))
        if binaries:
            h.changeColsIntegrality(binaries, np.arange(n - binaries, n, dtype=np.int32),
                                    np.ones(binaries, dtype=np.uint8))
        h.changeColsCost(1, np.array([objective], dtype=np.int32), np.array([1.0]))
        h.addRows(len(self.lower), np.array(self.lower), np.array(self.upper),
                  len(self.index), np.array(self.starts, dtype=np.int32),
                  np.array(self.index, dtype=np.int32), np.array(self.value))


_BANNER_SHOWN = [False]


def _new_highs(highspy):
    """A silent solver. HiGHS prints a banner on the process's stdout when the first one is
    made, before any option can turn it off; that would break ``--json`` output, so the
    first one is made with file descriptor 1 pointed at /dev/null."""
    import os
    import sys

    if _BANNER_SHOWN[0]:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            _BANNER_SHOWN[0] = True
    h.setOptionValue("output_flag", False)
    return h


def _windows(acts: list[Action], edges: list[tuple[Action, Action, float]],
             dur: dict[Action, float], given: dict[Action, float] | None = None
             ) -> tuple[dict[Action, float], dict[Action, float]]:
    """Per action, the longest path of durations and lags before its start (release, at
    least ``given``) and from its start to the end of the step (tail, its own duration
    included)."""
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
    release = {a: (given or {}).get(a, 0.0) for a in acts}
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
