"""What the planner enumerates about schedules: the families to try, the chunks each accepts,
whether the automatic scheduler is present, and how many microbatches a schedule keeps on
each stage at once (a bound on its activation memory that needs no simulation).
"""

from __future__ import annotations

from ..errors import UserError
from ..ir.schedule import Overlap, Schedule
from ..schedules import get_schedule, lookup, schedule_names  # noqa: F401  (doctest)
from .plans import AUTO


def chunk_options(name: str, max_chunks: int) -> list[int]:
    """The chunks (stages per rank) a family accepts, up to ``max_chunks``."""
    if name == AUTO:
        return [1, 2] if max_chunks >= 2 else [1]
    spec = lookup(name)
    if spec.fixed_chunks:
        return [spec.chunks] if spec.chunks <= max(max_chunks, 1) or spec.chunks == 1 else []
    return list(range(spec.min_chunks, max_chunks + 1))


def schedule_list(names: tuple[str, ...] | None) -> list[str]:
    """Registered names (``auto`` when importable) or the given ones, checked."""
    have_auto = AUTO in schedule_names() or _auto_function() is not None
    if names is None:
        out = [n for n in schedule_names() if n != AUTO]
        return out + ([AUTO] if have_auto else [])
    out = []
    for n in names:
        if n.lower() == AUTO:
            if not have_auto:
                raise UserError("--schedules auto: the automatic scheduler is not available "
                                 f"in this version; valid are {', '.join(schedule_names())}")
            out.append(AUTO)
        else:
            out.append(lookup(n).name)
    return list(dict.fromkeys(out))


def held_per_stage(schedule: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
    """Most microbatches each stage holds activations for at once: from its F to the B, or
    to the W of a split backward (I frees only part): a bound on what the stage keeps. With
    ``until=("B", "I")``: from F to the first backward, when all of M_B is still held.

    >>> held_per_stage(get_schedule("1f1b", ranks=3, microbatches=6))
    [3, 2, 1]
    """
    return _held_both(schedule)[0 if until == ("B", "W") else 1] if until in (
        ("B", "W"), ("B", "I")) else _held(schedule, until)


def _held_both(schedule: Schedule) -> tuple[list[int], list[int]]:
    """:func:`held_per_stage` until B/W and until B/I, in one pass over the schedule."""
    S = schedule.num_stages
    peak_w, cur_w, peak_i, cur_i = [0] * S, [0] * S, [0] * S, [0] * S
    for order in schedule.orders:
        for step in order:
            for stage, kind, _ in (step if type(step) is Overlap else (step,)):
                if kind == "F":
                    cur_w[stage] += 1
                    cur_i[stage] += 1
                    if cur_w[stage] > peak_w[stage]:
                        peak_w[stage] = cur_w[stage]
                    if cur_i[stage] > peak_i[stage]:
                        peak_i[stage] = cur_i[stage]
                elif kind == "B":
                    cur_w[stage] -= 1
                    cur_i[stage] -= 1
                elif kind == "W":
                    cur_w[stage] -= 1
                else:
                    cur_i[stage] -= 1
    return peak_w, peak_i


def _held(schedule: Schedule, until: tuple[str, ...]) -> list[int]:
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
