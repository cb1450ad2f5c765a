"""The local executor: every stage in one process, any Schedule.

Ranks take turns: each runs its next steps while their inputs have arrived through the
in-process transport, exactly as separate processes would, so the same interpreter serves
both. A sweep in which no rank can run is a deadlock and raises (it never hangs).

Any valid Schedule runs: F/B, split backward (I then W), overlapped F&B pairs, several
stages per rank with loop or V placement (``schedule.stage_to_rank`` decides which rank
holds a stage). With ``recompute`` the chosen stages keep only their input in F and re-run
the forward in the backward.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

import torch
from torch import nn

from ..errors import UserError
from ..ir.schedule import Schedule, validate
from ..sim.kernel import Deadlock
from ..timeline import Timeline
from .clock import Clock, VirtualClock
from .interpreter import LossFn, StageInterpreter
from .transport import LocalTransport


@dataclass
class LocalResult:
    """One measured step: the Timeline (memory included), the loss, the interpreters.

    ``peak_bytes[r]``: the most activation bytes rank r held for later backward passes.
    ``allocator_peak``: on CUDA, ``torch.cuda.max_memory_allocated`` over the step (the whole
    device's: in one process every rank shares it); None on CPU.
    """

    timeline: Timeline
    loss: float
    losses: list[float]
    interpreters: list[StageInterpreter]

    @property
    def peak_bytes(self) -> list[int]:
        return [it.peak_bytes for it in self.interpreters]

    @property
    def input_bytes(self) -> list[float]:
        """Per stage, the median bytes of its input microbatch (what recomputation keeps)."""
        per: dict[int, list[int]] = {}
        for it in self.interpreters:
            for (s, _), n in it.input_bytes.items():
                per.setdefault(s, []).append(n)
        return [float(median(per[s])) for s in sorted(per)]

    @property
    def allocator_peak(self) -> int | None:
        peaks = [it.allocator.peak for it in self.interpreters if it.allocator.peak is not None]
        return max(peaks) if peaks else None


def split_microbatches(batch: torch.Tensor, num_microbatches: int) -> list[torch.Tensor]:
    """Split along dim 0 into ``num_microbatches`` pieces (sizes differ by at most one)."""
    if num_microbatches < 1:
        raise UserError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if batch.shape[0] < num_microbatches:
        raise UserError(
            f"batch of {batch.shape[0]} cannot be split into {num_microbatches} microbatches; "
            f"use at most {batch.shape[0]}"
        )
    return list(torch.tensor_split(batch, num_microbatches, dim=0))


def run_local(
    schedule: Schedule,
    modules: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    clock: Clock | None = None,
    recompute: bool | Sequence[bool] = False,
    device: torch.device | str | None = None,
) -> LocalResult:
    """Run one training step of ``schedule``; gradients accumulate in the modules' ``.grad``.

    ``modules[s]`` is stage s. The loss is the mean over the batch: microbatch m's loss is
    weighted by its share of the batch, so gradients equal the unsplit model's. With several
    chains (DualPipe), give one module per stage of one chain: the other chains run deep
    copies (chain c's first microbatches come after chain c-1's), and after the step each
    copy's gradients are added into the original's, as DualPipe's copies synchronise theirs.
    ``recompute`` is one flag or one per stage. ``device`` (CUDA) adds allocator peaks and
    synchronised timing; the modules and tensors must already live there.
    """
    validate(schedule)
    modules, copies = _with_copies(schedule, modules)
    M = schedule.num_microbatches
    xs = split_microbatches(inputs, schedule.total_microbatches)
    ys = split_microbatches(targets, schedule.total_microbatches)
    total = inputs.shape[0]
    weights = [x.shape[0] / total for x in xs]
    clock = clock or VirtualClock(schedule.num_ranks, device=device)
    transport = LocalTransport()
    interps = []
    for r in range(schedule.num_ranks):
        mine = {s: modules[s] for s in range(schedule.num_stages) if schedule.stage_to_rank[s] == r}
        interps.append(
            StageInterpreter(
                rank=r, modules=mine, num_stages=schedule.num_stages,
                stage_to_rank=schedule.stage_to_rank, transport=transport, clock=clock,
                inputs=xs, targets=ys, loss_fn=loss_fn, loss_weights=weights,
                recompute=recompute, device=device, chain_starts=schedule.chain_starts,
                num_microbatches=M,
            )
        )
    orders = [list(schedule.orders[r]) for r in range(schedule.num_ranks)]
    ptr = [0] * schedule.num_ranks
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = 0
        for r, interp in enumerate(interps):
            order = orders[r]
            while ptr[r] < len(order) and interp.ready(order[ptr[r]]):
                interp.run_step(order[ptr[r]])
                ptr[r] += 1
                progressed += 1
        if not progressed:
            stuck = {
                r: (str(orders[r][ptr[r]]), interps[r].waits_for(orders[r][ptr[r]]))
                for r in range(schedule.num_ranks) if ptr[r] < len(orders[r])
            }
            raise Deadlock(stuck)
        remaining -= progressed
    events = [e for it in interps for e in it.events]
    timeline = Timeline.from_events(
        events, schedule=schedule.name, num_ranks=schedule.num_ranks,
        num_stages=schedule.num_stages, num_microbatches=M,
        stage_to_rank=schedule.stage_to_rank, source=getattr(clock, "source", "measured"),
        shift_to_zero=False, chain_starts=schedule.chain_starts,
    )
    _sum_copy_grads(copies)
    losses_by_mb = {m: v for it in interps for m, v in it.losses.items()}
    losses = [losses_by_mb[m] for m in range(schedule.total_microbatches)]
    return LocalResult(timeline, sum(losses), losses, interps)


def _with_copies(schedule: Schedule, modules: Sequence[nn.Module]):
    """Modules for every stage, plus (original, copy) pairs when chains share a model."""
    S, chains = schedule.num_stages, schedule.chains
    if len(modules) == S:
        return list(modules), []
    per = S // chains
    equal = all(b - a == per for a, b in zip(schedule.chain_starts,
                                               [*schedule.chain_starts[1:], S], strict=True))
    if chains > 1 and equal and len(modules) == per:
        copies = [copy.deepcopy(m) for _ in range(chains - 1) for m in modules]
        pairs = [(modules[i % per], c) for i, c in enumerate(copies)]
        return list(modules) + copies, pairs
    valid = f"{S}" if chains == 1 else f"{S} (one per stage) or {per} (one per stage of a chain)"
    raise UserError(f"schedule has {S} stages but {len(modules)} modules given; expected {valid}")


def _sum_copy_grads(pairs: list[tuple[nn.Module, nn.Module]]) -> None:
    for orig, dup in pairs:
        for p, q in zip(orig.parameters(), dup.parameters(), strict=True):
            if q.grad is None:
                continue
            p.grad = q.grad.clone() if p.grad is None else p.grad + q.grad
