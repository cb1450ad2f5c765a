"""The registry of schedule families: name -> generator, with up-front checks.

A family's order depends only on (name, ranks, microbatches, chunks, options), and a
Schedule is immutable, so :func:`get_schedule` keeps the most recent ones it generated
(:data:`CACHE_ACTIONS` steps in all, least recently used dropped first) and hands the same
object out again: the planner asks for one pipeline under many tensor, context and data
parallel sizes, and ``auto`` starts from every registered family at its size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..costs import StageCosts
from ..ir.schedule import Schedule, ScheduleError

Generator = Callable[..., Schedule]
# (ranks, microbatches, chunks, per-stage costs) -> published bubble fraction, or None
ClosedForm = Callable[[int, int, int, StageCosts], float | None]


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule family.

    ``chunks`` is the default number of stages per rank; ``min_chunks``/``fixed_chunks``
    say what the family accepts. ``closed_form`` (optional) maps (ranks, microbatches,
    chunks, costs) to the published bubble fraction, or None where no formula applies
    (non-uniform costs, communication time, too few microbatches); ``microbatches`` is what
    the generator was given (``Schedule.total_microbatches``: for DualPipe, both directions).
    ``closed_form_basis`` says what that fraction is measured over: ``step`` (idle over
    ranks x step time, like ``Timeline.bubble_fraction``) or ``span`` (idle within the idlest
    rank's own span, first start to last end, as ZB-H2 and ZB-V are published: the paper
    drops the optimizer barrier between steps). ``formula`` is the closed form as text, for
    people (the explorer shows it beside the number). ``searched`` marks a generator that
    searches orders for given costs (``auto``): it takes ``costs=`` and ``memory_limit=``,
    ``chunks`` None lets it choose the placement, and it is no rival of itself.
    """

    name: str
    generate: Generator
    summary: str
    chunks: int = 1
    min_chunks: int = 1
    fixed_chunks: bool = True
    split_backward: bool = False
    aliases: tuple[str, ...] = ()
    closed_form: ClosedForm | None = None
    closed_form_basis: str = "step"
    formula: str = ""
    searched: bool = False  # a search over orders (``auto``): takes costs and memory_limit


SCHEDULES: dict[str, ScheduleSpec] = {}
_ALIASES: dict[str, str] = {}
CACHE_ACTIONS = 2_000_000  # steps; about 160 MB at most
_cache: OrderedDict[tuple, Schedule] = OrderedDict()
_cached_actions = 0


def register(spec: ScheduleSpec) -> ScheduleSpec:
    SCHEDULES[spec.name] = spec
    for key in (spec.name, *spec.aliases):
        _ALIASES[key.lower()] = spec.name
    return spec


def schedule_names(searched: bool = True) -> list[str]:
    """Every registered name; ``searched=False``: the families only (no ``auto``)."""
    return [n for n, spec in SCHEDULES.items() if searched or not spec.searched]


def valid_names() -> str:
    """The names a ``--schedule`` takes, for messages: the registered families and ``auto``
    (the automatic scheduler, ``schedules/auto``, searched rather than generated)."""
    names = schedule_names()
    return ", ".join(names if "auto" in names else [*names, "auto"])


def lookup(name: str) -> ScheduleSpec:
    key = _ALIASES.get(str(name).lower())
    if key is None:
        raise ScheduleError(f"unknown schedule {name!r}; valid are {valid_names()}")
    return SCHEDULES[key]


def get_schedule(
    name: str, ranks: int, microbatches: int, chunks: int | None = None, **options: object
) -> Schedule:
    """Generate schedule ``name`` for ``ranks`` ranks and ``microbatches`` microbatches.

    >>> get_schedule("GPipe", ranks=2, microbatches=2).to_text()
    '0F0 0F1 0B0 0B1\\n1F0 1F1 1B0 1B1'

    ``auto`` (a search: ``schedules/auto``) takes the costs and the limit as options,
    ``get_schedule("auto", 4, 8, costs=CostModel(...), memory_limit=4)``; chunks 1 or 2
    fix its placement (loop, V), None lets it pick.
    """
    spec = lookup(name)
    check_counts(ranks, microbatches)
    if spec.searched:
        return spec.generate(ranks, microbatches, chunks, **options)
    for key in ("costs", "memory_limit"):  # the same request for every name: a family's
        options.pop(key, None)  # order does not depend on them
    if chunks is None:
        chunks = spec.chunks
    if not isinstance(chunks, int) or chunks < 1:
        raise ScheduleError(f"chunks must be an integer >= 1, got {chunks!r}")
    if spec.fixed_chunks and chunks != spec.chunks:
        raise ScheduleError(
            f"{spec.name} uses exactly {spec.chunks} chunk(s) per rank, got {chunks}"
        )
    if chunks < spec.min_chunks:
        raise ScheduleError(f"{spec.name} needs chunks >= {spec.min_chunks}, got {chunks}")
    try:
        key = (spec.name, ranks, microbatches, chunks, tuple(sorted(options.items())))
        hash(key)
    except TypeError:  # an option that cannot be a key: generate, do not keep
        return spec.generate(ranks, microbatches, chunks, **options)
    got = _cache.get(key)
    if got is not None:
        _cache.move_to_end(key)
        return got
    sched = spec.generate(ranks, microbatches, chunks, **options)
    _keep(key, sched)
    return sched


def _keep(key: tuple, sched: Schedule) -> None:
    """Remember ``sched`` under ``key``, dropping the least recently used beyond
    :data:`CACHE_ACTIONS` steps (a schedule larger than that is not kept)."""
    global _cached_actions
    size = sum(len(o) for o in sched.orders)  # steps: what it holds
    if size > CACHE_ACTIONS:
        return
    _cache[key] = sched
    _cached_actions += size
    while _cached_actions > CACHE_ACTIONS:
        _, old = _cache.popitem(last=False)
        _cached_actions -= sum(len(o) for o in old.orders)


def check_counts(ranks: int, microbatches: int) -> None:
    if not isinstance(ranks, int) or ranks < 1:
        raise ScheduleError(f"ranks must be an integer >= 1, got {ranks!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ScheduleError(f"microbatches must be an integer >= 1, got {microbatches!r}")


def closed_form_bubble(name: str, ranks: int, microbatches: int, chunks: int,
                       costs: StageCosts) -> float | None:
    """The published bubble fraction for this schedule and costs, or None if none applies."""
    spec = lookup(name)
    if spec.closed_form is None:
        return None
    return spec.closed_form(ranks, microbatches, chunks, costs)
