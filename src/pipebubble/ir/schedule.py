"""The schedule IR: actions, per-rank orders, placement, validation.

A schedule is data. Each rank gets an ordered list of *steps*; a step is either one
:class:`Action` (``2F5`` = stage 2, forward, microbatch 5) or an :class:`Overlap` of a
forward and a backward that a rank runs together (DualPipe's overlapped F&B pairs).

Kinds of compute:

- ``F``: forward of one stage on one microbatch.
- ``B``: full backward (``I`` + ``W`` fused).
- ``I``: backward w.r.t. the stage input, the part the previous stage waits for.
- ``W``: backward w.r.t. the stage weights, which zero-bubble schedules delay.

Tiny example, GPipe with 2 ranks and 2 microbatches::

    rank 0: 0F0 0F1 0B0 0B1
    rank 1: 1F0 1F1 1B0 1B1

The text form follows torch.distributed.pipelining (``_Action.__repr__``), so a schedule
written here reads there and back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from ..errors import UserError


class Kind(StrEnum):
    """What an action computes. A ``str`` subclass: ``Kind.F == "F"`` and ``str(Kind.F) == "F"``,
    so plain letters (from a file, from torch) and members compare and hash alike."""

    F = "F"  # forward
    I = "I"  # backward w.r.t. the stage input (the critical path)  # noqa: E741
    W = "W"  # backward w.r.t. the weights (may be delayed)
    B = "B"  # full backward, I and W fused


KINDS = tuple(Kind)
_ACTION_RE = re.compile(r"^\s*(\d+)([A-Za-z]+)(\d+)\s*$")


class ScheduleError(UserError):
    """A schedule, or the request for one, is invalid. The message names the bad value."""


class Action(NamedTuple):
    """One unit of compute: ``stage`` runs ``kind`` on ``microbatch``. Text form ``2F5``."""

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    __repr__ = __str__

    @staticmethod
    def from_str(text: str) -> Action:
        """Parse ``2F5`` back into ``Action(2, 'F', 5)``; the inverse of ``str``."""
        match = _ACTION_RE.match(text)
        if not match or match.group(2) not in KINDS:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected STAGE KIND MICROBATCH with KIND in "
                f"{'/'.join(KINDS)}, e.g. 2F5"
            )
        return Action(int(match.group(1)), Kind(match.group(2)), int(match.group(3)))


OVERLAP_TAG = "OVERLAP_F_B"  # what torch writes after an overlapped pair


class Overlap(NamedTuple):
    """A forward and a backward that one rank runs as one overlapped block (DualPipe's F&B).

    The block costs ``CostModel.overlap`` times the larger of its compute and its
    all-to-all (``StageCosts.pair_duration``; without all-to-all, the sum of its parts). Text form
    ``(0F7;7B3)``; torch's CSV cell adds ``OVERLAP_F_B`` (:func:`step_text` with
    ``tagged=True``). :func:`parse_step` reads both.
    """

    forward: Action
    backward: Action

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})"

    __repr__ = __str__


Step = Action | Overlap


def step_text(step: Step, tagged: bool = False) -> str:
    """``2F5``, ``(0F7;7B3)``, or with ``tagged`` torch's ``(0F7;7B3)OVERLAP_F_B``."""
    return f"{step}{OVERLAP_TAG}" if tagged and isinstance(step, Overlap) else str(step)


def parse_overlap(text: str, require_tag: bool = False) -> Overlap:
    """Parse ``(0F7;7B3)`` or ``(0F7;7B3)OVERLAP_F_B``: the one Overlap parser.

    Raises ScheduleError with the reason only (callers say where the text came from).

    >>> parse_overlap("(0F7;7B3)OVERLAP_F_B")
    (0F7;7B3)
    """
    inner, _, tag = text.strip()[1:].partition(")")
    tag = tag.strip()
    if tag != OVERLAP_TAG and (require_tag or tag):
        raise ScheduleError(f"overlapped actions must be tagged {OVERLAP_TAG}, got "
                            f"{tag or 'nothing'!r}")
    parts = [p.strip() for p in inner.split(";") if p.strip()]
    try:
        fwd, bwd = (Action.from_str(p) for p in parts)
    except (ScheduleError, ValueError):
        raise ScheduleError("expected two actions inside the brackets, e.g. "
                            f"(0F7;7B3){OVERLAP_TAG}") from None
    if fwd.kind != Kind.F or bwd.kind not in (Kind.B, Kind.I):
        raise ScheduleError("an overlapped pair is a forward then a backward (B or I), "
                            f"e.g. (0F7;7B3){OVERLAP_TAG}")
    return Overlap(fwd, bwd)


def parse_step(text: str) -> Step:
    """Parse ``2F5`` or ``(0F7;7B3)`` (optionally followed by ``OVERLAP_F_B``)."""
    text = text.strip()
    if text.startswith("("):
        try:
            return parse_overlap(text)
        except ScheduleError as exc:
            raise ScheduleError(f"cannot parse overlapped step {text!r}: {exc}") from None
    return Action.from_str(text)


class PackedOrder(Sequence):
    """Base of rank orders stored as arrays that read as a tuple of Actions
    (``ir/orders.py``: :class:`~pipebubble.ir.orders.RankOrder`, with ``stage``, ``kind``
    code and ``microbatch`` arrays). :func:`make_schedule` keeps them as they are."""

    __slots__ = ()

    def num_actions(self) -> int:
        """Actions in the order (an Overlap counts as its two)."""
        raise NotImplementedError


def step_actions(step: Step) -> tuple[Action, ...]:
    """The actions a step performs: one for an Action, two for an Overlap."""
    return (step.forward, step.backward) if isinstance(step, Overlap) else (step,)


def starts_chain(topo: Schedule, stage: int) -> bool:
    """True if ``stage`` takes the model input (first stage of its chain). ``topo``: anything
    with ``num_stages`` and ``chain_starts`` (a Schedule, a Timeline, an interpreter)."""
    return stage in topo.chain_starts


def ends_chain(topo: Schedule, stage: int) -> bool:
    """True if ``stage`` computes the loss (last stage of its chain)."""
    return stage == topo.num_stages - 1 or (stage + 1) in topo.chain_starts


def loop_placement(ranks: int, stages: int) -> tuple[int, ...]:
    """Megatron interleaving: stage ``s`` lives on rank ``s mod p``."""
    return tuple(s % ranks for s in range(stages))


def v_placement(ranks: int) -> tuple[int, ...]:
    """ZB-V / DualPipeV: rank ``r`` holds stages ``r`` and ``2p - 1 - r``."""
    return tuple(list(range(ranks)) + list(reversed(range(ranks))))


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered steps plus the stage → rank placement.

    ``orders[r]`` is what rank ``r`` runs, in order: a tuple of steps, or a
    :class:`~pipebubble.ir.orders.RankOrder` (compact arrays that read as that tuple).
    ``stage_to_rank[s]`` is the rank that holds stage ``s``. ``placement`` names the
    layout: ``loop``, ``v`` or ``custom``.

    Stages normally form one chain (stage s feeds stage s+1). ``chain_starts`` splits them
    into independent chains, e.g. ``(0, p)`` for DualPipe's two model copies: stage p then
    takes its own input instead of stage p-1's output, and stage p-1 computes a loss. Each
    chain runs ``num_microbatches`` microbatches of its own.
    """

    name: str
    orders: tuple[tuple[Step, ...], ...]
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    placement: str = "loop"
    options: dict = field(default_factory=dict, compare=False)
    chain_starts: tuple[int, ...] = (0,)

    @property
    def chains(self) -> int:
        """Independent stage chains: 1 for one model; 2 for DualPipe's two model copies."""
        return len(self.chain_starts)

    @property
    def total_microbatches(self) -> int:
        """Microbatches per step over all chains (each chain runs ``num_microbatches``)."""
        return self.num_microbatches * self.chains

    def first_stage(self, stage: int) -> bool:
        """True if ``stage`` takes the input (it starts a chain)."""
        return starts_chain(self, stage)

    def last_stage(self, stage: int) -> bool:
        """True if ``stage`` computes the loss (it ends a chain)."""
        return ends_chain(self, stage)

    @property
    def num_ranks(self) -> int:
        return len(self.orders)

    @property
    def chunks(self) -> int:
        """Stages per rank per chain (``v``): what one rank's share of one model copy is cut
        into. 1 for single-stage schedules and for DualPipe (one stage of each copy)."""
        return self.num_stages // max(1, self.num_ranks * len(self.chain_starts))

    def num_actions(self) -> int:
        return sum(o.num_actions() if isinstance(o, PackedOrder)
                   else sum(len(step_actions(s)) for s in o) for o in self.orders)

    def actions(self, rank: int) -> Iterator[Action]:
        for step in self.orders[rank]:
            yield from step_actions(step)

    def uses_split_backward(self) -> bool:
        return any(bool(((o.kind == 1) | (o.kind == 2)).any()) if isinstance(o, PackedOrder)
                   else any(a.kind in ("I", "W") for s in o for a in step_actions(s))
                   for o in self.orders)

    def to_text(self) -> str:
        """One line per rank, steps separated by spaces."""
        return "\n".join(" ".join(str(s) for s in order) for order in self.orders)


def make_schedule(
    name: str,
    orders: Sequence[Iterable[Step]],
    num_stages: int,
    num_microbatches: int,
    placement: str | Sequence[int] = "loop",
    chain_starts: Sequence[int] = (0,),
    **options: object,
) -> Schedule:
    """Build a Schedule; ``placement`` is ``loop``, ``v`` or an explicit stage→rank list;
    ``chain_starts`` lists the first stage of each independent chain (default one chain)."""
    starts = tuple(sorted(set(int(c) for c in chain_starts)))
    if not starts or starts[0] != 0 or starts[-1] >= max(1, num_stages):
        raise ScheduleError(
            f"chain_starts must start at 0 and lie in 0..{num_stages - 1}, "
            f"got {tuple(chain_starts)}"
        )
    ranks = len(orders)
    if isinstance(placement, str):
        if placement == "loop":
            stage_to_rank = loop_placement(ranks, num_stages)
        elif placement == "v":
            if num_stages != 2 * ranks:
                raise ScheduleError(
                    f"v placement needs 2 stages per rank ({2 * ranks}), got {num_stages}"
                )
            stage_to_rank = v_placement(ranks)
        else:
            raise ScheduleError(f"unknown placement {placement!r}: valid are loop, v, or a list")
        name_of_placement = placement
    else:
        stage_to_rank = tuple(int(r) for r in placement)
        name_of_placement = _name_placement(stage_to_rank, ranks)
    return Schedule(
        name=name,
        orders=tuple(o if isinstance(o, PackedOrder) else tuple(o) for o in orders),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stage_to_rank=stage_to_rank,
        placement=name_of_placement,
        options=dict(options),
        chain_starts=starts,
    )


def _name_placement(stage_to_rank: tuple[int, ...], ranks: int) -> str:
    if stage_to_rank == loop_placement(ranks, len(stage_to_rank)):
        return "loop"
    if len(stage_to_rank) == 2 * ranks and stage_to_rank == v_placement(ranks):
        return "v"
    return "custom"


def validate(schedule: Schedule) -> None:
    """Check a schedule is complete and consistent; raise ScheduleError naming rank and action.

    Rules: every stage lives on exactly one rank; every (stage, microbatch) runs F exactly
    once and either B once or I and W once each (never both forms); backward after forward,
    W after I, in the rank's own order when both are on that rank; microbatch indices in
    range; kinds known.

    The rules run vectorised over all actions at once (``ir/check.py``, the same pass the
    simulator compiles from, which ``pipebubble.ir`` plugs in here when it is imported); on
    a failure :func:`_scan` below names the first bad action.
    """
    if VECTORISED:
        VECTORISED[0](schedule)
    else:
        _scan(schedule)


# The vectorised validate(): ir/check.py appends its ``flat_actions`` here. (check.py
# imports this module, so this module cannot import it back.)
VECTORISED: list[Callable[[Schedule], object]] = []


def _scan(schedule: Schedule) -> None:
    """validate()'s rules one action at a time, in rank order: the readable statement of
    the rules, and what names the first bad action in the error message."""
    p, S, M = schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
    if len(schedule.stage_to_rank) != S:
        raise ScheduleError(f"placement lists {len(schedule.stage_to_rank)} stages, expected {S}")
    for s, r in enumerate(schedule.stage_to_rank):
        if not 0 <= r < p:
            raise ScheduleError(f"stage {s} placed on rank {r}; valid ranks are 0..{p - 1}")
    seen: dict[Action, int] = {}
    for rank in range(p):
        for a in schedule.actions(rank):
            where = f"rank {rank}, action {a}"
            if a.kind not in KINDS:
                raise ScheduleError(f"{where}: unknown kind {a.kind!r}; valid are F, I, W, B")
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{where}: stage {a.stage} out of range 0..{S - 1}")
            if not 0 <= a.microbatch < M:
                raise ScheduleError(f"{where}: microbatch {a.microbatch} out of range 0..{M - 1}")
            owner = schedule.stage_to_rank[a.stage]
            if owner != rank:
                raise ScheduleError(f"{where}: stage {a.stage} lives on rank {owner}")
            if a in seen:
                raise ScheduleError(f"{where}: duplicated")
            if a.kind in ("B", "I") and Action(a.stage, "F", a.microbatch) not in seen:
                raise ScheduleError(
                    f"{where}: backward before its forward {a.stage}F{a.microbatch}"
                )
            if a.kind == "W" and Action(a.stage, "I", a.microbatch) not in seen:
                raise ScheduleError(f"{where}: W without its I {a.stage}I{a.microbatch} before it")
            if a.kind == "B" and Action(a.stage, "I", a.microbatch) in seen:
                raise ScheduleError(f"{where}: both B and I for stage {a.stage} mb {a.microbatch}")
            if a.kind == "I" and Action(a.stage, "B", a.microbatch) in seen:
                raise ScheduleError(f"{where}: both I and B for stage {a.stage} mb {a.microbatch}")
            seen[a] = rank
    for s in range(S):
        rank = schedule.stage_to_rank[s]
        for m in range(M):
            if Action(s, "F", m) not in seen:
                raise ScheduleError(f"rank {rank}: missing action {s}F{m}")
            has_b = Action(s, "B", m) in seen
            has_i = Action(s, "I", m) in seen
            has_w = Action(s, "W", m) in seen
            if not (has_b or has_i):
                raise ScheduleError(f"rank {rank}: missing backward {s}B{m} (or {s}I{m}+{s}W{m})")
            if has_i and not has_w:
                raise ScheduleError(f"rank {rank}: missing action {s}W{m} after {s}I{m}")
            if has_b and has_w:
                raise ScheduleError(f"rank {rank}: both B and W for stage {s} mb {m}")

