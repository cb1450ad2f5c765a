"""The lesson's program: ``PipelineStage`` and ``Pipeline``.

>>> import torch
>>> from torch import nn
>>> from pipebubble import CostModel, bubble_fraction
>>> stages = [PipelineStage(nn.Linear(4, 4)) for _ in range(4)]
>>> pipe = Pipeline(stages, num_microbatches=8, costs=CostModel(f=1, b=2))
>>> result = pipe.step(torch.randn(16, 4), torch.randn(16, 4))
>>> round(result.timeline.bubble_fraction, 4), round(bubble_fraction(4, 8), 4)
(0.2727, 0.2727)

With ``costs=CostModel(f=1, b=2)`` the per-stage clock uses the cost model and the bubble
equals the closed form (N-1)/(M+N-1) exactly; with ``costs=None`` durations are measured.

Any registered schedule runs, with ``chunks`` stages per rank where it takes several:
``Pipeline(stages, 8, schedule="interleaved-1f1b", chunks=2)`` over 8 stages is 4 ranks.
``stages`` are one model cut into ``ranks x chunks`` pieces; a schedule with two chains
(DualPipe's two model copies) runs a copy of them as its second chain:
``Pipeline(stages, 8, schedule="dualpipe")`` over 4 stages is 4 ranks and 8 stages.
``recompute=True`` checkpoints every stage (F keeps only its input).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn

from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import Schedule
from ..schedules import FIRST, get_schedule
from .clock import VirtualClock
from .interpreter import LossFn
from .local import LocalResult, run_local


class PipelineStage(nn.Module):
    """One stage of the model: a contiguous slice of layers, ``forward(activation)``."""

    def __init__(self, *layers: nn.Module):
        super().__init__()
        if not layers:
            raise UserError("a PipelineStage needs at least one layer")
        self.layers = nn.Sequential(*layers)

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        return self.layers(activation)


class Pipeline:
    """Run ``stages`` as a pipeline over ``num_microbatches`` microbatches in one process.

    ``schedule`` is a registered name (``gpipe``, ``1f1b``, ...) or a Schedule. Each stage
    keeps its own clock: durations are measured, or taken from ``costs`` when given.
    After ``step`` the stages' ``.grad`` hold the gradient of the mean loss over the batch.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        num_microbatches: int,
        schedule: str | Schedule = FIRST,
        loss_fn: LossFn | None = None,
        costs: CostModel | None = None,
        chunks: int | None = None,
        recompute: bool | Sequence[bool] = False,
        device: torch.device | str | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ):
        if not stages:
            raise UserError("Pipeline needs at least one stage")
        if num_microbatches < 1:
            raise UserError(f"num_microbatches must be >= 1, got {num_microbatches}")
        self.stages = list(stages)
        self.num_microbatches = num_microbatches
        if isinstance(schedule, Schedule):
            self.schedule = schedule
        else:
            v = chunks or 1
            if len(self.stages) % v:
                raise UserError(f"{len(self.stages)} stages do not split into {v} chunks per rank")
            self.schedule = get_schedule(schedule, len(self.stages) // v, num_microbatches, chunks)
        S, chains = self.schedule.num_stages, self.schedule.chains
        if len(self.stages) not in (S, S // chains):
            per = f" or {S // chains} (one model copy per chain)" if chains > 1 else ""
            raise UserError(
                f"schedule {self.schedule.name} has {S} stages, got {len(self.stages)} "
                f"modules; expected {S}{per}"
            )
        self.loss_fn = loss_fn or nn.functional.mse_loss
        self.costs = costs
        self.recompute = recompute
        self.device = device
        self.timer = timer  # time.process_time: CPU time, immune to other processes

    def zero_grad(self) -> None:
        for stage in self.stages:
            stage.zero_grad(set_to_none=True)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> LocalResult:
        """Forward and backward over all microbatches; gradients accumulate in the stages."""
        sc = None
        if self.costs is not None:
            costs = self.costs
            if self.recompute is not False and costs.recompute is False:
                costs = replace(costs, recompute=self.recompute)
            sc = costs.resolve(self.schedule.num_stages, self.schedule.chunks)
        clock = VirtualClock(self.schedule.num_ranks, sc, device=self.device, timer=self.timer)
        return run_local(self.schedule, self.stages, inputs, targets, self.loss_fn, clock,
                         recompute=self.recompute, device=self.device)

    @staticmethod
    def trace(result: LocalResult) -> list[str]:
        """One line per microbatch: when each stage ran its F and its backward."""
        tl = result.timeline
        rows: dict[int, list[str]] = {}
        for e in sorted(tl.events(), key=lambda e: (e.microbatch, e.kind != "F", e.start)):
            rows.setdefault(e.microbatch, []).append(
                f"{e.stage}{e.kind}@{e.start:.3g}-{e.end:.3g}"
            )
        return [f"mb {m}: " + " ".join(rows[m]) for m in sorted(rows)]
