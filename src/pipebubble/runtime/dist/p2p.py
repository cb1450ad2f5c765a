"""A Transport over torch.distributed point-to-point messages, driven by a lowered program.

The stage interpreter talks to every transport the same way: ``send`` a tensor for (kind,
stage, microbatch) when it produced one, ``recv`` it when an action needs it. Here ``send``
only parks the tensor (or hands it over locally when the consumer stage lives on this rank,
as with V placement); the messages themselves move when the rank's wire program
(:mod:`pipebubble.sim.wire`) reaches its SEND/RECV steps:

- a :class:`~pipebubble.sim.wire.Comm` step is one *blocking* ``dist.send``/``dist.recv``
  (orderings ``naive`` and ``parity``): with gloo a send returns only once the peer has posted
  the receive, so the order can deadlock, which is the point of showing it;
- a :class:`~pipebubble.sim.wire.Batch` is one ``batch_isend_irecv``: the rank waits for the
  receives before its next compute and for the sends in :meth:`finish`, at the end of the step.

Shapes and dtypes are sent first: on the first step every activation is preceded by a small
header (dtype code and shape), after which the receiver remembers them per (stage,
microbatch). A gradient needs no header: it has the shape of the activation this rank sent.
Messages carry a tag made of (kind, stage, microbatch), so gloo matches them whatever order
they are posted in. NCCL ignores tags and matches messages between two ranks in posting
order, so there the program must post them in the same order on both ends
(``wire.pair_order_mismatches`` is checked first); tensors then live on the rank's GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...sim.wire import Batch, Comm

Key = tuple[str, int, int]
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.bool)
_HEADER = 10  # dtype code, ndim, up to 8 dimensions


@dataclass
class P2PTransport:
    """Carries one rank's messages; ``peer_rank(r)`` maps a pipeline rank to a global rank.

    ``shapes`` and ``headers_sent`` persist across steps (the header handshake happens once,
    so keep one transport per rank and call :meth:`new_step`); ``on_wait`` is
    called with a description before every blocking wait, so a watchdog can say where a
    rank is stuck.
    """

    rank: int
    stage_to_rank: Sequence[int]
    num_microbatches: int
    peer_rank: Callable[[int], int]
    shapes: dict[Key, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    headers_sent: set[Key] = field(default_factory=set)
    on_wait: Callable[[str], None] = lambda what: None
    group: object | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    inbox: dict[Key, tuple[torch.Tensor, float]] = field(default_factory=dict)
    outbox: dict[Key, tuple[torch.Tensor, float]] = field(default_factory=dict)
    in_flight: list = field(default_factory=list)  # (work, tensor) of sends not yet waited
    prefetched: dict = field(default_factory=dict)  # key -> (work, buffer) of early receives
    messages: int = 0

    # ---- the Transport protocol (what the interpreter calls) ---------------------------
    def send(self, kind: str, stage: int, microbatch: int, tensor: torch.Tensor, t: float) -> None:
        key = (kind, stage, microbatch)
        box = self.inbox if self.stage_to_rank[stage] == self.rank else self.outbox
        if key in box:
            raise RuntimeError(f"second {kind} message for stage {stage} microbatch {microbatch}")
        box[key] = (tensor, t)

    def recv(self, kind: str, stage: int, microbatch: int) -> tuple[torch.Tensor, float] | None:
        return self.inbox.pop((kind, stage, microbatch), None)

    def peek(self, kind: str, stage: int, microbatch: int) -> bool:
        return (kind, stage, microbatch) in self.inbox

    def new_step(self) -> None:
        self.inbox.clear()
        self.outbox.clear()
        self.messages = 0

    # ---- the wire program --------------------------------------------------------------
    def run(self, step: Comm | Batch, next_batch: Batch | None = None) -> None:
        """Carry out one SEND/RECV step (blocking) or one batch (receives waited).

        With a batch, the receives of ``next_batch`` (the rank's next one) are posted too,
        when their shapes are known, and waited for when that batch comes (prefetch).
        """
        if isinstance(step, Comm):
            self._blocking(step)
        else:
            ahead = [c for c in next_batch.ops if not c.is_send] if next_batch else []
            self._batched(step.ops, ahead)

    def finish(self) -> None:
        """Wait for the sends still in flight (end of step); check nothing is left over."""
        for i, (work, _) in enumerate(self.in_flight):
            self.on_wait(f"waiting for send {i + 1} of {len(self.in_flight)} to complete")
            work.wait()
        self.in_flight.clear()
        left = sorted(self.outbox) + sorted(self.inbox) + sorted(self.prefetched)
        if left:
            raise RuntimeError(f"rank {self.rank}: messages never consumed: {left[:4]}")

    def _tag(self, key: Key, header: bool = False) -> int:
        kind, stage, m = key
        base = ((stage * 2 + (kind == "grad")) * self.num_microbatches + m) * 2
        return base + int(header)

    def _payload(self, c: Comm) -> torch.Tensor:
        tensor, _ = self.outbox.pop(c.key)
        tensor = tensor.detach().contiguous()
        if c.op == "SEND_F":  # the gradient that comes back has the same shape and dtype
            self.shapes["grad", c.stage, c.microbatch] = (tuple(tensor.shape), tensor.dtype)
        return tensor

    def _needs_header(self, c: Comm) -> bool:
        """True the first time an activation message passes (both ends agree on this)."""
        if c.op == "SEND_F":
            return c.key not in self.headers_sent
        return c.op == "RECV_F" and c.key not in self.shapes

    def _blocking(self, c: Comm) -> None:
        peer = self.peer_rank(c.peer)
        if c.is_send:
            tensor = self._payload(c)
            if self._needs_header(c):
                self.on_wait(f"{c} (header): send to rank {c.peer}, waiting for its receive")
                dist.send(_header(tensor).to(self.device), peer, group=self.group,
                          tag=self._tag(c.key, True))
                self.headers_sent.add(c.key)
            self.on_wait(f"{c}: send to rank {c.peer}, waiting for it to post the receive")
            dist.send(tensor, peer, group=self.group, tag=self._tag(c.key))
        else:
            if self._needs_header(c):
                self.on_wait(f"{c} (header): receive from rank {c.peer}, waiting for its send")
                hdr = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                dist.recv(hdr, peer, group=self.group, tag=self._tag(c.key, True))
                self.shapes[c.key] = _parse_header(hdr)
            buf = self._buffer(c)
            self.on_wait(f"{c}: receive from rank {c.peer}, waiting for its send")
            dist.recv(buf, peer, group=self.group, tag=self._tag(c.key))
            self.inbox[c.key] = (buf, 0.0)
        self.messages += 1

    def _batched(self, ops: Sequence[Comm], prefetch: Sequence[Comm] = ()) -> None:
        """Post the batch's sends (headers and payloads) and receives, then wait for the
        receives. On the first step a receive needs its header first: headers and every
        send go out at once, and a payload receive is posted once its header is in. (A send
        never waits for this batch's headers: its peer may need the send before it can
        produce what this batch receives, as in ZB-V's turn at p=2, m=1.)"""
        first: list[dist.P2POp] = []  # header sends and receives, payload sends
        got: list[tuple[Comm, torch.Tensor]] = []
        for c in ops:
            peer = self.peer_rank(c.peer)
            if c.is_send:
                payload = self._payload(c)
                if self._needs_header(c):
                    first.append(dist.P2POp(dist.isend, _header(payload).to(self.device), peer,
                                            self.group, self._tag(c.key, True)))
                    self.headers_sent.add(c.key)
                first.append(dist.P2POp(dist.isend, payload, peer, self.group, self._tag(c.key)))
            elif self._needs_header(c):
                hdr = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                first.append(dist.P2POp(dist.irecv, hdr, peer, self.group,
                                        self._tag(c.key, True)))
                got.append((c, hdr))
        if first:
            self._wait_receives(first, "headers of " + " ".join(map(str, ops)))
            for c, hdr in got:
                self.shapes[c.key] = _parse_header(hdr)
        p2p: list[dist.P2POp] = []
        mine: list[tuple[Comm, dist.P2POp | None]] = []  # None: posted by an earlier batch
        for c in ops:
            if c.is_send:
                continue
            if c.key in self.prefetched:
                mine.append((c, None))
            else:
                op = dist.P2POp(dist.irecv, self._buffer(c), self.peer_rank(c.peer),
                                self.group, self._tag(c.key))
                p2p.append(op)
                mine.append((c, op))
        early = []
        for c in prefetch:
            if c.key in self.shapes and c.key not in self.prefetched:
                op = dist.P2POp(dist.irecv, self._buffer(c), self.peer_rank(c.peer),
                                self.group, self._tag(c.key))
                p2p.append(op)
                early.append((c, op))
        works = dict(zip(map(id, p2p), dist.batch_isend_irecv(p2p), strict=True)) if p2p else {}
        for c, op in early:
            self.prefetched[c.key] = (works[id(op)], op.tensor)
        self.on_wait(f"batch {' '.join(map(str, ops))}: waiting for its receives")
        for c, op in mine:
            work, buf = self.prefetched.pop(c.key) if op is None else (works[id(op)], op.tensor)
            work.wait()
            self.inbox[c.key] = (buf, 0.0)
        self.messages += len(ops)

    def _wait_receives(self, ops: list[dist.P2POp], what: str) -> None:
        works = dist.batch_isend_irecv(ops)
        self.on_wait(f"batch {what}: waiting for its receives")
        for op, work in zip(ops, works, strict=True):
            if op.op is dist.isend:
                self.in_flight.append((work, op.tensor))
            else:
                work.wait()

    def _buffer(self, c: Comm) -> torch.Tensor:
        if c.key not in self.shapes:
            raise RuntimeError(
                f"rank {self.rank}: shape of {c} unknown (its activation was never sent)"
            )
        shape, dtype = self.shapes[c.key]
        return torch.empty(shape, dtype=dtype, device=self.device)


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dtype not in DTYPES:
        raise TypeError(f"cannot send dtype {t.dtype}; supported are {DTYPES}")
    if t.dim() > _HEADER - 2:
        raise ValueError(f"cannot send a {t.dim()}-d tensor; at most {_HEADER - 2} dimensions")
    h = torch.zeros(_HEADER, dtype=torch.int64)
    h[0], h[1] = DTYPES.index(t.dtype), t.dim()
    h[2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return h


def _parse_header(h: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    ndim = int(h[1])
    return tuple(int(x) for x in h[2 : 2 + ndim]), DTYPES[int(h[0])]
