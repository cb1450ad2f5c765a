"""The wire, made visible: lower a compute schedule to per-rank SEND/RECV programs.

A compute schedule says what each rank computes, in order. On real hardware every edge
between stages on different ranks (``crosses`` in :mod:`pipebubble.ir.deps`, the one rule
for who waits for whom) is also a message: F(s, m) *sends* its activation to the
rank of stage s+1 (``sSEND_Fm``), which *receives* it before its own forward (``s+1RECV_Fm``);
I/B(s, m) sends the input gradient back (``sSEND_Bm``) to the rank of stage s-1, which
receives it before its backward (``s-1RECV_Bm``). Text forms follow
torch.distributed.pipelining (``_Action``). Stages on the same rank (V placement) hand their
tensors over locally: no message.

:func:`lower` places the messages between the compute actions of each rank. Between compute
k-1 and compute k a rank has a *boundary*: the sends of k-1's outputs and the receives of
k's inputs. The ``ordering`` says how a boundary is posted:

- ``naive``: every rank sends, then receives, one blocking operation at a time.
- ``parity``: even ranks send first, odd ranks receive first (the lesson's fix).
- ``batched``: the whole boundary is posted at once (``batch_isend_irecv``); the rank waits
  for its receives before the next compute and for its sends only at the end of the step,
  as torch.distributed.pipelining does. No rank ever waits on a send mid-step, so a batched
  program finishes whenever the compute schedule itself does. Each batch also posts the
  receives of the rank's *next* batch (prefetch), so with rendezvous transports a message
  moves as soon as it is sent rather than when its consumer gets round to asking.

Why naive deadlocks when a send blocks until its receive is posted (rendezvous, as gloo does):
in 1F1B's steady state rank r has just run F and sends an activation forward while rank r+1
has just run B and sends a gradient back; each waits for the other to post a receive, and
neither ever does. :func:`run_wire` simulates a lowered program with blocking (or buffered)
P2P and reports such a deadlock naming every rank's stuck operation. It is the simulator's
rule (:func:`start_time`: a compute step starts when its rank is free and every producer's
output is there) plus a wire model (:class:`WireModel`: when a send or receive completes,
given when both sides were posted) that replaces the constant ``comm`` lag.

>>> from pipebubble.schedules import get_schedule
>>> w = lower(get_schedule("1f1b", ranks=2, microbatches=2), "naive")
>>> print(w.to_text())
0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..costs import CostModel, StageCosts
from ..ir.deps import (
    Signal,
    Topology,
    carried,
    describe_wait,
    handovers,
    message,
    producers,
    produces,
)
from ..ir.schedule import Action, Kind, Overlap, Schedule, ScheduleError, Step, step_actions
from ..timeline import Event, Timeline
from .kernel import Deadlock

ORDERINGS = ("naive", "parity", "batched")
_OPS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


class Comm(NamedTuple):
    """One point-to-point operation of ``stage`` on ``microbatch`` with rank ``peer``.

    ``op`` is SEND_F/RECV_F (activations) or SEND_B/RECV_B (input gradients). ``stage`` is the
    local stage, as in torch's text form: ``1SEND_B0`` is stage 1 sending the gradient of
    microbatch 0 to stage 0. ``key`` is the message, as the transports name it
    (``act``/``grad``, consumer stage, microbatch): the rule's
    :func:`~pipebubble.ir.deps.message` of the signal and the stage that waits for it, set
    where the operation is made (:func:`inputs_of`, :func:`outputs_of`), so a SEND and the
    RECV it matches have the same key.
    """

    stage: int
    op: str
    microbatch: int
    peer: int
    key: tuple[str, int, int]

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    __repr__ = __str__

    @property
    def is_send(self) -> bool:
        return self.op.startswith("SEND")


class Batch(NamedTuple):
    """Operations posted together and waited as one (``batch_isend_irecv``)."""

    ops: tuple[Comm, ...]

    def __str__(self) -> str:
        return "[" + " ".join(str(c) for c in self.ops) + "]"

    __repr__ = __str__


WireStep = Action | Overlap | Comm | Batch


@dataclass(frozen=True)
class WireSchedule:
    """A compute schedule with its messages: ``orders[r]`` is rank r's program."""

    schedule: Schedule
    ordering: str
    orders: tuple[tuple[WireStep, ...], ...]

    def to_text(self) -> str:
        return "\n".join(" ".join(str(s) for s in order) for order in self.orders)

    def comms(self, rank: int) -> Iterator[Comm]:
        for step in self.orders[rank]:
            if isinstance(step, Comm):
                yield step
            elif isinstance(step, Batch):
                yield from step.ops


def inputs_of(action: Action, topo: Topology) -> list[Comm]:
    """Receives ``action`` needs before it runs: one per producer on another rank
    (:func:`~pipebubble.ir.deps.producers`; a hand-over between stages of one rank is local).
    """
    s, _, m = action
    where = topo.stage_to_rank
    return [Comm(s, "RECV_F" if d.signal.kind == Kind.F else "RECV_B", m, where[d.signal.stage],
                 message(d.signal, s))
            for d in producers(action, topo) if d.crosses]


def outputs_of(action: Action, topo: Topology) -> list[Comm]:
    """Sends ``action`` makes after it runs: one per hand-over to another rank
    (:func:`~pipebubble.ir.deps.handovers`)."""
    s, k, m = action
    where = topo.stage_to_rank
    out = produces(action)
    return [Comm(s, "SEND_F" if k == Kind.F else "SEND_B", m, where[h.to_stage],
                 message(out, h.to_stage))
            for h in handovers(action, topo) if h.crosses]


def lower(schedule: Schedule, ordering: str = "batched",
          recv_first: Callable[[int, tuple, tuple], bool] | None = None) -> WireSchedule:
    """Insert each rank's SEND/RECV operations, posted in ``ordering`` (see module doc).

    An overlapped pair (DualPipe's F&B) stays one step: both parts' receives come before
    it and both parts' sends after it; the runtime runs its two parts in sequence.

    ``recv_first``: a boundary rule of one's own (an engine's order, e.g.
    ``plan/deepspeed.deepspeed_lowering``): ``recv_first(rank, before, after)`` (the
    actions of the compute steps either side) says whether the rank posts its receives
    before its sends there, one blocking operation at a time; ``ordering`` then only names
    the rule.
    """
    if recv_first is None and ordering not in ORDERINGS:
        raise ScheduleError(f"unknown p2p ordering {ordering!r}; valid are {', '.join(ORDERINGS)}")
    # The rule is the same for every microbatch: each (stage, kind)'s sends and receives are
    # asked once (of microbatch 0), and made for each action from that (op, peer, message).
    made: dict[tuple, list[tuple]] = {}

    def comms(a: Action, of: Callable) -> list[Comm]:
        s, k, m = a
        got = made.get((s, k, of))
        if got is None:
            got = made[s, k, of] = [(c.op, c.peer, c.key[0], c.key[1])
                                    for c in of(Action(s, k, 0), schedule)]
        return [Comm(s, op, m, peer, (name, to, m)) for op, peer, name, to in got]

    orders = []
    for r in range(schedule.num_ranks):
        comps = schedule.orders[r]
        out: list[WireStep] = []
        for k in range(len(comps) + 1):
            before = step_actions(comps[k - 1]) if k > 0 else ()
            after = step_actions(comps[k]) if k < len(comps) else ()
            sends = [c for a in before for c in comms(a, outputs_of)]
            recvs = [c for a in after for c in comms(a, inputs_of)]
            if recv_first is not None:
                out.extend(recvs + sends if recv_first(r, before, after) else sends + recvs)
            elif ordering == "batched":
                if sends or recvs:
                    out.append(Batch(tuple(sends + recvs)))
            elif ordering == "naive" or r % 2 == 0:
                out.extend(sends + recvs)
            else:
                out.extend(recvs + sends)
            if k < len(comps):
                out.append(comps[k])
        orders.append(tuple(out))
    return WireSchedule(schedule, ordering, tuple(orders))


def pair_order_mismatches(wired: WireSchedule) -> list[str]:
    """Rank pairs whose sends and receives come in different orders.

    Backends that ignore message tags (NCCL) match messages between two ranks in posting
    order, so a program is only safe there when this list is empty. Gloo matches by tag.
    """
    sent: dict[tuple[int, int], list] = {}
    got: dict[tuple[int, int], list] = {}
    for r in range(len(wired.orders)):
        for c in wired.comms(r):
            pair = (r, c.peer) if c.is_send else (c.peer, r)
            (sent if c.is_send else got).setdefault(pair, []).append(c.key)
    return [
        f"rank {a} -> rank {b}: sent {sent[a, b]} but received {got.get((a, b))}"
        for (a, b) in sorted(sent) if sent[a, b] != got.get((a, b))
    ]


class WireDeadlock(Deadlock):
    """A lowered program cannot progress; ``stuck`` maps rank -> (wire step, what it awaits)."""


@dataclass
class WireResult:
    """What :func:`run_wire` returns: compute timeline, and when every message was matched."""

    timeline: Timeline
    comm_done: dict[tuple[int, Comm], float]  # (rank, op) -> completion time


class WireModel:
    """When a point-to-point operation completes, given when each side was posted.

    ``blocking``: a send completes only when its receive is posted (rendezvous, as gloo
    does), and both complete ``comm`` after the later of the two posts. Otherwise sends are
    buffered: a send completes when posted and its message arrives ``comm`` later, so the
    receive completes at ``max(receive posted, send posted + comm)``. Posting a message
    twice (a receive prefetched by the batch before) keeps the first time.
    """

    def __init__(self, comm: float, blocking: bool):
        self.comm, self.blocking = comm, blocking
        self.sent: dict[tuple, float] = {}
        self.asked: dict[tuple, float] = {}

    def post(self, c: Comm, t: float) -> None:
        (self.sent if c.is_send else self.asked).setdefault(c.key, t)

    def peer_posted(self, c: Comm) -> bool:
        """True once the other side of ``c``'s message is posted."""
        return c.key in (self.asked if c.is_send else self.sent)

    def done(self, c: Comm) -> float | None:
        """Completion time of ``c`` (posted), or None while it waits for its peer."""
        mine = (self.sent if c.is_send else self.asked)[c.key]
        other = (self.asked if c.is_send else self.sent).get(c.key)
        if c.is_send and not self.blocking:
            return mine
        if other is None:
            return None
        if self.blocking:
            return max(mine, other) + self.comm
        return max(mine, other + self.comm)


def start_time(step: Step, free: float, arrived: dict[Signal, float],
               topo: Topology) -> float | None:
    """When ``step`` may start on a rank free from ``free``: the simulator's rule,
    ``max(rank free, every producer's signal here)`` over
    :func:`~pipebubble.ir.deps.producers`, or None while one has not arrived. ``arrived``
    holds the rank's signals: its own actions' at their end, the others' when their
    receive completed (so communication time is in it)."""
    t = free
    for dep in producers(step, topo):
        at = arrived.get(dep.signal)
        if at is None:
            return None
        if at > t:
            t = at
    return t


def run_wire(
    wired: WireSchedule, costs: CostModel | StageCosts | None = None, blocking: bool = True
) -> WireResult:
    """Simulate a lowered program; raise :class:`WireDeadlock` if it cannot finish.

    The simulator's clock with the messages made explicit. Each rank runs its program in
    order. A compute step starts at :func:`start_time` (rank free, producers done, as in
    :func:`~pipebubble.sim.kernel.simulate`) and lasts its cost; a SEND/RECV is posted when
    the rank reaches it and completes when the :class:`WireModel` says. A lone operation
    blocks the rank until it completes; a batch waits for its receives only (its sends
    finish in the background and are waited for at the end of the step) and also posts the
    receives of the rank's next batch (see :func:`lower`). With buffered sends and the naive
    or batched ordering a receive completes ``comm`` after its producer ends, as in
    ``simulate``, and so does the whole compute timeline; blocking adds the time senders
    wait (naive, parity) and the time a message waits for its receive to be posted.
    """
    sched = wired.schedule
    sc = costs if isinstance(costs, StageCosts) else (costs or CostModel()).resolve(
        sched.num_stages, sched.chunks
    )
    p = sched.num_ranks
    wire = WireModel(sc.comm, blocking)
    ptr, free = [0] * p, [0.0] * p
    posted = [-1] * p  # the index of the comm step rank r last posted
    arrived: list[dict[Signal, float]] = [{} for _ in range(p)]
    comm_done: dict[tuple[int, Comm], float] = {}
    events: list[Event] = []
    ahead = [_next_receives(order) for order in wired.orders]
    remaining = sum(len(o) for o in wired.orders)
    while remaining:
        progressed = 0
        for r in range(p):
            order = wired.orders[r]
            while ptr[r] < len(order):
                step = order[ptr[r]]
                if isinstance(step, Action | Overlap):
                    t = start_time(step, free[r], arrived[r], sched)
                    if t is None:
                        break
                    free[r] = _compute(step, r, t, sc, arrived[r], events)
                else:
                    batch = isinstance(step, Batch)
                    ops = step.ops if batch else (step,)
                    if posted[r] != ptr[r]:
                        posted[r] = ptr[r]
                        for c in (*ops, *ahead[r].get(ptr[r], ())):
                            wire.post(c, free[r])
                        progressed += 1  # posting can unblock a peer
                    waited = [c for c in ops if not (batch and c.is_send)]
                    times = [wire.done(c) for c in waited]
                    if None in times:
                        break
                    for c, t in zip(waited, times, strict=True):
                        comm_done[r, c] = t
                        if not c.is_send:
                            arrived[r][_carried(c, sched)] = t
                    free[r] = max([free[r], *times])
                ptr[r] += 1
                progressed += 1
                remaining -= 1
        if not progressed:
            raise _wire_deadlock(wired, ptr, arrived, wire)
    for r in range(p):  # the sends each batch left in flight: every receive was matched
        for c in wired.comms(r):
            if (r, c) not in comm_done:
                comm_done[r, c] = wire.done(c)
    timeline = Timeline.from_events(
        events, schedule=sched.name, num_ranks=p, num_stages=sched.num_stages,
        num_microbatches=sched.num_microbatches, stage_to_rank=sched.stage_to_rank,
        source="simulated", shift_to_zero=False, chain_starts=sched.chain_starts,
    )
    return WireResult(timeline, comm_done)


def _next_receives(order: tuple[WireStep, ...]) -> dict[int, tuple[Comm, ...]]:
    """For each batch, the receives of the rank's next batch (posted with it: prefetch)."""
    out: dict[int, tuple[Comm, ...]] = {}
    last = None
    for i, step in enumerate(order):
        if isinstance(step, Batch):
            if last is not None:
                out[last] = tuple(c for c in step.ops if not c.is_send)
            last = i
    return out


def _carried(c: Comm, topo: Topology) -> Signal:
    """The signal a receive brings (:func:`~pipebubble.ir.deps.carried`: the rule's)."""
    return carried(c.key[0], c.stage, c.microbatch, topo)


def _compute(step: Action | Overlap, r: int, t: float, sc: StageCosts,
             arrived: dict[Signal, float], events: list[Event]) -> float:
    """Run ``step`` from ``t``; record its Events and the signals it produces on rank r.
    An Overlap's parts run back to back (:meth:`StageCosts.pair_parts`: the pair's time
    from its compute and all-to-all), and both its outputs are ready when the pair ends, as
    in simulate."""
    ov = isinstance(step, Overlap)
    parts = (sc.pair_parts(step.forward.stage, step.backward.stage, step.backward.kind)
             if ov else (sc.lone_part(step.stage, step.kind),))
    for a, part in zip(step_actions(step), parts, strict=True):
        s, k, m = a
        end = t + part.duration
        lo, hi = sc.memory_deltas(s, k)
        events.append(Event(r, s, k, m, t, end, lo, hi, ov, part.hidden, part.exposed))
        t = end
    for a in step_actions(step):
        arrived[produces(a)] = t
    return t


def _wire_deadlock(wired: WireSchedule, ptr: list[int], arrived: list[dict[Signal, float]],
                   wire: WireModel) -> WireDeadlock:
    stuck: dict[int, tuple[str, str]] = {}
    for r, order in enumerate(wired.orders):
        if ptr[r] >= len(order):
            continue
        step = order[ptr[r]]
        if isinstance(step, Action | Overlap):
            stuck[r] = (str(step), describe_wait(step, wired.schedule, arrived[r]))
            continue
        waits = []
        batch = isinstance(step, Batch)
        for c in step.ops if batch else (step,):
            if c.is_send and (batch or not wire.blocking):
                continue
            if wire.peer_posted(c):
                continue
            what = "receive" if c.is_send else "send"
            waits.append(f"rank {c.peer} to post the matching {what} of {c}")
        stuck[r] = (str(step), ", ".join(waits) or "nothing")
    return WireDeadlock(stuck)


__all__ = [
    "ORDERINGS",
    "Batch",
    "Comm",
    "WireDeadlock",
    "WireModel",
    "WireResult",
    "WireSchedule",
    "inputs_of",
    "lower",
    "outputs_of",
    "pair_order_mismatches",
    "run_wire",
    "start_time",
]
