"""``auto``: the fastest order found for measured costs under a memory limit.

:func:`auto_schedule` takes per-stage F, I, W, comm, M_B, M_W (a :class:`CostModel`) and an
activation-memory limit per rank, and returns the fastest order it finds that respects the
limit on every rank, in the loop placement (one stage per rank) or the V placement (two
chunks per rank, as ZB-V), whichever is faster. Candidates:

- every registered schedule of that placement (1F1B, ZB-H1, ZB-H2, GPipe; ZB-V, V-Half,
  V-Min, DualPipeV) whose simulated peak fits: so auto is never slower than any of them;
- the greedy list scheduler (:mod:`.greedy`) over a grid of its knobs, which fills the
  memory it is given (Zero Bubble's heuristic, both placements).

Every candidate is scored by the one simulator (:func:`pipebubble.sim.simulate`) with the
same costs; the fastest (then the one with least idle time inside the ranks' spans, then
the least memory) wins, is validated and returned as a Schedule named ``auto`` whose
``options["auto"]`` holds ``placement``, ``chunks``, ``lower_bound`` (:mod:`.bounds`:
provable), ``seconds`` (search time) and ``from`` (the winning candidate).

>>> from pipebubble.costs import CostModel
>>> s = auto_schedule(4, 8, CostModel(f=1, b=2, w=1), memory_limit=4, placement="loop")
>>> s.options["auto"]["step_time"], s.options["auto"]["lower_bound"]
(27.0, 27.0)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ...costs import CostModel, StageCosts
from ...ir.schedule import Schedule, ScheduleError, loop_placement, make_schedule, v_placement
from ...ir.schedule import validate as validate_schedule
from ..registry import check_counts, get_schedule, lookup, schedule_names
from .bounds import lower_bound, min_limits
from .greedy import Knobs, greedy_order

PLACEMENTS = ("any", "loop", "v")
_CHUNKS = {"loop": 1, "v": 2}
_TOL = 1e-9


def knob_grid(ranks: int, microbatches: int, chunks: int) -> list[Knobs]:
    """The knob settings tried; fewer for big instances (each costs one greedy pass)."""
    caps = ("memory", "1f1b", "h2")
    grid = [Knobs(cap, lazy, wait, deep) for cap in caps for lazy in (False, True)
            for wait in (False, True) for deep in ((True, False) if chunks > 1 else (True,))]
    size = ranks * microbatches * chunks
    if size > 2048:
        grid = [k for k in grid if not k.wait_i and (k.deep_first or k.cap == "memory")]
    return grid


def auto_schedule(
    ranks: int,
    microbatches: int,
    costs: CostModel | None = None,
    memory_limit: float | Sequence[float] | None = None,
    placement: str = "any",
) -> Schedule:
    """The fastest order found for ``costs`` within ``memory_limit`` (per rank, or one value
    for all; default ``costs.memory_limit``) in ``placement`` ``any``, ``loop`` or ``v``.

    Raises ScheduleError naming the smallest feasible limit when ``memory_limit`` is below it.
    """
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
        if limits is not None and any(x + 1e-9 < n for x, n in zip(limits, need, strict=True)):
            short.append((kind, need))
            continue
        resolved[kind] = (sc, where)
    if not resolved:
        if short:
            raise ScheduleError(_too_small(memory_limit, limits, short))
        raise ScheduleError("auto: no placement accepts these costs (" + "; ".join(errors) + ")")

    best = None  # (key, schedule, timeline, source)
    bounds = {}
    for kind, (sc, where) in resolved.items():
        bounds[kind] = lower_bound(sc, where, m)
        for cand, source, estimate in _candidates(kind, p, m, sc, where, limits):
            if best is not None and estimate is not None and estimate > best[0][0] + _TOL:
                continue  # the greedy timed it already: slower than the best, skip simulating
            scored = _score(cand, sc, costs, limits)
            if scored is None:
                continue
            key, timeline = scored
            if best is None or key < best[0]:
                best = (key, cand, timeline, source, kind)
    if best is None:  # cannot happen above the smallest limit; kept as a clear error
        raise ScheduleError(f"auto found no order within memory limit {memory_limit}")
    key, cand, timeline, source, kind = best
    info = {
        "placement": kind,
        "chunks": _CHUNKS[kind],
        "step_time": timeline.step_time,
        "lower_bound": bounds[kind] if placement != "any" else min(bounds.values()),
        "seconds": time.perf_counter() - started,
        "from": source,
        "memory_limit": memory_limit,
    }
    out = make_schedule("auto", cand.orders, cand.num_stages, m,
                        placement=list(cand.stage_to_rank), auto=info)
    validate_schedule(out)
    return out


def _too_small(memory_limit, limits: list[float], short: list) -> str:
    """One line naming the smallest feasible limit (the least over the placements tried)."""
    kind, need = min(short, key=lambda item: max(item[1]))
    if isinstance(memory_limit, int | float):
        return (f"--memory-limit {memory_limit:g} is below the smallest feasible limit "
                f"{max(need):g} ({kind} placement: one microbatch at a time)")
    bad = [r for r, (x, n) in enumerate(zip(limits, need, strict=True)) if x + 1e-9 < n]
    r = bad[0]
    return (f"--memory-limit {limits[r]:g} on rank {r} is below the smallest feasible limit "
            f"{need[r]:g} there ({kind} placement; per rank at least "
            f"{','.join(f'{n:g}' for n in need)})")


def _candidates(kind: str, p: int, m: int, sc: StageCosts, where: tuple[int, ...],
                limits: list[float] | None):
    """Registered schedules of this placement, then the greedy orders (lazily)."""
    for name in schedule_names():
        try:
            spec = lookup(name)
            if spec.chunks != _CHUNKS[kind]:
                continue
            sched = get_schedule(name, p, m)
        except ScheduleError:
            continue
        if sched.chains == 1 and sched.stage_to_rank == where:
            yield sched, name, None
    for knobs in knob_grid(p, m, _CHUNKS[kind]):
        got = greedy_order(p, m, sc, where, limits, knobs)
        if got is not None:
            sched = make_schedule("auto", got[0], len(where), m, placement=list(where))
            name = "greedy " + ",".join(f"{k}={v}" for k, v in knobs._asdict().items())
            yield sched, name, got[1]


def _score(sched: Schedule, sc: StageCosts, costs: CostModel, limits: list[float] | None):
    """(step time, idle inside spans, peak memory) and the timeline; None if over the limit."""
    from ...sim.kernel import simulate

    try:
        timeline = simulate(sched, sc)
    except ScheduleError:
        return None
    stats = timeline.rank_stats()
    peaks = [s.peak_memory for s in stats]
    if limits is not None and any(x > cap + 1e-9 for x, cap in zip(peaks, limits, strict=True)):
        return None
    step = round(timeline.step_time, 9)
    span_idle = round(sum(s.span - s.busy for s in stats), 9)
    return (step, span_idle, max(peaks)), timeline
