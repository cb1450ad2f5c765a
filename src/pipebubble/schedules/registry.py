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


PLACEMENTS = ("loop", "v")
"""The placements a spec can name (``Schedule.placement``): ``loop`` puts stage s on rank
s mod p, ``v`` puts stages r and 2p - 1 - r on rank r."""


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule family: every fact the rest of the package needs about it.

    The planner, the commands, the explorer and the figures ask the spec, never the name,
    so a new family is one module that calls :func:`register` (docs/new_family.md).

    Chunks. ``chunks`` is the default number of stages per rank; ``min_chunks``,
    ``max_chunks`` (None: no bound but the size limits) and ``fixed_chunks`` say what the
    family accepts (:meth:`chunk_options`).

    Shape, known before generating. ``placement`` is where its stages go (one of
    :data:`PLACEMENTS`, or None when neither: DualPipe's two chains, or a search that picks
    per request, :meth:`placement_at`); ``chains`` is the number of independent stage chains
    (``Schedule.chains``: DualPipe runs two model copies). ``split_backward``: its orders may
    split a backward into I (input gradient) and W (weight gradient); ``split_only``: every
    backward is split, at every size (then no order of it has a fused B).
    tests/test_registry_facts.py checks these against generated schedules.

    Frameworks. ``torch_class`` is the ``torch.distributed.pipelining`` class that runs the
    same family (``ScheduleInterleaved1F1B``), None where torch has none (an order still runs
    there from its CSV when it has one chain); :attr:`torchtitan` is the name torchtitan's
    ``pipeline_parallel_schedule`` takes for it. ``megatron`` is Megatron-LM's name for the
    family where Megatron pipelines it (``1F1B``, ``interleaved 1F1B``), else None.
    ``deepspeed`` is the class of DeepSpeed's pipeline engine that runs it
    (``TrainSchedule``, ``deepspeed/runtime/pipe/schedule.py``: 1F1B, one stage a rank), else
    None.

    Searched orders. ``searched`` marks a generator that searches orders for given costs
    (``auto``): ``needs_costs`` and ``needs_memory_limit`` say it takes ``costs=`` and
    ``memory_limit=`` (a family's order depends on neither, and :meth:`build` drops them),
    ``chunks`` None lets it choose the placement, and it is no rival of itself.

    Closed forms. ``closed_form`` (optional) maps (ranks, microbatches, chunks, costs) to
    the published bubble fraction, or None where no formula applies (non-uniform costs,
    communication time, too few microbatches); ``microbatches`` is what the generator was
    given (``Schedule.total_microbatches``: for DualPipe, both directions).
    ``closed_form_basis`` says what that fraction is measured over: ``step`` (idle over
    ranks x step time, like ``Timeline.bubble_fraction``) or ``span`` (idle within the idlest
    rank's own span, first start to last end, as ZB-H2 and ZB-V are published: the paper
    drops the optimizer barrier between steps). ``formula`` is the closed form as text, for
    people (the explorer shows it beside the number).

    Figures. ``color`` is the family's colour in every figure and in the explorer (empty:
    one of the spare colours, by name); ``memory_sweep`` is its place among the schedules
    ``sweep --memory-limit`` compares by default (lowest first; None: not among them).
    """

    name: str
    generate: Generator
    summary: str
    chunks: int = 1
    min_chunks: int = 1
    fixed_chunks: bool = True
    max_chunks: int | None = None
    split_backward: bool = False
    split_only: bool = False
    aliases: tuple[str, ...] = ()
    closed_form: ClosedForm | None = None
    closed_form_basis: str = "step"
    formula: str = ""
    placement: str | None = "loop"
    chains: int = 1
    torch_class: str | None = None
    megatron: str | None = None
    deepspeed: str | None = None
    searched: bool = False  # a search over orders (``auto``): takes costs and memory_limit
    needs_costs: bool = False
    needs_memory_limit: bool = False
    color: str = ""
    memory_sweep: int | None = None

    @property
    def torchtitan(self) -> str | None:
        """torchtitan's ``pipeline_parallel_schedule`` value: the torch class without its
        ``Schedule`` prefix (``Interleaved1F1B``), None where torch has no class."""
        if self.torch_class is None:
            return None
        return self.torch_class.removeprefix("Schedule")

    def placement_at(self, chunks: int) -> str | None:
        """The placement of this family's schedules at ``chunks`` stages per rank: its
        ``placement``; for a search that picks (``placement`` None, ``searched``), one chunk
        is the loop placement and two the V one."""
        if self.placement is None and self.searched:
            return {1: "loop", 2: "v"}.get(chunks)
        return self.placement

    def chunk_options(self, max_chunks: int) -> list[int]:
        """The chunks (stages per rank) the family accepts, up to ``max_chunks``."""
        if self.fixed_chunks:
            return [self.chunks] if self.chunks <= max(max_chunks, 1) or self.chunks == 1 \
                else []
        top = max_chunks if self.max_chunks is None else min(max_chunks, self.max_chunks)
        return list(range(self.min_chunks, top + 1))

    def build(self, ranks: int, microbatches: int, chunks: int | None = None,
              **options: object) -> Schedule:
        """Check the request against the spec and generate the schedule (uncached: use
        :func:`get_schedule`). ``costs=`` and ``memory_limit=`` reach only a generator that
        needs them."""
        check_counts(ranks, microbatches)
        if not self.needs_costs:
            options.pop("costs", None)
        if not self.needs_memory_limit:
            options.pop("memory_limit", None)
        if self.searched:
            return self.generate(ranks, microbatches, chunks, **options)
        return self.generate(ranks, microbatches, self.check_chunks(chunks), **options)

    def check_chunks(self, chunks: int | None) -> int:
        """``chunks`` (None: the default) if the family accepts it, else a ScheduleError."""
        if chunks is None:
            chunks = self.chunks
        if not isinstance(chunks, int) or chunks < 1:
            raise ScheduleError(f"chunks must be an integer >= 1, got {chunks!r}")
        if self.fixed_chunks and chunks != self.chunks:
            raise ScheduleError(
                f"{self.name} uses exactly {self.chunks} chunk(s) per rank, got {chunks}"
            )
        if chunks < self.min_chunks:
            raise ScheduleError(f"{self.name} needs chunks >= {self.min_chunks}, got {chunks}")
        if self.max_chunks is not None and chunks > self.max_chunks:
            raise ScheduleError(f"{self.name} takes chunks <= {self.max_chunks}, got {chunks}")
        return chunks


FIRST = "gpipe"
"""The simplest family (all forwards, then all backwards): what the commands that show one
schedule draw when none is named."""
STANDARD = "1f1b"
"""The family every framework runs (torch's and Megatron-LM's default): what a cut is
balanced for when no schedule is named, and the one the planner tries at pp = 1."""
SEARCH_INFO = "auto"
"""The ``Schedule.options`` key under which a searched order keeps its provenance (the
placement, the lower bound and the gap: ``schedules.auto.Provenance``)."""

SCHEDULES: dict[str, ScheduleSpec] = {}
_ALIASES: dict[str, str] = {}
CACHE_ACTIONS = 2_000_000  # steps; about 160 MB at most
_cache: OrderedDict[tuple, Schedule] = OrderedDict()
_cached_actions = 0


def register(spec: ScheduleSpec) -> ScheduleSpec:
    """Make ``spec`` known by its name and aliases (case-insensitive); returns it. A name
    or alias another spec already has is refused (one line naming both)."""
    for key in (spec.name, *spec.aliases):
        have = _ALIASES.get(key.lower())
        if have is not None and have != spec.name:
            raise ScheduleError(f"schedule name {key!r} is already {have!r}'s")
    if spec.placement is not None and spec.placement not in PLACEMENTS:
        raise ScheduleError(f"{spec.name}: placement {spec.placement!r}; valid are "
                            f"{', '.join(PLACEMENTS)} or None")
    SCHEDULES[spec.name] = spec
    for key in (spec.name, *spec.aliases):
        _ALIASES[key.lower()] = spec.name
    return spec


def unregister(name: str) -> ScheduleSpec:
    """Remove a registered spec (and its aliases and kept schedules); returns it. For a
    family registered for a while (a test, a notebook): the built-in ones stay."""
    global _cached_actions
    spec = lookup(name)
    del SCHEDULES[spec.name]
    for key in [k for k, v in _ALIASES.items() if v == spec.name]:
        del _ALIASES[key]
    for key in [k for k in _cache if k[0] == spec.name]:
        _cached_actions -= sum(len(o) for o in _cache.pop(key).orders)
    return spec


def schedule_names(searched: bool = True) -> list[str]:
    """Every registered name, the families in the order they registered, then the searched
    ones (``auto``); ``searched=False``: the families only."""
    names = [n for n, spec in SCHEDULES.items() if not spec.searched]
    return names + ([n for n, spec in SCHEDULES.items() if spec.searched] if searched else [])


def search_info(schedule: Schedule):
    """The provenance a searched order carries (``schedules.auto.Provenance``: placement,
    lower bound, gap), or None for a generated family's schedule."""
    return schedule.options.get(SEARCH_INFO)


def valid_names() -> str:
    """The names a ``--schedule`` takes, for messages: every registered spec, the
    searched ones (``auto``) among them."""
    return ", ".join(schedule_names())


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
    if spec.searched:  # a search: its order depends on costs and limit, not kept here
        return spec.build(ranks, microbatches, chunks, **options)
    check_counts(ranks, microbatches)
    for key in ("costs", "memory_limit"):  # the same request for every name: a family's
        options.pop(key, None)  # order does not depend on them
    chunks = spec.check_chunks(chunks)
    try:
        key = (spec.name, ranks, microbatches, chunks, tuple(sorted(options.items())))
        hash(key)
    except TypeError:  # an option that cannot be a key: generate, do not keep
        return spec.build(ranks, microbatches, chunks, **options)
    got = _cache.get(key)
    if got is not None:
        _cache.move_to_end(key)
        return got
    sched = spec.build(ranks, microbatches, chunks, **options)
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
