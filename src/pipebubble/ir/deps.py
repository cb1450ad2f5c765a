"""THE dependency rule: which actions an action waits for, and where its output goes.

Every consumer of a schedule asks this module, so the rule is written once: the simulator,
its deadlock messages, the interpreter's readiness checks and message hand-overs
(``runtime/interpreter.py``), the wire lowering and the wire simulator (``sim/wire.py``: which
edges need a SEND/RECV, each message's name by :func:`message`, when a compute step may
start), the measured-run report's message delays (``runtime/dist/report.py``), the CSV
deadlock messages (``interop/torch_csv.py``) and the Perfetto trace's flow arrows
(``render/trace.py``); and every search, through :func:`precedences` (the MIP's edges, the
bounds' paths, the local search's problem, the step-by-step clock of ``sim/clock.py`` whose
edges the greedy's wake-ups and tails read, the planner's fill and drain in
``plan/cut_price.py``) or the compiled program of ``sim/program.py`` built on it.

An action waits for *signals*. A signal is a fact one action produces:

- ``Signal(s, "F", m)``: the forward of stage ``s`` on microbatch ``m`` is done (its output
  activation exists);
- ``Signal(s, "I", m)``: the input gradient of stage ``s`` for ``m`` exists (produced by
  ``I`` or by the fused ``B``, whichever the schedule runs);
- ``Signal(s, "W", m)``: the weight gradient of stage ``s`` for ``m`` is done (nobody waits
  for it; it frees memory).

The rule, with chains (``Schedule.chain_starts``: DualPipe's two model copies are two chains;
the first stage of a chain takes the input, the last one computes the loss):

- ``F(s, m)`` needs ``F(s-1, m)``, unless ``s`` starts a chain;
- ``I(s, m)`` and ``B(s, m)`` need ``F(s, m)`` and, unless ``s`` ends a chain, ``I/B(s+1, m)``;
- ``W(s, m)`` needs ``I(s, m)``.

An edge *crosses* when producer and consumer stages live on different ranks: data travels
over the wire (a send and a receive, ``comm`` time in the simulator). An Overlap pair
(DualPipe's F&B) needs what both of its parts need, and its outputs (the forward part's
activation, the backward part's gradient) are all ready when the pair ends: real DualPipe
runs the two parts at once on overlapped streams, so neither output exists before the
block ends. The simulator (``sim/kernel.py``, ``sim/reference.py``), the wire program
(``sim/wire.py``: the pair's sends come after it) and the runtimes (the interpreter hands
a pair's outputs over at its end) all follow this.

>>> from pipebubble.schedules import get_schedule
>>> s = get_schedule("1f1b", ranks=2, microbatches=2)
>>> [str(d) for d in producers(Action(0, "B", 1), s)]
['0F1', '1I1 (crosses)']
>>> [str(h) for h in handovers(Action(0, "F", 1), s)]
['stage 1 (crosses)']
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import NamedTuple, Protocol

from .schedule import Action, Kind, Overlap, Step, ends_chain, starts_chain


class Topology(Protocol):
    """What the rule needs to know of a schedule (a Schedule or a Timeline provides it)."""

    num_stages: int
    stage_to_rank: tuple[int, ...]
    chain_starts: tuple[int, ...]


class Layout(NamedTuple):
    """A :class:`Topology` of its own (a search's or the simulator's, without a Schedule):
    hashable, so a rule built from it can be cached.

    >>> Layout(2, (0, 1), (0,)).stage_to_rank
    (0, 1)
    """

    num_stages: int
    stage_to_rank: tuple[int, ...]
    chain_starts: tuple[int, ...] = (0,)


class Signal(NamedTuple):
    """A fact an action produces: ``F`` output ready, ``I`` input gradient ready, ``W`` done."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


class Dep(NamedTuple):
    """One edge of the rule: ``signal`` and whether it crosses ranks (needs the wire)."""

    signal: Signal
    crosses: bool

    def __str__(self) -> str:
        return f"{self.signal}" + (" (crosses)" if self.crosses else "")


def produces(action: Action) -> Signal:
    """The signal ``action`` produces when it ends (B produces the input gradient, like I)."""
    s, k, m = action
    return Signal(s, "I" if k in (Kind.B, Kind.I) else k, m)


def needs(action: Action, topo: Topology) -> tuple[Signal, ...]:
    """The signals ``action`` waits for, in a fixed order (local first, then the neighbour)."""
    s, k, m = action
    if k == Kind.F:
        return () if starts_chain(topo, s) else (Signal(s - 1, "F", m),)
    if k in (Kind.B, Kind.I):
        own = Signal(s, "F", m)
        return (own,) if ends_chain(topo, s) else (own, Signal(s + 1, "I", m))
    if k == Kind.W:
        return (Signal(s, "I", m),)
    raise ValueError(f"unknown kind {k!r}; valid are F, I, W, B")


def producers(step: Step, topo: Topology) -> tuple[Dep, ...]:
    """What ``step`` waits for, each with whether it crosses ranks. An Overlap waits for
    what both its parts wait for, except what its own forward part produces."""
    if isinstance(step, Overlap):
        inside = {produces(step.forward)}
        return tuple(d for a in step for d in producers(a, topo) if d.signal not in inside)
    here = topo.stage_to_rank[step.stage]
    return tuple(Dep(sig, topo.stage_to_rank[sig.stage] != here) for sig in needs(step, topo))


class Precedence(NamedTuple):
    """One edge of a set of actions: ``after`` may start only once ``before`` has ended
    (plus ``comm`` when ``crosses``). ``before`` is the action at whose end the signal is
    ready (a pair's backward part for its forward output: a pair's outputs are ready at
    its end), ``after`` the first action of the step that waits for it (a pair's forward
    part: a pair starts when both its parts may)."""

    before: Action
    after: Action
    crosses: bool


def precedences(steps: Iterable[Step], topo: Topology) -> list[Precedence]:
    """Every edge of the rule among ``steps`` (Actions and Overlap pairs, e.g. a schedule's
    ``step for order in schedule.orders for step in order``, or a search's whole set of F,
    I and W actions): the neighbour-stage edges (which cross when the stages sit on two
    ranks) and the same-stage ones (F before its I or B, I before its W). A signal that no
    step among them produces gives no edge (nothing to wait for inside the set).

    >>> from pipebubble.schedules import get_schedule
    >>> s = get_schedule("1f1b", ranks=2, microbatches=1)
    >>> [f"{e.before}->{e.after}" + ("*" if e.crosses else "")
    ...  for e in precedences((a for o in s.orders for a in o), s)]
    ['0F0->0B0', '1B0->0B0*', '0F0->1F0*', '1F0->1B0']
    """
    steps = list(steps)
    ready: dict[Signal, Action] = {}  # signal -> the action at whose end it is ready
    for step in steps:
        if isinstance(step, Overlap):
            for a in step:
                ready[produces(a)] = step.backward
        else:
            ready[produces(step)] = step
    where = topo.stage_to_rank
    out = []
    for step in steps:
        first = step.forward if isinstance(step, Overlap) else step
        for a in (step if isinstance(step, Overlap) else (step,)):
            for sig in needs(a, topo):
                src = ready.get(sig)
                if src is None or (isinstance(step, Overlap) and src == step.backward):
                    continue  # not in the set, or made inside the pair itself
                out.append(Precedence(src, first, where[sig.stage] != where[a.stage]))
    return out


def carried(kind: str, stage: int, microbatch: int, topo: Topology) -> Signal:
    """The signal a message into ``stage`` brings (the inverse of :func:`message`):
    ``kind`` ``act`` (an activation: from the stage before, in the chain) or ``grad``
    (an input gradient: from the stage after).

    >>> from pipebubble.schedules import get_schedule
    >>> s = get_schedule("1f1b", ranks=3, microbatches=1)
    >>> str(carried("act", 1, 0, s)), str(carried("grad", 1, 0, s))
    ('0F0', '2I0')
    """
    wants = Action(stage, Kind.F if kind == "act" else Kind.I, microbatch)
    for sig in needs(wants, topo):
        if sig.stage != stage:
            return sig
    raise ValueError(f"stage {stage} takes no {kind} message (its chain's end)")


class Timed(Protocol):
    """What :func:`signal_sources` reads of a timeline event (``timeline.Event`` has it)."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    overlapped: bool


def signal_sources(events: Sequence[Timed]) -> dict[Signal, int]:
    """For each signal, the index of the event at whose end it is ready, in a timeline's
    events (each rank's in its order, as ``Timeline.events()`` gives them): the event of
    the action that produces it, except that a pair's forward output is ready when the
    pair ends, at the end of its backward part (the next event of that rank)."""
    out: dict[Signal, int] = {}
    for i, e in enumerate(events):
        at = i
        if e.overlapped and e.kind == Kind.F and i + 1 < len(events):
            part = events[i + 1]
            if part.rank == e.rank and part.overlapped:  # the pair's backward part
                at = i + 1
        out[produces(Action(e.stage, e.kind, e.microbatch))] = at
    return out


class Handover(NamedTuple):
    """Where an action's output goes to another stage: ``to_stage``, and whether it crosses."""

    to_stage: int
    crosses: bool

    def __str__(self) -> str:
        return f"stage {self.to_stage}" + (" (crosses)" if self.crosses else "")


def handovers(action: Action, topo: Topology) -> tuple[Handover, ...]:
    """The other stages that wait for ``action``'s output: ``F(s)`` hands its activation to
    stage ``s+1``, ``I``/``B(s)`` its input gradient to stage ``s-1`` (within the chain).
    The inverse of the cross-stage part of :func:`needs`; a crossing one is a send."""
    s, k, _ = action
    here = topo.stage_to_rank[s]
    if k == Kind.F and not ends_chain(topo, s):
        return (Handover(s + 1, topo.stage_to_rank[s + 1] != here),)
    if k in (Kind.B, Kind.I) and not starts_chain(topo, s):
        return (Handover(s - 1, topo.stage_to_rank[s - 1] != here),)
    return ()


def message(signal: Signal, consumer: int) -> tuple[str, int, int] | None:
    """How ``signal`` reaches stage ``consumer``: a message ``("act" | "grad", consumer,
    microbatch)`` when it comes from another stage (the transports' and the wire's name for
    it, on the same rank or not), ``None`` when it stays on the stage (F's saved graph for
    its own I/B, I's kept tensors for its W).

    >>> message(Signal(1, "F", 3), 2), message(Signal(3, "I", 3), 2), message(Signal(2, "F", 3), 2)
    (('act', 2, 3), ('grad', 2, 3), None)
    """
    if signal.stage == consumer:
        return None
    return ("act" if signal.kind == Kind.F else "grad", consumer, signal.microbatch)


def signal_text(signal: Signal, consumer: Kind | str) -> str:
    """``2I/B3`` for an input gradient an I or B waits for (either kind produces it)."""
    if signal.kind == "I" and consumer != Kind.W:
        return f"{signal.stage}I/B{signal.microbatch}"
    return str(signal)


def describe_wait(step: Step, topo: Topology, done: Container[Signal] = ()) -> str:
    """Human text of what ``step`` waits for (deadlock messages): ``1F3 and 2I/B3``.

    ``done``: signals already there; only the others are named.

    >>> from pipebubble.schedules import get_schedule
    >>> s = get_schedule("1f1b", ranks=2, microbatches=2)
    >>> b = Action(0, "B", 1)
    >>> describe_wait(b, s), describe_wait(b, s, done={Signal(0, "F", 1)})
    ('0F1 and 1I/B1', '1I/B1')
    """
    parts = [
        signal_text(d.signal, a.kind)
        for a in (step if isinstance(step, Overlap) else (step,))
        for d in producers(a, topo)
        if d.signal not in done and not (isinstance(step, Overlap)
                                         and d.signal == produces(step.forward))
    ]
    return " and ".join(parts) if parts else "nothing"
