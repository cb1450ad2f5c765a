"""The stage interpreter: one handler per action kind, the same for every schedule.

A rank holds one or more stages (``modules[stage]``; several with interleaved or V-shaped
placement). The interpreter runs one *step* at a time, once its inputs have arrived through
the transport. It never knows which schedule it runs: what a step waits for and where its
output goes is the one rule of :mod:`pipebubble.ir.deps` (``producers``, ``handovers``), and
each kind has one handler in an explicit table (``Kind.F -> _do_forward``, ...), as
DeepSpeed's engine maps each instruction to one ``_exec_*`` method.

- ``F(s, m)``: take the activation (stage 0: the input microbatch), run the stage, keep what
  the backward needs, send the output to stage s+1 (the last stage computes the loss).
- ``B(s, m)``: take the output gradient (last stage: from the loss), backpropagate through
  the stage, accumulate weight gradients, send the input gradient to stage s-1.
- ``I(s, m)``: like B, but compute only the input gradient and send it; keep what W needs
  (``split.py``) and free the rest.
- ``W(s, m)``: the weight gradients of (s, m), from what I kept; nothing is sent.
- An ``Overlap`` of a forward and a backward: both parts start once both inputs are there,
  and run one after the other (one process computes one thing at a time). Both outputs
  are handed over when the pair ends, stamped with its end (``ir/deps.py``: a pair's
  outputs are all ready when the pair ends, as in the simulator and the wire program).

With **recomputation** (activation checkpointing) for a stage, F runs without building the
graph and keeps only its input; B (or I) first re-runs the forward, then backpropagates. It
saves the activations of every microbatch in flight but one and costs one more forward.

Memory, per action, as in DESIGN.md: F adds what it keeps (its graph's saved tensors, or
only its input with recomputation); B frees it; I frees all but what W needs; W frees that.
The bytes are measured (``memory.py``) and go into the Event, so the Timeline's memory
curve of a real run is read like a simulated one. On CUDA the allocator peak is recorded
around every step as well.

Each action is timed by a clock (``clock.py``): a per-rank virtual clock in one process,
real wall time across processes. The interpreter records one Event per action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import UserError
from ..ir.deps import (
    Dep,
    Signal,
    describe_wait,
    ends_chain,
    handovers,
    message,
    producers,
    produces,
    starts_chain,
)
from ..ir.schedule import Action, Kind, Overlap, Step, step_actions
from ..timeline import Event
from ..usercode import USER_FAILURES, UserCodeError, is_ours, layer_in
from .clock import Clock
from .memory import AllocatorPeaks, SavedTensors, param_storages
from .split import WeightWork, backward_input
from .transport import Transport

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class _Saved:
    """What F keeps for the backward of one (stage, microbatch)."""

    inputs: torch.Tensor
    output: torch.Tensor | None  # the stage output (last stage: the scaled loss); None: recompute
    saved: SavedTensors | None  # the graph's saved tensors (None with recomputation)
    nbytes: int  # bytes F added to the rank's activation memory
    rng: tuple | None = None  # RNG state at F, replayed by the recomputation


@dataclass
class StageInterpreter:
    """Runs the steps of the stages that one rank holds.

    ``inputs``/``targets`` are the microbatches (needed only by the rank holding stage 0 /
    the last stage); ``loss_weights[m]`` scales microbatch m's loss so that accumulated
    gradients equal the full-batch gradient of the mean loss. ``recompute`` is one flag for
    all stages or one per stage (indexed by stage). ``device`` turns on CUDA allocator peaks.
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
    recompute: bool | Sequence[bool] = False
    device: torch.device | str | None = None
    chain_starts: Sequence[int] = (0,)  # first stage of each chain (DualPipe: two copies)
    num_microbatches: int = 0  # per chain; chain c's microbatch m is inputs[c * this + m]
    saved: dict[tuple[int, int], _Saved] = field(default_factory=dict)
    kept: dict[tuple[int, int], WeightWork] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    input_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    held_bytes: int = 0
    peak_bytes: int = 0

    def __post_init__(self) -> None:
        self._storages = param_storages(p for m in self.modules.values() for p in m.parameters())
        if isinstance(self.recompute, bool):
            self._recompute = [self.recompute] * self.num_stages
        else:
            self._recompute = [bool(x) for x in self.recompute]
            if len(self._recompute) != self.num_stages:
                raise ValueError(
                    f"recompute has {len(self._recompute)} flags; expected {self.num_stages}"
                )
        self.allocator = AllocatorPeaks(self.device)
        self._outbox: list[tuple[Action, torch.Tensor | None]] | None = None
        self._chain = [sum(1 for c in self.chain_starts if c <= st) - 1
                       for st in range(self.num_stages)]
        self._first = [starts_chain(self, st) for st in range(self.num_stages)]
        self._last = [ends_chain(self, st) for st in range(self.num_stages)]
        # One handler per kind (see the module docstring).
        self._handlers: dict[Kind, Callable[..., Event]] = {
            Kind.F: self._do_forward,
            Kind.B: self._do_backward,
            Kind.I: self._do_input_grad,
            Kind.W: self._do_weight_grad,
        }

    def _mb(self, s: int, m: int) -> int:
        """Index of (stage s's chain, microbatch m) in ``inputs``/``targets``/``losses``."""
        return self._chain[s] * self.num_microbatches + m

    # ---- readiness (the one rule: pipebubble.ir.deps) -----------------------------------
    def ready(self, step: Step) -> bool:
        """True when every producer ``step`` waits for is there (peeks, takes nothing):
        a message from another stage has arrived, F's saved graph exists for its I/B, I's
        kept tensors exist for its W (:func:`~pipebubble.ir.deps.producers`)."""
        return all(self._has(d.signal, a.stage) for a, d in self._deps(step))

    def waits_for(self, step: Step) -> str:
        """What an unready step waits for, in words (for deadlock messages)."""
        done = {d.signal for a, d in self._deps(step) if self._has(d.signal, a.stage)}
        return describe_wait(step, self, done)

    def _deps(self, step: Step) -> Iterator[tuple[Action, Dep]]:
        """(consuming part, dependency) for each producer of each part of ``step``."""
        for a in step_actions(step):
            for d in producers(a, self):
                if not (isinstance(step, Overlap) and d.signal == produces(step.forward)):
                    yield a, d

    def _has(self, signal: Signal, consumer: int) -> bool:
        msg = message(signal, consumer)
        if msg is not None:
            return self._peek(*msg)
        key = (signal.stage, signal.microbatch)
        return key in (self.saved if signal.kind == Kind.F else self.kept)

    def _peek(self, kind: str, s: int, m: int) -> bool:
        peek = getattr(self.transport, "peek", None)
        if peek is not None:
            return peek(kind, s, m)
        return (kind, s, m) in self.transport.pending  # type: ignore[attr-defined]

    # ---- execution ----------------------------------------------------------------------
    def run(self, action: Action) -> Event:
        """Run one action (see :meth:`run_step`)."""
        return self.run_step(action)[0]

    def run_step(self, step: Step) -> list[Event]:
        """Run one step (an Action, or an Overlap's two parts in order); return its Events."""
        with self.allocator:
            if isinstance(step, Overlap):
                fx, fe = self._take(step.forward)
                bx, be = self._take(step.backward)
                t = max(fe, be)
                self._outbox = []  # both parts' outputs leave when the pair ends
                try:
                    events = [self._exec(step.forward, fx, t, step),
                              self._exec(step.backward, bx, t, step)]
                finally:
                    held, self._outbox = self._outbox, None
                for a, tensor in held:
                    self._send(a, tensor, events[-1].end)
                return events
            x, earliest = self._take(step)
            return [self._exec(step, x, earliest, None)]

    def _exec(self, a: Action, x: torch.Tensor | None, earliest: float,
              ov: Overlap | None) -> Event:
        try:
            ev = self._handlers[a.kind](a, x, earliest, ov)
        except UserCodeError as exc:  # the layers' or the loss's: where it happened
            raise exc.at(stage=a.stage, rank=self.rank) from exc.__cause__
        except UserError:
            raise
        except USER_FAILURES as exc:
            if is_ours(exc):  # a bug of ours: its traceback
                raise
            raise self._blame(a, exc) from exc
        self.events.append(ev)
        return ev

    def _blame(self, a: Action, exc: BaseException) -> UserCodeError:
        """The user's code failed in ``a`` (a layer's forward, or the backward through the
        stage): name the layer when its code is on the traceback."""
        s, kind, m = a
        layers = _layers_of(self.modules[s])
        i = layer_in(exc, layers)
        what = (f"layer {i} of stage {s} ({type(layers[i]).__name__})" if i is not None
                else f"the layers of stage {s}")
        phase = {Kind.F: "the forward", Kind.B: "the backward", Kind.I: "the input-gradient "
                 "backward (I)", Kind.W: "the weight-gradient backward (W)"}[kind]
        err = UserCodeError(exc, what, during=f"{phase} of microbatch {m}",
                            stage=s, rank=self.rank)
        err.layer = i  # the caller may name it by the model's own names
        return err

    def _take(self, a: Action) -> tuple[torch.Tensor | None, float]:
        """The tensor ``a`` consumes and the earliest time it may start: the message its
        producer on another stage sent (an F's activation, an I/B's output gradient); the
        input microbatch for a chain's first F; nothing for the loss stage's I/B and W."""
        if a.kind not in self._handlers:
            raise ValueError(f"no handler for action {a}; valid kinds are F, I, W, B")
        s, kind, m = a
        for d in producers(a, self):
            msg = message(d.signal, s)
            if msg is not None:
                return self._recv(*msg, d.crosses)
        if kind == Kind.F:
            return self.inputs[self._mb(s, m)], 0.0
        return None, 0.0

    def _send(self, a: Action, tensor: torch.Tensor | None, end: float) -> None:
        """Hand ``a``'s output to the stages that wait for it (``ir.deps.handovers``)."""
        if self._outbox is not None:  # inside an Overlap: sent at the pair's end
            self._outbox.append((a, tensor))
            return
        kind = "act" if a.kind == Kind.F else "grad"
        for h in handovers(a, self):
            self.transport.send(kind, h.to_stage, a.microbatch, tensor, end)

    def _recv(self, kind: str, s: int, m: int, cross: bool) -> tuple[torch.Tensor, float]:
        got = self.transport.recv(kind, s, m)
        if got is None:
            raise RuntimeError(f"rank {self.rank}: {kind} for stage {s} microbatch {m} missing")
        tensor, t = got
        return tensor, self.clock.arrival(t, cross)

    def _hold(self, delta: int) -> None:
        self.held_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _forward(self, s: int, m: int, x: torch.Tensor) -> torch.Tensor:
        y = self.modules[s](x)
        if not isinstance(y, torch.Tensor):
            raise UserError(f"stage {s} returned a {type(y).__name__} for microbatch {m}; each "
                            "layer must return one tensor (what the next stage receives)")
        if self._last[s]:
            if self.loss_fn is None:
                raise ValueError("the last stage needs a loss_fn")
            g = self._mb(s, m)
            y = self.loss_fn(y, self.targets[g]) * self.loss_weights[g]
        return y

    def _do_forward(self, a: Action, x: torch.Tensor, earliest: float, ov: Overlap | None) -> Event:
        s, _, m = a
        x = x.detach().requires_grad_(not self._first[s] and x.is_floating_point())
        self.input_bytes[s, m] = x.nbytes
        rec = self._recompute[s]
        saved = None if rec else SavedTensors(storages=self._storages)

        def work() -> tuple[torch.Tensor, tuple | None]:
            if rec:
                rng = _rng_state(self.device)
                with torch.no_grad():
                    return self._forward(s, m, x), rng
            with saved:
                return self._forward(s, m, x), None

        start, end, (y, rng) = self.clock.time(self.rank, a, earliest, work, overlapped=ov)
        nbytes = x.nbytes if rec else saved.nbytes  # type: ignore[union-attr]
        self.saved[s, m] = _Saved(x, None if rec else y, saved, nbytes, rng)
        self._hold(nbytes)
        if self._last[s]:
            self.losses[self._mb(s, m)] = float(y.detach())
        self._send(a, y.detach(), end)
        return Event(self.rank, s, "F", m, start, end, float(nbytes), 0.0, ov is not None)

    def _graph(self, s: int, m: int, sv: _Saved) -> tuple[torch.Tensor, SavedTensors | None]:
        """The graph to backpropagate through; with recomputation, run the forward again."""
        if sv.output is not None:
            return sv.output, sv.saved
        saved = SavedTensors(storages=self._storages)
        with _replay_rng(sv.rng, self.device), saved:
            y = self._forward(s, m, sv.inputs)
        return y, saved

    def _do_backward(self, a: Action, grad: torch.Tensor | None, earliest: float,
                     ov: Overlap | None) -> Event:
        s, _, m = a
        sv = self.saved.pop((s, m))
        total = [sv.nbytes]

        def work() -> torch.Tensor | None:
            y, saved = self._graph(s, m, sv)
            if saved is not None:
                total[0] = saved.nbytes
            if y.requires_grad:  # else no graph: a first stage without trainable parameters
                torch.autograd.backward(y, grad_tensors=grad)
            if saved is not None:
                saved.free()
            return sv.inputs.grad if sv.inputs.requires_grad else None

        start, end, gin = self.clock.time(self.rank, a, earliest, work, overlapped=ov)
        extra = total[0] - sv.nbytes if sv.output is None else 0  # re-materialised by recompute
        self._hold(extra)
        self._hold(-(sv.nbytes + extra))
        self._send(a, gin, end)
        return Event(self.rank, s, "B", m, start, end, float(extra), -float(sv.nbytes + extra),
                     ov is not None)

    def _do_input_grad(self, a: Action, grad: torch.Tensor | None, earliest: float,
                       ov: Overlap | None) -> Event:
        s, _, m = a
        sv = self.saved.pop((s, m))
        total = [sv.nbytes]

        def work() -> tuple[torch.Tensor | None, WeightWork]:
            y, saved = self._graph(s, m, sv)
            if saved is not None:
                total[0] = saved.nbytes
            return backward_input(y, grad, sv.inputs, saved, where=f"stage {s}")

        start, end, (gin, kept) = self.clock.time(self.rank, a, earliest, work, overlapped=ov)
        extra = total[0] - sv.nbytes if sv.output is None else 0
        self.kept[s, m] = kept
        self._hold(extra)
        freed = sv.nbytes + extra - kept.nbytes
        self._hold(-freed)
        self._send(a, gin, end)
        return Event(self.rank, s, "I", m, start, end, float(extra), -float(freed), ov is not None)

    def _do_weight_grad(self, a: Action, _: object, earliest: float, ov: Overlap | None) -> Event:
        s, _k, m = a
        kept = self.kept.pop((s, m))
        start, end, _r = self.clock.time(self.rank, a, earliest, kept.run, overlapped=ov)
        self._hold(-kept.nbytes)
        return Event(self.rank, s, "W", m, start, end, 0.0, -float(kept.nbytes), ov is not None)


def _layers_of(stage: nn.Module) -> list[nn.Module]:
    """The layers of a stage (a PipelineStage's, or the stage itself)."""
    inner = getattr(stage, "layers", None)
    return list(inner) if isinstance(inner, nn.Sequential) else [stage]


def _cuda(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    dev = torch.device(device)
    return dev if dev.type == "cuda" else None


def _rng_state(device: torch.device | str | None) -> tuple:
    dev = _cuda(device)
    return torch.get_rng_state(), (torch.cuda.get_rng_state(dev) if dev is not None else None)


@contextmanager
def _replay_rng(state: tuple | None, device: torch.device | str | None) -> Iterator[None]:
    """Run the recomputation with the RNG state the forward saw (dropout masks match)."""
    dev = _cuda(device)
    with torch.random.fork_rng(devices=[dev] if dev is not None else [],
                               enabled=state is not None):
        if state is not None:
            torch.set_rng_state(state[0])
            if dev is not None:
                torch.cuda.set_rng_state(state[1], dev)
        yield
