"""``auto``: the fastest order found for measured costs under a memory limit.

:func:`auto_schedule` takes per-stage F, I, W, comm, M_B, M_W (a :class:`CostModel`) and an
activation-memory limit per rank, and returns the fastest order it finds that respects the
limit on every rank, in the loop placement (one stage per rank) or the V placement (two
chunks per rank, as ZB-V), whichever is faster. Candidates:

- every registered schedule of that placement (1F1B, ZB-H1, ZB-H2, GPipe; ZB-V, V-Half,
  V-Min, DualPipeV) whose simulated peak fits: so auto is never slower than any of them;
- when V-Min does not fit, V-Min's published block (it holds less when M_W < M_B and
  p mod 3 = 2), else V-Min's and V-Half's published building blocks repeated every T > 6
  units (``building_block.py``), at the smallest T that fits;
- the greedy list scheduler (:mod:`.greedy`) over a grid of its knobs, which fills the
  memory it is given (Zero Bubble's heuristic, both placements);
- in the V placement, the adaptive building-block search (:mod:`.adaptive`): many blocks
  of the V-Half/V-Min family, the most memory that fits first, each repeated with its
  warm-up and cool-down reordered (and under a limit with the paper's cool-down wave);
- on small instances (up to 300 actions), a local search (:mod:`.improve`) from the three
  best orders of each placement: simulated annealing over moves of one action within its
  rank, swaps of two, and the same move on every rank, then a hill climb; seeded by the
  instance, so deterministic;
- on the smallest (up to 200 actions), MIP windows (:func:`.mip.polish`): HiGHS reorders
  every rank's next few actions at once, window after window over the step, from the best
  searched order (and the other placement's if it is within 2 %); one thread and a node
  limit per window, so deterministic too;
- on bigger orders, tail windows (:mod:`.lns`): every action after a cut time re-solved
  by the same MIP, the part before the cut kept as constants.

Every stage after the registered schedules charges one ledger (:mod:`.budget`) of
``search_seconds`` of work, counted not timed, and stops when it is spent: a budget of 0
returns the best registered schedule (or, when none fits, one greedy order).

Every candidate is scored by the one simulator (:func:`pipebubble.sim.simulate`) with the
same costs (the greedy's own clock, the same rule, only steers its choices); the fastest
(then the one with least idle time inside the ranks' spans) wins, is re-simulated,
validated and returned as a Schedule named ``auto`` (the last :data:`REMEMBER` answers are
kept: an identical request is answered again without searching) whose ``options["auto"]`` is its
:class:`Provenance`: the winning generator, the search stages that ran (time and gain of
each), the placement, the step time and the provable lower bound (:mod:`.bounds`, named by
kind) with the gap to it. ``auto`` is registered: ``get_schedule("auto", ranks,
microbatches, costs=..., memory_limit=...)`` builds it like any schedule.

>>> from pipebubble.costs import CostModel
>>> s = auto_schedule(4, 8, CostModel(f=1, b=2, w=1), memory_limit=4, placement="loop")
>>> info = s.options["auto"]
>>> info.step_time, info.lower_bound.value, info.lower_bound.kind, info.gap
(27.0, 27.0, 'busiest rank', 0.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ...costs import CostModel, StageCosts, fits_limit
from ...ir.schedule import (
    Action,
    Overlap,
    PackedOrder,
    Schedule,
    ScheduleError,
    loop_placement,
    make_schedule,
    step_actions,
    v_placement,
)
from ...ir.schedule import validate as validate_schedule
from ..registry import ScheduleSpec, check_counts, get_schedule, lookup, register, schedule_names
from .adaptive import adaptive_orders, score_cost
from .bounds import LowerBound, bound, min_limits
from .budget import WORK_PER_SECOND, Budget
from .greedy import Knobs, greedy_order
from .improve import anneal, improve
from .lns import LNS_PER_RANK, tail_windows
from .mip import check_cap, polish

PLACEMENTS = ("any", "loop", "v")


class LimitTooSmall(ScheduleError):
    """The memory limit is below the smallest one any order fits in; the message names it."""


_CHUNKS = {"loop": 1, "v": 2}
_TOL = 1e-9
IMPROVE_UP_TO = 300  # actions: the local search runs up to this size
ANNEAL_BUDGET = 30000  # moves tried by the annealing (one evaluation each), at most
ANNEAL_WORK = 500_000  # and at most this many actions timed in all (its time)
SEARCH_WITHIN = 0.15  # a placement whose best is this much slower than the best is not searched
SEARCH_STARTS = 3  # the local search anneals from this many of the best orders
ANNEAL_SETTINGS = [dict(hot=0.03, columns=0.4)]  # one per start, in turn
CLIMB_BUDGET = 3000  # evaluations of the hill climb that polishes the annealed order
POLISH_UP_TO = 200  # actions: the MIP windows (mip.polish) run up to this size (V: p·m <= 33)
POLISH_WITHIN = 0.02  # and polish a placement whose searched order is this close to the best
SEARCH_SECONDS = 0.6  # the search's budget (every stage after the registered), by default
GREEDY_WORK = 1.0  # work units of one greedy pass and its scoring, per action (measured:
# 0.4-1.0 from 2 to 4 processes on the 2 cores)
EVAL_WORK = 0.1  # work units of one local-search evaluation, per action (measured: the
# full local search, about 600 000 action evaluations, took 0.07-0.3 s at p <= 3)
REMEMBER = 64  # answers kept for identical requests (one plan asks ~10: 8 thrashed)
_REMEMBERED: OrderedDict[tuple, Schedule] = OrderedDict()  # request -> answer, oldest first


def knob_grid(ranks: int, microbatches: int, chunks: int) -> list[Knobs]:
    """The knob settings tried, most often best first (measured over p in {4, 8}, six
    limits, four cost models); big instances try the first few only (one greedy pass
    each). ``deep_first`` never changed a result there, so it stays on."""
    if chunks == 1:
        grid = [Knobs("h2", True, False), Knobs("memory", True, False),
                Knobs("memory", False, False), Knobs("1f1b", True, False),
                Knobs("h2", False, False), Knobs("memory", False, True),
                Knobs("1f1b", False, False), Knobs("1f1b", False, True),
                Knobs("h2", False, True), Knobs("memory", True, True),
                Knobs("memory", False, False, critical=True),
                Knobs("memory", True, False, critical=True)]
    else:
        grid = [Knobs("memory", False, False), Knobs("memory", True, True),
                Knobs("memory", True, False), Knobs("memory", False, True),
                Knobs("h2", False, False), Knobs("h2", True, False),
                Knobs("1f1b", False, False), Knobs("memory", False, False, critical=True),
                Knobs("memory", True, False, critical=True)]
    size = ranks * microbatches * chunks
    if size > 4096:
        return grid[:3] if chunks == 1 else grid[:2]
    if size > 1024:
        return grid[:5]
    return grid


def auto_schedule(
    ranks: int,
    microbatches: int,
    costs: CostModel | None = None,
    memory_limit: float | Sequence[float] | None = None,
    placement: str = "any",
    mip_windows: bool = True,
    search_seconds: float | None = None,
    search_deadline: float | None = None,
) -> Schedule:
    """The fastest order found for ``costs`` within ``memory_limit`` (per rank, or one value
    for all; default ``costs.memory_limit``) in ``placement`` ``any``, ``loop`` or ``v``.
    ``mip_windows=False`` stops after the local search (faster on small instances; the
    windows only ever replace an order with a faster one that fits).

    ``search_seconds`` (default :data:`SEARCH_SECONDS`) is the budget of every stage
    after the registered schedules (they always run: auto is never slower than them),
    one ledger (:class:`~.budget.Budget`) that the greedy passes, the adaptive V stage,
    the local search, the MIP windows and the tail windows charge in turn; it counts
    work, not time, so the result is the same on every machine and under any load.
    ``search_deadline`` (seconds; default None: no clock) adds a wall-clock limit only
    when asked: past it every stage stops at its next check (:mod:`.budget`), and
    ``options["auto"].budget_hit`` says so; only then may the order depend on the machine.

    The answer is deterministic, so the last :data:`REMEMBER` answers are kept: an
    identical request (same ranks, microbatches, costs, limit, placement, windows and
    budget; costs of numbers and lists of numbers) returns a copy of the earlier schedule
    without searching.

    Raises ScheduleError naming the smallest feasible limit when ``memory_limit`` is below it.
    """
    seconds = SEARCH_SECONDS if search_seconds is None else search_seconds
    if search_deadline is not None and not (search_deadline > 0
                                            and math.isfinite(search_deadline)):
        raise ScheduleError(f"search_deadline must be a finite number of seconds > 0 (or "
                            f"None: no clock), got {search_deadline!r}")
    request = _request_key(ranks, microbatches, costs, memory_limit, placement, mip_windows,
                           seconds, search_deadline)
    if request is not None and request in _REMEMBERED:
        _REMEMBERED.move_to_end(request)
        return _copy(_REMEMBERED[request])
    out = _search(ranks, microbatches, costs, memory_limit, placement, mip_windows, seconds,
                  search_deadline)
    if request is not None:
        _REMEMBERED[request] = out
        while len(_REMEMBERED) > REMEMBER:
            _REMEMBERED.popitem(last=False)
    return _copy(out)


def _request_key(*request) -> tuple | None:
    """The request as a dict key (lists as tuples, a CostModel as its fields, which the
    planner passes as per-stage lists); None if something in it is unhashable."""
    key = _frozen(request)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(x):
    if isinstance(x, list | tuple):
        return tuple(_frozen(v) for v in x)
    if isinstance(x, CostModel):
        return (CostModel, *(_frozen(getattr(x, f.name)) for f in dataclasses.fields(x)))
    return x


def _copy(sched: Schedule) -> Schedule:
    """The remembered schedule with its own options dict (orders are tuples, immutable)."""
    return dataclasses.replace(sched, options=dict(sched.options))


def _search(ranks: int, microbatches: int, costs: CostModel | None,
            memory_limit: float | Sequence[float] | None, placement: str,
            mip_windows: bool, seconds: float, deadline: float | None = None) -> Schedule:
    """:func:`auto_schedule` itself, without the memory of earlier answers."""
    started = time.perf_counter()
    check_counts(ranks, microbatches)
    costs = costs or CostModel()
    if memory_limit is None:
        memory_limit = costs.memory_limit
    if placement not in PLACEMENTS:
        raise ScheduleError(f"unknown placement {placement!r}; valid are {', '.join(PLACEMENTS)}")
    limits = CostModel(memory_limit=memory_limit).rank_limits(ranks)
    p, m = ranks, microbatches
    kinds = ("loop", "v") if placement == "any" else (placement,)
    resolved: dict[str, tuple[StageCosts, tuple[int, ...]]] = {}
    errors, short = [], []
    for kind in kinds:
        chunks = _CHUNKS[kind]
        where = loop_placement(p, p) if kind == "loop" else v_placement(p)
        try:
            sc = costs.resolve(len(where), chunks)
        except ScheduleError as exc:
            errors.append(f"{kind}: {exc}")
            continue
        need = min_limits(sc, where)
        if limits is not None and any(not fits_limit(n, x)
                                      for x, n in zip(limits, need, strict=True)):
            short.append((kind, need))
            continue
        resolved[kind] = (sc, where)
    if not resolved:
        if short:
            raise LimitTooSmall(_too_small(memory_limit, limits, short))
        raise ScheduleError("auto: no placement accepts these costs (" + "; ".join(errors) + ")")

    best = None  # (key, orders, source, placement)
    by_kind: dict[str, list] = {}  # the few best of each placement
    named = {kind: bound(sc, where, m, limits) for kind, (sc, where) in resolved.items()}
    bounds = {kind: b.value for kind, b in named.items()}
    floor = min(bounds.values())
    clock = _Stages(started)
    budget = None  # the search's one ledger, made once the registered schedules are scored
    # Registered schedules first (a tie on step time goes to the least idle inside the
    # spans, so ZB-H2's and ZB-V's zero span bubble wins ties), then the greedy's first
    # knob setting, the adaptive V blocks, the other knob settings, V first (its bound is
    # lower), until one reaches the lower bound. (The first setting is the one most often
    # best; on big V instances a greedy pass costs about an adaptive block, and with the
    # whole grid first the blocks found no budget left: Table 8, p = 32, m = 256.)
    def _greedy_first(kind, p, m, sc, where, limits):
        yield from _greedy_charged(kind, p, m, sc, where, limits, slice(0, 1))

    def _greedy_rest(kind, p, m, sc, where, limits):
        yield from _greedy_charged(kind, p, m, sc, where, limits, slice(1, None))

    def _greedy_charged(kind, p, m, sc, where, limits, part):
        # charged per pass; with the ledger spent it still runs while nothing fits yet
        # (the one fallback: below the registered schedules' memory only it fits)
        for knobs in knob_grid(p, m, _CHUNKS[kind])[part]:
            work = GREEDY_WORK * 3 * len(where) * m
            if not budget.spend(work, "greedy"):
                if best is not None:
                    return
                budget.charge(work, "greedy")
            yield from _greedy(kind, p, m, sc, where, limits, [knobs])

    def _adaptive(kind, p, m, sc, where, limits):
        if kind != "v":
            return
        for source, orders in adaptive_orders(p, m, sc, limits, budget):
            if not budget.spend(score_cost(orders), "adaptive V"):
                return
            scored = _score(make_schedule("auto", orders, 2 * p, m, placement="v"), sc, limits)
            if scored is not None:
                yield scored[0], orders, source

    names = {_registered: "registered schedules", _greedy_first: "greedy",
             _adaptive: "adaptive V", _greedy_rest: "greedy (more knobs)"}
    for phase in names:
        if phase is not _registered and budget is None:
            budget = Budget(seconds, deadline)
        for kind in sorted(resolved, key=lambda k: bounds[k]):
            if best is not None and bounds[kind] > best[0][0] + _TOL:
                continue  # this placement cannot beat what we have
            sc, where = resolved[kind]
            for key, orders, source in phase(kind, p, m, sc, where, limits):
                tops = by_kind.setdefault(kind, [])
                if all(key != t[0] for t in tops):  # the few best, as the search's starts
                    tops.append((key, orders, source, kind))
                    tops.sort(key=lambda t: t[0])
                    del tops[SEARCH_STARTS:]
                if best is None or key < best[0]:
                    best = (key, orders, source, kind)
                if best[0][0] <= floor + _TOL and (phase is not _registered
                                                   or best[0][1] <= _TOL):
                    break
            if best is not None and best[0][0] <= floor + _TOL and (
                    phase is not _registered or best[0][1] <= _TOL):
                break
        clock.ran(names[phase], best, budget)
    if best is None:  # cannot happen above the smallest limit; kept as a clear error
        raise ScheduleError(f"auto found no order within memory limit {memory_limit}")
    searched = []  # (key, orders, source, placement) after the local search
    for kind, tops in sorted(by_kind.items()):
        sc, where = resolved[kind]
        size = 3 * len(where) * m
        if (tops[0][0][0] <= bounds[kind] + _TOL or size > IMPROVE_UP_TO
                or tops[0][0][0] > (1 + SEARCH_WITHIN) * best[0][0]):
            continue
        # Anneal from each of the few best orders of the placement (different knobs give
        # different shapes), then polish the best result with a hill climb.
        found = None
        for n, (_key, orders, source, _) in enumerate(tops):
            moves = _afford(budget, min(ANNEAL_BUDGET, ANNEAL_WORK // size) // len(tops), size)
            if not moves:
                break
            start = [[a for step in o for a in _actions(step)] for o in orders]
            better, got = anneal(start, sc, where, m, limits, seed=size * 1000 + n,
                                 budget=moves, **ANNEAL_SETTINGS[n % len(ANNEAL_SETTINGS)])
            if found is None or got < found[0]:
                found = (got, better, source)
        if found is None:
            continue
        better, _ = improve(found[1], sc, where, m, limits,
                            budget=_afford(budget, CLIMB_BUDGET, size))
        scored = _score(make_schedule("auto", better, len(where), m, placement=list(where)),
                        sc, limits)
        if scored is not None:
            searched.append((scored[0], better, found[2] + " + local search", kind))
            best = min(best, searched[-1], key=lambda t: t[0])
    if searched:
        clock.ran("local search", best, budget)
    # Then the MIP windows (exact.polish) on small instances, from the best searched order,
    # and from the other placement's only if it is within POLISH_WITHIN of it.
    for key, orders, source, kind in sorted(searched, key=lambda t: t[0]):
        sc, where = resolved[kind]
        if (not mip_windows or 3 * len(where) * m > POLISH_UP_TO
                or key[0] <= bounds[kind] + _TOL
                or key[0] > (1 + POLISH_WITHIN) * best[0][0]):
            continue
        polished = polish(orders, sc, where, m, limits, budget)
        if polished is None:
            continue
        scored = _score(make_schedule("auto", polished[0], len(where), m,
                                      placement=list(where)), sc, limits)
        if scored is not None and scored[0] < best[0]:
            best = (scored[0], polished[0], source + " + MIP windows", kind)
        clock.ran("MIP windows", best, budget)
    # Then the tail windows (lns.tail_windows) on orders too big for the two above.
    key, orders, source, kind = best
    sc, where = resolved[kind]
    if (mip_windows and 3 * len(where) * m > POLISH_UP_TO and seconds > 0
            and key[0] > bounds[kind] + _TOL
            and check_cap(budget, min(LNS_PER_RANK) * p, 3 * len(where) * m) is not None):
        # (without room for the smallest window the stage would only convert the order)
        flat = [[a for step in o for a in _actions(step)] for o in orders]
        got = tail_windows(flat, sc, where, m, limits, budget)
        if got is not None:
            scored = _score(make_schedule("auto", got[0], len(where), m,
                                          placement=list(where)), sc, limits)
            if scored is not None and scored[0] < best[0]:
                best = (scored[0], got[0], source + " + tail windows", kind)
        clock.ran("tail windows", best, budget)
    key, orders, source, kind = best
    sc, where = resolved[kind]
    steps = (Action, Overlap)  # a greedy tuple becomes an Action; a DualPipeV Overlap stays
    # (a packed order reads as its Actions and Overlaps already: kept as it is)
    cand = make_schedule("auto", [o if isinstance(o, PackedOrder) else
                                  [a if isinstance(a, steps) else Action(*a) for a in o]
                                  for o in orders], len(where), m, placement=list(where))
    timeline = _score(cand, sc, limits, timeline=True)[1]  # the simulator re-scores it
    lb = named[kind] if placement != "any" else min(named.values(), key=lambda b: b.value)
    info = Provenance(generator=source, placement=kind, chunks=_CHUNKS[kind],
                      step_time=timeline.step_time, lower_bound=lb,
                      seconds=time.perf_counter() - started, stages=tuple(clock.stages),
                      memory_limit=memory_limit, budget_seconds=seconds,
                      work=budget.spent if budget is not None else 0.0,
                      budget_hit=budget is not None and budget.hit)
    out = make_schedule("auto", cand.orders, cand.num_stages, m,
                        placement=list(cand.stage_to_rank), auto=info)
    validate_schedule(out)
    return out


def _afford(budget: Budget, evaluations: int, size: int) -> int:
    """Charge the local search's ``evaluations`` of an order of ``size`` actions, as many
    as the ledger has left (0: none)."""
    n = max(0, min(evaluations, int(budget.left // (EVAL_WORK * size))))
    if n and budget.late():
        n = 0
    budget.spend(n * EVAL_WORK * size, "local search")
    return n


def _actions(step) -> tuple[Action, ...]:
    """A step of a candidate order as Actions: a greedy tuple, an Action, or an Overlap's
    two (the local search runs them apart)."""
    if isinstance(step, Overlap):
        return step_actions(step)
    return (step if isinstance(step, Action) else Action(*step),)


def _too_small(memory_limit, limits: list[float], short: list) -> str:
    """One line naming the smallest feasible limit (the least over the placements tried)."""
    kind, need = min(short, key=lambda item: max(item[1]))
    if isinstance(memory_limit, int | float):
        return (f"--memory-limit {memory_limit:g} is below the smallest feasible limit "
                f"{max(need):g} ({kind} placement: one microbatch at a time)")
    bad = [r for r, (x, n) in enumerate(zip(limits, need, strict=True))
           if not fits_limit(n, x)]
    r = bad[0]
    return (f"--memory-limit {limits[r]:g} on rank {r} is below the smallest feasible limit "
            f"{need[r]:g} there ({kind} placement; per rank at least "
            f"{','.join(f'{n:g}' for n in need)})")


def _registered(kind: str, p: int, m: int, sc: StageCosts, where: tuple[int, ...],
                limits: list[float] | None):
    """(key, orders, source) of the registered schedules of this placement that fit, scored
    by the simulator, lazily. Below V-Min's memory, stretched building blocks too."""
    too_big: set[str] = set()
    for name in schedule_names():
        try:
            spec = lookup(name)
            if (spec.searched or spec.chunks != _CHUNKS[kind] or spec.chains != 1
                    or spec.placement != kind):  # the spec says, nothing generated
                continue
            sched = get_schedule(name, p, m)
        except ScheduleError:
            continue
        if sched.chains != 1 or sched.stage_to_rank != where:
            continue
        run = _registered_run(sched, sc)
        if not _within(run[1], limits):
            too_big.add(name)
            continue
        if len(run) == 2:  # simulated once, on the first limit it fits
            run = _registered_run(sched, sc, simulate=True)
        if run[2] is not None and _within(run[3], limits):
            yield run[2], sched.orders, name
    if kind == "v" and "v-min" in too_big and p % 3 == 2:
        # V-Min's published block holds less than v-min's when M_W < M_B and p mod 3 = 2
        from ..v_min import v_min_published

        sched = v_min_published(p, m)
        if _fits(sched, sc, limits):
            too_big.discard("v-min")
            scored = _score(sched, sc, limits)
            if scored is not None:
                yield scored[0], sched.orders, "v-min (published block)"
    if kind == "v" and "v-min" in too_big:
        yield from _stretched(p, m, sc, where, limits)


def _stretched(p: int, m: int, sc: StageCosts, where: tuple[int, ...], limits: list[float]):
    """When V-Min does not fit: V-Min's and V-Half's building blocks repeated every T > 6
    units (a microbatch every T, fewer in flight), at the smallest T whose order fits (and
    the next two), with their own offsets or the shortest turns that do not collide. The
    blocks depend on ``p`` and ``T`` only (:func:`_stretched_blocks`, kept), and whether a
    repeated block fits is counted from its times (:func:`_repeat_peaks`) before its order
    is made: only the orders that fit are built and scored."""
    from ..building_block import repeat

    for name, steps in _stretched_names(p):
        found = None
        for period in range(7, 6 * (2 * p + 2)):
            if found is not None and period > found + 2:
                break
            for times in _stretched_blocks(p, steps, period):
                if limits is not None and not all(
                        fits_limit(x, cap) for x, cap in
                        zip(_repeat_peaks(p, m, times, period, sc), limits, strict=True)):
                    continue
                found = period if found is None else found
                sched = make_schedule("auto", repeat(p, m, times, period, packed=True),
                                      2 * p, m, placement="v")
                scored = _score(sched, sc, limits)
                if scored is not None:
                    yield scored[0], sched.orders, f"{name} block every {period} units"


@functools.lru_cache(maxsize=64)
def _stretched_names(p: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, offsets) of the blocks :func:`_stretched` repeats: V-Min's and V-Half's."""
    from ..v_half import v_half_published_offsets
    from ..v_min import v_min_published_offsets

    return (("v-min", tuple(v_min_published_offsets(p))),
            ("v-half", tuple(v_half_published_offsets(p))))


@functools.lru_cache(maxsize=4096)
def _stretched_blocks(p: int, offsets: tuple[int, ...], period: int) -> tuple:
    """The blocks repeated every ``period`` units for these offsets: the shortest turns
    that collide with nothing (:func:`_turned_block`), then the offsets' own turns, each
    that exists (cost-free: kept for every request)."""
    from ..building_block import block

    blocks = [_turned_block(p, offsets[:4], period)]
    try:
        blocks.append(block(p, offsets, period))
    except ScheduleError:
        pass
    return tuple(b for b in blocks if b is not None)


def _repeat_peaks(p: int, m: int, times: tuple[list[int], ...], period: int,
                  sc: StageCosts) -> list[float]:
    """Each rank's activation peak of ``building_block.repeat(p, m, times, period)``
    without making its orders: every rank's passes sorted by time (no two of a rank share
    a time: the block collides with nothing modulo ``period``), each pass's start and end
    delta in that order, the highest running sum: what ``sim.program.schedule_peaks``
    sums for the repeated orders, in the same order (the same floats)."""
    import numpy as np

    S = 2 * p
    if m == 0:
        return [0.0] * p
    rows = [(s, kind) for r in range(p) for s in (r, S - 1 - r) for kind in range(3)]
    t0 = np.array([times[k][s] for s, k in rows], dtype=np.int64).reshape(p, 6, 1)
    starts = (t0 + np.arange(m, dtype=np.int64) * period).reshape(p, 6 * m)
    deltas = np.array([sc.memory_deltas(s, "FIW"[k]) for s, k in rows]).reshape(p, 6, 1, 2)
    deltas = np.broadcast_to(deltas, (p, 6, m, 2)).reshape(p, 6 * m, 2)
    order = np.argsort(starts, axis=1, kind="stable")
    ordered = np.take_along_axis(deltas, order[:, :, None], axis=1).reshape(p, 12 * m)
    peaks = np.cumsum(ordered, axis=1).max(axis=1)
    return [max(0.0, float(x)) for x in peaks]


def _greedy(kind: str, p: int, m: int, sc: StageCosts, where: tuple[int, ...],
            limits: list[float] | None, grid: list[Knobs] | None = None):
    """(key, orders, source) of the greedy orders over the knob grid (or ``grid``),
    scored by the simulator like every candidate (the greedy's own clock only steers its
    choices)."""
    for knobs in knob_grid(p, m, _CHUNKS[kind]) if grid is None else grid:
        got = greedy_order(p, m, sc, where, limits, knobs, packed=True)
        if got is None:
            continue
        orders = got[0]  # the actions as arrays (RankOrders: no Action made per step)
        scored = _score(make_schedule("auto", orders, len(where), m, placement=list(where)),
                        sc, limits)
        if scored is not None:
            name = "greedy " + ",".join(f"{k}={v}" for k, v in knobs._asdict().items())
            yield scored[0], orders, name


_TURNS = sorted(((tf, ti, top) for tf in range(1, 7) for ti in range(1, 7)
                 for top in range(1, 7)), key=sum)  # by their sum (stable: loop order kept)
_TURN_INDEX = {t: 36 * (t[0] - 1) + 6 * (t[1] - 1) + t[2] - 1 for t in _TURNS}


def _turned_block(p: int, steps: tuple[int, ...], period: int):
    """The building block with these offsets between stages and the shortest turns (of
    the V, and at its top) that collide with nothing modulo ``period``; None if none (of
    equal lengths the first turns in (turn_f, turn_i, top) order). Stage 0's input
    gradient comes ``(p - 1)(dF0 + dF1 + dI0 + dI1) + turn_f + turn_i + top`` units after
    its forward and its W at least one later, so turns are tried by their sum and the
    search stops once that floor is past the shortest block found."""
    from ..building_block import block

    base = (p - 1) * sum(steps[:4]) + 1
    best = None  # (length, loop index, times)
    for turns in _TURNS:
        if best is not None and base + sum(turns) > best[0]:
            break
        try:
            times = block(p, (*steps, *turns), period)
        except ScheduleError:
            continue
        got = (times[2][0] - times[0][0], _TURN_INDEX[turns])
        if best is None or got < best[:2]:
            best = (*got, times)
    return None if best is None else best[2]


KEEP_RUNS = 256  # registered schedules' peaks and scores kept (_registered_run), at most
_RUNS: OrderedDict[tuple, tuple] = OrderedDict()  # (id(schedule), costs) -> its run


def _registered_run(sched: Schedule, sc: StageCosts, simulate: bool = False) -> tuple:
    """``(sched, peaks)`` of a registered schedule on ``sc``: its order's peak memory per
    rank (:func:`~pipebubble.sim.program.schedule_peaks`), and with ``simulate`` also
    ``score, simulated peaks``: :func:`_score`'s ``(step, idle inside spans)`` and each
    rank's peak in the timeline (score None where the simulator refuses the order). They
    depend on the order and the costs alone, never on the limit, so they are kept: the
    planner asks auto for the same costs under a limit per sharding, and each request
    scores the same registered schedules. (An entry names the schedule by its id and a
    weak reference: it does not keep a schedule the registry's cache has let go.)"""
    from ...sim.program import schedule_peaks

    key = (id(sched), sc.key())
    got = _RUNS.get(key)
    if got is not None and got[0]() is sched:
        _RUNS.move_to_end(key)
        if len(got) == 4 or not simulate:
            return got
    else:
        got = (weakref.ref(sched), list(schedule_peaks(sched, sc)))
    if simulate:
        run = _scored(sched, sc)
        got = (got[0], got[1], *(run[:2] if run is not None else (None, None)))
    _RUNS[key] = got
    while len(_RUNS) > KEEP_RUNS:
        _RUNS.popitem(last=False)
    return got


def _within(peaks, limits: list[float] | None) -> bool:
    """Whether every rank's peak fits its limit (no limit: yes)."""
    return limits is None or all(fits_limit(x, cap) for x, cap in
                                 zip(peaks, limits, strict=True))


def _fits(sched: Schedule, sc: StageCosts, limits: list[float] | None) -> bool:
    """Peak memory depends on the order only: check it before timing anything."""
    from ...sim.program import schedule_peaks

    return limits is None or _within(schedule_peaks(sched, sc), limits)


def _scored(sched: Schedule, sc: StageCosts):
    """((step time, idle inside spans), each rank's peak memory, the timeline) of a
    simulation of ``sched`` on ``sc``; None where the simulator refuses the order."""
    from ...sim.kernel import simulate

    try:
        timeline = simulate(sched, sc)
    except ScheduleError:
        return None
    stats = timeline.rank_stats()
    score = (round(timeline.step_time, 9), round(sum(s.span - s.busy for s in stats), 9))
    return score, [s.peak_memory for s in stats], timeline


def _score(sched: Schedule, sc: StageCosts, limits: list[float] | None,
           timeline: bool = False):
    """(step time, idle inside spans) and, with ``timeline``, the timeline (else None);
    None if refused or over the limit. Without ``timeline`` an order of RankOrders
    scored before under the same costs is not simulated again (:func:`_scored_kept`)."""
    if not timeline:
        run = _scored_kept(sched, sc)
        if run is None or not _within(run[1], limits):
            return None
        return run[0], None
    run = _scored(sched, sc)
    if run is None or not _within(run[1], limits):
        return None
    return run[0], run[2]


KEEP_SCORES = 4096  # scores of orders kept (_scored_kept), at most
_SCORES: OrderedDict[tuple, tuple | None] = OrderedDict()  # order digest, costs -> score


def _scored_kept(sched: Schedule, sc: StageCosts) -> tuple | None:
    """:func:`_scored`'s ``(score, peaks)``, kept by what decides them: the placement, the
    counts, the costs and a digest of every rank's action arrays. The planner asks auto
    for the same costs under a limit per sharding, and the adaptive blocks of one cut and
    limit come back under another (other blocks, the same order): such a repeat is the
    stored score, the same floats, without the simulation. Orders that are not all
    RankOrders (the local search's lists) are simulated each time."""
    import hashlib

    from ...ir.orders import RankOrder

    digest = hashlib.blake2b(digest_size=20)
    for o in sched.orders:
        if type(o) is not RankOrder:
            run = _scored(sched, sc)
            return None if run is None else run[:2]
        digest.update(len(o.stage).to_bytes(8, "little"))
        for column in (o.stage, o.kind, o.microbatch):
            digest.update(column.dtype.str.encode())
            digest.update(column.tobytes())
        digest.update(b"-" if o.pair is None else o.pair.tobytes())
    key = (sched.num_stages, sched.num_microbatches, tuple(sched.stage_to_rank),
           tuple(sched.chain_starts), digest.digest(), _bits(sc.key()))
    if key in _SCORES:
        _SCORES.move_to_end(key)
        return _SCORES[key]
    run = _scored(sched, sc)
    got = None if run is None else run[:2]
    _SCORES[key] = got
    while len(_SCORES) > KEEP_SCORES:
        _SCORES.popitem(last=False)
    return got


# (a cold start, bench/bench_plan.py's, forgets them as it does every function's cache)
_scored_kept.cache_clear = _SCORES.clear  # type: ignore[attr-defined]
_scored_kept.cache_info = lambda: {"kept": len(_SCORES)}  # type: ignore[attr-defined]


def _bits(value):
    """A costs key with every float as its 8 bytes: equal exactly when the doubles are
    (``-0.0`` is not ``0.0``), as the kernel keys its kept simulations."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, tuple):
        return tuple(_bits(v) for v in value)
    return value


@dataclass(frozen=True)
class SearchStage:
    """One stage of the search that ran: its name, its time, how much it shortened the
    best step so far (0: it found nothing better), and the best step after it."""

    name: str
    seconds: float
    gain: float
    best: float
    work: float = 0.0  # work units it charged to the search's budget (:mod:`.budget`)


@dataclass(frozen=True)
class Provenance(Mapping):
    """Where auto's order comes from (``Schedule.options["auto"]``): the winning
    ``generator`` (a registered schedule, a greedy knob setting, ``+ local search``,
    ``+ MIP windows``), the search ``stages`` that ran, the placement, the step time, the
    provable :class:`~.bounds.LowerBound` and the ``gap`` to it. Reads as a mapping too:
    the JSON object of :meth:`as_dict` (``info["step_time"]``, ``info["from"]``)."""

    generator: str
    placement: str
    chunks: int
    step_time: float
    lower_bound: LowerBound
    seconds: float
    stages: tuple[SearchStage, ...] = ()
    memory_limit: float | Sequence[float] | None = None
    budget_seconds: float = 0.0  # the search's budget (``search_seconds``)
    work: float = 0.0  # work units the search charged to it, all stages together
    budget_hit: bool = False  # an asked-for deadline (search_deadline) stopped it

    @property
    def gap(self) -> float:
        """How far the step is above the lower bound, as a fraction of the bound."""
        b = self.lower_bound.value
        return self.step_time / b - 1.0 if b > 0 else 0.0

    def as_dict(self) -> dict:
        """The JSON object ``simulate --json`` prints under ``auto``."""
        return {
            "placement": self.placement, "chunks": self.chunks, "step_time": self.step_time,
            "lower_bound": self.lower_bound.value, "lower_bound_kind": self.lower_bound.kind,
            "lower_bounds": dict(self.lower_bound.by_kind), "gap": self.gap,
            "seconds": self.seconds, "from": self.generator,
            "stages": [{"name": x.name, "seconds": x.seconds, "gain": x.gain, "best": x.best,
                        "work": x.work} for x in self.stages],
            "budget": {"seconds": self.budget_seconds, "work": self.work,
                       "work_allowed": self.budget_seconds * WORK_PER_SECOND,
                       "safety_net_hit": self.budget_hit},
            "memory_limit": (list(self.memory_limit) if isinstance(self.memory_limit, Sequence)
                             else self.memory_limit),
        }

    def line(self) -> str:
        """The terminal report's line."""
        ran = ", ".join(f"{x.name} {x.seconds:.2f} s" + (f" (-{x.gain:.4g})" if x.gain else "")
                        for x in self.stages)
        return (f"auto: {self.placement} placement ({self.chunks} chunk(s) per rank), from "
                f"{self.generator}; searched in {self.seconds:.2f} s: {ran}; "
                f"{self.work / max(1.0, self.budget_seconds * WORK_PER_SECOND):.0%} of a "
                f"{self.budget_seconds:g} s budget of work"
                + (" (stopped by its --search-deadline)" if self.budget_hit else ""))

    def __getitem__(self, key: str):
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


class _Stages:
    """The clock of the search stages (see :class:`SearchStage`)."""

    def __init__(self, started: float):
        self.mark, self.stages, self.step, self.work = started, [], None, 0.0

    def ran(self, name: str, best, budget: Budget | None = None) -> None:
        now = time.perf_counter()
        step = best[0][0] if best is not None else float("inf")
        gain = 0.0 if self.step is None or step >= self.step else self.step - step
        spent = budget.spent if budget is not None else 0.0
        self.stages.append(SearchStage(name, now - self.mark, gain, step, spent - self.work))
        self.mark, self.step, self.work = now, step, spent


def _generate(ranks: int, microbatches: int, chunks: int | None = None,
              costs: CostModel | None = None, memory_limit=None, placement: str | None = None,
              mip_windows: bool = True, search_seconds: float | None = None,
              search_deadline: float | None = None) -> Schedule:
    """The registry's entry: ``chunks`` 1 is the loop placement, 2 the V one, None either."""
    if placement is None:
        placement = {None: "any", 1: "loop", 2: "v"}.get(chunks)
        if placement is None:
            raise ScheduleError(f"auto takes chunks 1 (loop placement) or 2 (V placement), "
                                f"got {chunks}")
    return auto_schedule(ranks, microbatches, costs, memory_limit, placement, mip_windows,
                         search_seconds, search_deadline)


# chunks: at most 2 (the V placement), what the size checks (limits.py) count; one chunk is
# the loop placement, two the V one, None lets the search pick (ScheduleSpec.placement_at)
register(ScheduleSpec(
    name="auto", generate=_generate, chunks=2, min_chunks=1, max_chunks=2, fixed_chunks=False,
    split_backward=True, placement=None, searched=True, needs_costs=True,
    needs_memory_limit=True, color="#555555", memory_sweep=1,
    summary="the fastest order found for these costs within the memory limit (a list "
            "scheduler, schedules/auto); v: 1 loop placement, 2 V, empty either"))
