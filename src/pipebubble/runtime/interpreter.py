"""The stage interpreter: one handler per action kind, the same for every schedule.

A rank holds one or more stages (``modules[stage]``). The interpreter runs one action at a
time when its inputs have arrived through the transport:

- ``F(s, m)``: take the activation (stage 0: the input microbatch), run the stage, keep what
  the backward needs, send the output to stage s+1 (the last stage computes the loss).
- ``B(s, m)``: take the output gradient (last stage: from the loss), backpropagate through
  the stage, accumulate weight gradients, send the input gradient to stage s-1.

Each action is timed by a clock (``clock.py``): a virtual per-stage clock in one process,
real wall time across processes. The interpreter records one Event per action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..schedule import Action
from ..timeline import Event
from .clock import Clock
from .transport import Transport

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class _Saved:
    """What F keeps for the backward of one (stage, microbatch)."""

    inputs: torch.Tensor
    output: torch.Tensor  # for the last stage: the scaled loss
    nbytes: int = 0


@dataclass
class StageInterpreter:
    """Runs the actions of the stages that one rank holds.

    ``inputs``/``targets`` are the microbatches (needed only by the rank holding stage 0 /
    the last stage); ``loss_weights[m]`` scales microbatch m's loss so that accumulated
    gradients equal the full-batch gradient of the mean loss.
    """

    rank: int
    modules: dict[int, nn.Module]
    num_stages: int
    stage_to_rank: Sequence[int]
    transport: Transport
    clock: Clock
    inputs: Sequence[torch.Tensor] = ()
    targets: Sequence[torch.Tensor] = ()
    loss_fn: LossFn | None = None
    loss_weights: Sequence[float] = ()
    saved: dict[tuple[int, int], _Saved] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    held_bytes: int = 0
    _param_ptrs: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._param_ptrs = {
            p.untyped_storage().data_ptr()
            for mod in self.modules.values()
            for p in mod.parameters()
        }

    # ---- readiness --------------------------------------------------------------------
    def ready(self, action: Action) -> bool:
        """True when the inputs ``action`` needs have arrived (peeks, takes nothing)."""
        s, kind, m = action
        if kind == "F":
            return s == 0 or self._peek("act", s, m)
        if kind in ("B", "I"):
            return s == self.num_stages - 1 or self._peek("grad", s, m)
        return True

    def _peek(self, kind: str, s: int, m: int) -> bool:
        peek = getattr(self.transport, "peek", None)
        if peek is not None:
            return peek(kind, s, m)
        return (kind, s, m) in self.transport.pending  # type: ignore[attr-defined]

    # ---- execution ----------------------------------------------------------------------
    def run(self, action: Action) -> Event:
        handler = getattr(self, f"_do_{action.kind}", None)
        if handler is None:
            raise ValueError(f"no handler for action {action}; valid kinds are F, B")
        return handler(action)

    def _recv(self, kind: str, s: int, m: int) -> tuple[torch.Tensor, float]:
        got = self.transport.recv(kind, s, m)
        if got is None:
            raise RuntimeError(f"rank {self.rank}: {kind} for stage {s} microbatch {m} missing")
        return got

    def _arrival(self, producer_stage: int, t: float) -> float:
        cross = self.stage_to_rank[producer_stage] != self.rank
        return self.clock.arrival(t, cross)

    def _do_F(self, action: Action) -> Event:
        s, _, m = action
        if s == 0:
            x, earliest = self.inputs[m], 0.0
        else:
            x, t = self._recv("act", s, m)
            earliest = self._arrival(s - 1, t)
        x = x.detach().requires_grad_(s > 0)
        module = self.modules[s]
        last = s == self.num_stages - 1

        def work() -> torch.Tensor:
            y = module(x)
            if last:
                if self.loss_fn is None:
                    raise ValueError("the last stage needs a loss_fn")
                y = self.loss_fn(y, self.targets[m]) * self.loss_weights[m]
            return y

        start, end, y = self.clock.time(self.rank, action, earliest, work)
        nbytes = _graph_bytes(y, self._param_ptrs)
        self.saved[s, m] = _Saved(x, y, nbytes)
        self.held_bytes += nbytes
        if last:
            self.losses[m] = float(y.detach())
        else:
            self.transport.send("act", s + 1, m, y.detach(), end)
        ev = Event(self.rank, s, "F", m, start, end, float(nbytes), 0.0)
        self.events.append(ev)
        return ev

    def _do_B(self, action: Action) -> Event:
        s, _, m = action
        saved = self.saved.pop((s, m))
        if s == self.num_stages - 1:
            grad, earliest = None, 0.0
        else:
            grad, t = self._recv("grad", s, m)
            earliest = self._arrival(s + 1, t)

        def work() -> torch.Tensor | None:
            torch.autograd.backward(saved.output, grad_tensors=grad)
            return saved.inputs.grad if s > 0 else None

        start, end, gin = self.clock.time(self.rank, action, earliest, work)
        self.held_bytes -= saved.nbytes
        if s > 0:
            self.transport.send("grad", s - 1, m, gin, end)
        ev = Event(self.rank, s, "B", m, start, end, 0.0, -float(saved.nbytes))
        self.events.append(ev)
        return ev


def _graph_bytes(y: torch.Tensor, exclude: set[int]) -> int:
    """Bytes of tensors the autograd graph of ``y`` keeps for the backward.

    Walks ``y.grad_fn`` and sums the saved tensors it holds (``_saved_*`` attributes), each
    (address, size) counted once and views counted by their own size; parameters
    (storages in ``exclude``) are not counted. This is what F adds to a
    rank's activation memory.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [y.grad_fn] if y.grad_fn is not None else []
    visited: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            try:
                val = getattr(fn, name)
            except RuntimeError:
                continue
            for t in val if isinstance(val, tuple | list) else (val,):
                if isinstance(t, torch.Tensor):
                    if t.untyped_storage().data_ptr() in exclude:
                        continue
                    key = (t.data_ptr(), t.nbytes)
                    if key not in seen:
                        seen.add(key)
                        total += t.nbytes
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return total
