"""The wire, made visible: lower a compute schedule to per-rank SEND/RECV programs.

A compute schedule says what each rank computes, in order. On real hardware every edge
between stages on different ranks is also a message: F(s, m) *sends* its activation to the
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
P2P and reports such a deadlock naming every rank's stuck operation.

>>> from pipebubble.schedules import get_schedule
>>> w = lower(get_schedule("1f1b", ranks=2, microbatches=2), "naive")
>>> print(w.to_text())
0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..costs import CostModel, StageCosts
from ..ir.schedule import Action, Overlap, Schedule, ScheduleError, step_actions
from ..timeline import Event, Timeline
from .kernel import Deadlock

ORDERINGS = ("naive", "parity", "batched")
_OPS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


class Comm(NamedTuple):
    """One point-to-point operation of ``stage`` on ``microbatch`` with rank ``peer``.

    ``op`` is SEND_F/RECV_F (activations) or SEND_B/RECV_B (input gradients). ``stage`` is the
    local stage, as in torch's text form: ``1SEND_B0`` is stage 1 sending the gradient of
    microbatch 0 to stage 0.
    """

    stage: int
    op: str
    microbatch: int
    peer: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    __repr__ = __str__

    @property
    def is_send(self) -> bool:
        return self.op.startswith("SEND")

    @property
    def key(self) -> tuple[str, int, int]:
        """The message, as the transports name it: (``act``/``grad``, consumer stage, mb).

        A SEND and the RECV it matches have the same key.
        """
        s, m = self.stage, self.microbatch
        return {
            "SEND_F": ("act", s + 1, m),
            "RECV_F": ("act", s, m),
            "SEND_B": ("grad", s - 1, m),
            "RECV_B": ("grad", s, m),
        }[self.op]


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


def chain_starts(schedule: Schedule) -> tuple[int, ...]:
    """First stage of each independent chain (DualPipe's two model copies: ``(0, p)``)."""
    return tuple(getattr(schedule, "chain_starts", (0,)))


def _feeds(s: int, where: tuple[int, ...], starts: tuple[int, ...]) -> bool:
    """True if stage s's output goes to stage s+1 (same chain)."""
    return s + 1 < len(where) and s + 1 not in starts


def inputs_of(action: Action, where: tuple[int, ...], rank: int,
              starts: tuple[int, ...] = (0,)) -> list[Comm]:
    """Receives ``action`` needs before it runs on ``rank`` (none for local hand-over)."""
    s, k, m = action
    if k == "F" and s > 0 and _feeds(s - 1, where, starts) and where[s - 1] != rank:
        return [Comm(s, "RECV_F", m, where[s - 1])]
    if k in ("B", "I") and _feeds(s, where, starts) and where[s + 1] != rank:
        return [Comm(s, "RECV_B", m, where[s + 1])]
    return []


def outputs_of(action: Action, where: tuple[int, ...], rank: int,
               starts: tuple[int, ...] = (0,)) -> list[Comm]:
    """Sends ``action`` makes after it runs on ``rank`` (none for local hand-over)."""
    s, k, m = action
    if k == "F" and _feeds(s, where, starts) and where[s + 1] != rank:
        return [Comm(s, "SEND_F", m, where[s + 1])]
    if k in ("B", "I") and s > 0 and _feeds(s - 1, where, starts) and where[s - 1] != rank:
        return [Comm(s, "SEND_B", m, where[s - 1])]
    return []


def lower(schedule: Schedule, ordering: str = "batched") -> WireSchedule:
    """Insert each rank's SEND/RECV operations, posted in ``ordering`` (see module doc).

    An overlapped pair (DualPipe's F&B) stays one step: both parts' receives come before
    it and both parts' sends after it; the runtime runs its two parts in sequence.
    """
    if ordering not in ORDERINGS:
        raise ScheduleError(f"unknown p2p ordering {ordering!r}; valid are {', '.join(ORDERINGS)}")
    where = schedule.stage_to_rank
    starts = chain_starts(schedule)
    orders = []
    for r in range(schedule.num_ranks):
        comps = schedule.orders[r]
        out: list[WireStep] = []
        for k in range(len(comps) + 1):
            before = step_actions(comps[k - 1]) if k > 0 else ()
            after = step_actions(comps[k]) if k < len(comps) else ()
            sends = [c for a in before for c in outputs_of(a, where, r, starts)]
            recvs = [c for a in after for c in inputs_of(a, where, r, starts)]
            if ordering == "batched":
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


def run_wire(
    wired: WireSchedule, costs: CostModel | StageCosts | None = None, blocking: bool = True
) -> WireResult:
    """Simulate a lowered program; raise :class:`WireDeadlock` if it cannot finish.

    ``blocking=True``: a send completes only when its receive is posted (rendezvous) and
    both complete ``comm`` later. ``blocking=False``: sends are buffered; a send completes at
    once and its message arrives ``comm`` later. A batch's receives are waited for at once,
    its sends at the end. With buffered sends and the naive or batched ordering, the compute
    timeline equals :func:`~pipebubble.sim.kernel.simulate`'s; blocking adds the time senders
    wait (naive, parity) and the time a message waits for its receive to be posted.
    """
    sched = wired.schedule
    sc = costs if isinstance(costs, StageCosts) else (costs or CostModel()).resolve(
        sched.num_stages, sched.chunks
    )
    p, comm = sched.num_ranks, sc.comm
    where = sched.stage_to_rank
    starts = chain_starts(sched)
    ptr, now = [0] * p, [0.0] * p
    posted: list[float | None] = [None] * p  # when rank r posted its current comm step
    send_post: dict[tuple, float] = {}
    recv_post: dict[tuple, float] = {}
    avail: list[dict[tuple, float]] = [{} for _ in range(p)]  # inputs present on rank r
    comm_done: dict[tuple[int, Comm], float] = {}
    events: list[Event] = []

    def done_at(c: Comm, r: int) -> float | None:
        mine = (send_post if c.is_send else recv_post)[c.key]
        other = (recv_post if c.is_send else send_post).get(c.key)
        if c.is_send and not blocking:
            return mine
        if other is None:
            return None
        if blocking:
            return max(mine, other) + comm
        return max(mine, other + comm)

    # A batch also posts the receives of the rank's next batch (prefetch, see ``lower``).
    nxt: list[dict[int, tuple[Comm, ...]]] = []
    for order in wired.orders:
        ahead: dict[int, tuple[Comm, ...]] = {}
        last = None
        for i, step in enumerate(order):
            if isinstance(step, Batch):
                if last is not None:
                    ahead[last] = tuple(c for c in step.ops if not c.is_send)
                last = i
        nxt.append(ahead)
    remaining = sum(len(o) for o in wired.orders)
    while remaining:
        progressed = 0
        for r in range(p):
            order = wired.orders[r]
            while ptr[r] < len(order):
                step = order[ptr[r]]
                lazy = isinstance(step, Batch)
                if isinstance(step, Action | Overlap):
                    t = _compute(step, r, now[r], sc, where, avail[r], events, starts)
                    if t is None:
                        break
                    now[r] = t
                else:
                    ops = step.ops if isinstance(step, Batch) else (step,)
                    if posted[r] is None:
                        posted[r] = now[r]
                        early = nxt[r].get(ptr[r], ()) if lazy else ()
                        for c in (*ops, *early):
                            box = send_post if c.is_send else recv_post
                            box.setdefault(c.key, now[r])  # a prefetched receive keeps its time
                        progressed += 1  # posting can unblock a peer
                    # A batch waits for its receives; its sends finish in the background
                    # and are waited for at the end of the step (see ``lower``).
                    waited = [c for c in ops if not (lazy and c.is_send)]
                    times = [done_at(c, r) for c in waited]
                    if any(t is None for t in times):
                        break
                    for c, t in zip(waited, times, strict=True):
                        comm_done[r, c] = t
                        if not c.is_send:
                            avail[r][c.key] = t
                    now[r] = max([now[r], *times])
                    posted[r] = None
                ptr[r] += 1
                progressed += 1
                remaining -= 1
        if not progressed:
            raise _wire_deadlock(wired, ptr, send_post, recv_post, blocking)
    for r in range(p):  # the sends each batch left in flight
        for c in wired.comms(r):
            if (r, c) not in comm_done:
                comm_done[r, c] = done_at(c, r)  # every receive was matched, so is every send
    timeline = Timeline.from_events(
        events, schedule=sched.name, num_ranks=p, num_stages=sched.num_stages,
        num_microbatches=sched.num_microbatches, stage_to_rank=where, source="simulated",
        shift_to_zero=False,
    )
    return WireResult(timeline, comm_done)


def _compute(step: Action | Overlap, r: int, t: float, sc: StageCosts, where, avail, events,
             starts) -> float | None:
    """Run ``step`` on rank r at time t if its inputs are present; return its end.

    An Overlap starts when both parts may and lasts ``overlap x (F + B)``, as in simulate.
    """
    if isinstance(step, Overlap):
        times = [_ready(a, where, avail, starts) for a in (step.forward, step.backward)]
        if times[0] is None or times[1] is None:
            return None
        t0 = max([t, *times[0], *times[1]])
        mid = _compute_one(step.forward, r, t0, sc, where, avail, events, starts, sc.overlap,
                           True)
        return _compute_one(step.backward, r, mid, sc, where, avail, events, starts,
                            sc.overlap, True)
    return _compute_one(step, r, t, sc, where, avail, events, starts)


def _ready(a: Action, where, avail, starts) -> list[float] | None:
    """When ``a``'s inputs arrived ([] if it needs none), or None if one is missing."""
    s, k, m = a
    need = []
    if k == "F" and s > 0 and _feeds(s - 1, where, starts):
        need.append(("act", s, m))
    if k in ("B", "I") and _feeds(s, where, starts):
        need.append(("grad", s, m))
    if k in ("B", "I"):
        need.append(("F", s, m))
    if k == "W":
        need.append(("I", s, m))
    if any(n not in avail for n in need):
        return None
    return [avail[n] for n in need]


def _compute_one(a: Action, r: int, t: float, sc: StageCosts, where, avail, events, starts,
                 scale: float = 1.0, overlapped: bool = False) -> float | None:
    s, k, m = a
    need = None
    if k == "F" and s > 0 and _feeds(s - 1, where, starts):
        need = ("act", s, m)
    elif k in ("B", "I") and _feeds(s, where, starts):
        need = ("grad", s, m)
    if k in ("B", "I") and ("F", s, m) not in avail:
        return None
    if k == "W" and ("I", s, m) not in avail:
        return None
    if need is not None:
        if need not in avail:
            return None
        t = max(t, avail[need])
    end = t + sc.duration(s, k) * scale
    lo, hi = sc.memory_deltas(s, k)
    events.append(Event(r, s, k, m, t, end, lo, hi, overlapped))
    avail[k, s, m] = end
    if k == "F" and _feeds(s, where, starts) and where[s + 1] == r:
        avail["act", s + 1, m] = end
    if k in ("B", "I") and s > 0 and _feeds(s - 1, where, starts) and where[s - 1] == r:
        avail["grad", s - 1, m] = end
    return end


def _wire_deadlock(wired, ptr, send_post, recv_post, blocking) -> WireDeadlock:
    stuck: dict[int, tuple[str, str]] = {}
    for r, order in enumerate(wired.orders):
        if ptr[r] >= len(order):
            continue
        step = order[ptr[r]]
        if isinstance(step, Action | Overlap):
            stuck[r] = (str(step), "its input")
            continue
        waits = []
        for c in step.ops if isinstance(step, Batch) else (step,):
            other = recv_post if c.is_send else send_post
            if c.key in other or (c.is_send and (not blocking or isinstance(step, Batch))):
                continue
            what = "receive" if c.is_send else "send"
            waits.append(f"rank {c.peer} to post the matching {what} of {c}")
        stuck[r] = (str(step), ", ".join(waits) or "nothing")
    return WireDeadlock(stuck)


def wired_step_count(schedule: Schedule) -> int:
    """Number of messages between ranks in one step (2 per stage boundary per microbatch)."""
    where, starts = schedule.stage_to_rank, chain_starts(schedule)
    cross = sum(1 for s in range(schedule.num_stages - 1)
                if _feeds(s, where, starts) and where[s] != where[s + 1])
    return 2 * cross * schedule.num_microbatches


__all__ = [
    "ORDERINGS",
    "Batch",
    "Comm",
    "WireDeadlock",
    "WireResult",
    "WireSchedule",
    "inputs_of",
    "lower",
    "outputs_of",
    "pair_order_mismatches",
    "run_wire",
    "wired_step_count",
]
