"""What the planner enumerates about schedules: the families to try, the chunks each accepts,
whether the automatic scheduler is present, and how many microbatches a schedule keeps on
each stage at once (a bound on its activation memory that needs no simulation).
"""

from __future__ import annotations

from ..ir.schedule import Overlap, Schedule, ScheduleError
from ..schedules import get_schedule, lookup, schedule_names  # noqa: F401  (doctest)


def chunk_options(name: str, max_chunks: int) -> list[int]:
    """The chunks (stages per rank) a family accepts, up to ``max_chunks``
    (:meth:`~pipebubble.schedules.registry.ScheduleSpec.chunk_options`)."""
    return lookup(name).chunk_options(max_chunks)


def schedule_list(names: tuple[str, ...] | None) -> list[str]:
    """Every registered name (the families, then the searched ``auto``) or the given ones,
    checked and in their registered spelling."""
    if names is None:
        return schedule_names()
    return list(dict.fromkeys(lookup(n).name for n in names))


def placement_of(name: str) -> str | None:
    """The placement of a family's schedules (``Schedule.placement``: ``loop`` puts stage s
    on rank s mod p, ``v`` rank r on stages r and 2p - 1 - r), known before generating one:
    the spec's ``placement``; None for DualPipe (two chains), for ``auto`` (it picks) and for
    a name not registered. tests/test_plan_scale_bounds.py checks it against every
    registered family's generated schedules."""
    try:
        return lookup(name).placement
    except ScheduleError:
        return None


def held_per_stage(schedule: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
    """Most microbatches each stage holds activations for at once: from its F to the B, or
    to the W of a split backward (I frees only part): a bound on what the stage keeps. With
    ``until=("B", "I")``: from F to the first backward, when all of M_B is still held.

    >>> held_per_stage(get_schedule("1f1b", ranks=3, microbatches=6))
    [3, 2, 1]
    """
    return _held_both(schedule)[0 if until == ("B", "W") else 1] if until in (
        ("B", "W"), ("B", "I")) else _held(schedule, until)


def by_stage(schedule: Schedule):
    """The validated flat actions' (:func:`~pipebubble.ir.check.flat_actions`) stage, kind
    and microbatch columns, each stage's actions in its rank's order (a stable sort by
    stage)."""
    import numpy as np

    from ..ir.check import flat_actions

    flat = flat_actions(schedule)
    # (a stable sort of 16-bit keys is numpy's radix sort: the same order, twice as fast)
    keys = flat.stage.astype(np.int16) if schedule.num_stages < 2 ** 15 else flat.stage
    order = np.argsort(keys, kind="stable")
    return flat.stage[order], flat.kind[order], flat.microbatch[order]


def _held_both(schedule: Schedule) -> tuple[list[int], list[int]]:
    """:func:`held_per_stage` until B/W and until B/I, from the validated flat actions
    (:func:`~pipebubble.ir.check.flat_actions`, what the evaluation core's memory walk
    reads): each stage's actions in its rank's order (a stable sort by stage), +1 at each
    F and -1 at each B and W (or B and I); the highest running count (and 0) is how many
    microbatches the stage holds at once. It is the peak
    :func:`~pipebubble.sim.program.schedule_peaks` gives a rank when that stage alone
    has one unit of activation memory (and of ``M_W``, or none): every stage in one pass
    (tests/test_plan.py checks it against a walk over the orders)."""
    import numpy as np

    S = schedule.num_stages
    stage, kind, _ = by_stage(schedule)
    starts = np.searchsorted(stage, np.arange(S + 1))
    full = starts[1:] > starts[:-1]  # stages with actions
    out = []
    for freed in (2, 1):  # kind codes F 0, I 1, W 2, B 3: W (until W), I (until I)
        d = (kind == 0).astype(np.int64) - ((kind == 3) | (kind == freed))
        run = np.cumsum(d)
        held = [0] * S
        if full.any():
            lo = starts[:-1][full]
            top = np.maximum.reduceat(run, lo)
            before = np.where(lo > 0, run[np.maximum(lo - 1, 0)], 0)
            for s, x in zip(np.flatnonzero(full).tolist(), (top - before).tolist(),
                            strict=True):
                held[s] = max(0, x)
        out.append(held)
    return out[0], out[1]


def _held(schedule: Schedule, until: tuple[str, ...]) -> list[int]:
    """Any other ``until``: a walk over the orders (also the tests' reference)."""
    peak = [0] * schedule.num_stages
    cur = [0] * schedule.num_stages
    for order in schedule.orders:
        for step in order:
            for stage, kind, _ in (step if type(step) is Overlap else (step,)):
                if kind == "F":
                    cur[stage] += 1
                    peak[stage] = max(peak[stage], cur[stage])
                elif kind in until:
                    cur[stage] -= 1
    return peak


def _auto_function():
    try:
        from ..schedules.auto import auto_schedule  # written beside this planner
    except ImportError:
        return None
    return auto_schedule
