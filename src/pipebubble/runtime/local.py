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

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

import torch
from torch import nn

from ..schedule import Schedule, validate
from ..simulate import Deadlock
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
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if batch.shape[0] < num_microbatches:
        raise ValueError(
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
    weighted by its share of the batch, so gradients equal the unsplit model's. ``recompute``
    is one flag or one per stage. ``device`` (CUDA) adds allocator peaks and synchronised
    timing; the modules and tensors must already live there.
    """
    validate(schedule)
    if len(modules) != schedule.num_stages:
        raise ValueError(
            f"schedule has {schedule.num_stages} stages but {len(modules)} modules given"
        )
    M = schedule.num_microbatches
    xs = split_microbatches(inputs, M)
    ys = split_microbatches(targets, M)
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
                recompute=recompute, device=device,
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
        shift_to_zero=False,
    )
    losses_by_mb = {m: v for it in interps for m, v in it.losses.items()}
    losses = [losses_by_mb[m] for m in range(M)]
    return LocalResult(timeline, sum(losses), losses, interps)
