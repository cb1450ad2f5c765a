"""Run cuts of a model for real with the local runtime and time their steps.

Each plan's stages become :class:`~pipebubble.runtime.pipeline.PipelineStage` modules over
the *same* layer objects, and :func:`~pipebubble.runtime.local.run_local` runs one training
step of the plan's schedule with a measured per-stage clock: every action runs for real and
is timed, and each rank's clock advances by those durations, so the step time is what ranks
running in parallel would take (without communication). Plans are run in turn, ``repeats``
times each after a warm-up, and the median step is kept, so slow drift of a shared machine
hits all plans alike.

The clock is the runtime's :class:`~pipebubble.runtime.clock.VirtualClock` (wall time per
action), or with ``timer="cpu"`` (the default on a CPU with one torch thread) the same rules
with each action's *process CPU time*, which other processes on shared cores do not inflate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

import torch
from torch import nn

from ..errors import UserError
from ..runtime.clock import VirtualClock
from ..runtime.local import run_local
from ..runtime.pipeline import PipelineStage
from ..runtime.stages import boundaries_of, split_stages
from ..timeline import Timeline
from .balance import Plan, make_schedule
from .partition import Ranges
from .profile import resolve_timer


@dataclass
class Measurement:
    step_times: list[float]
    timeline: Timeline  # the run with the median step time
    timelines: list[Timeline]  # every measured run, in order

    @property
    def step_time(self) -> float:
        return median(self.step_times)


def stage_modules(layers: Sequence[nn.Module], ranges: Ranges) -> list[PipelineStage]:
    """One PipelineStage per (first_layer, last_layer) range, sharing the layer objects."""
    return split_stages(layers, len(ranges), boundaries_of(ranges))


def measure_plans(
    plans: Sequence[Plan],
    layers: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    repeats: int = 5,
    warmup: int = 1,
    timer: str = "auto",
) -> list[Measurement]:
    """Median measured step time of each plan (``inputs`` is the whole batch of one step)."""
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    cpu = resolve_timer(timer, inputs.device) == "cpu"
    runs: list[list[tuple[float, Timeline]]] = [[] for _ in plans]
    setups = [(stage_modules(layers, p.ranges), make_schedule(p.options)) for p in plans]
    for rep in range(warmup + repeats):
        for i, (stages, schedule) in enumerate(setups):
            clock = VirtualClock(schedule.num_ranks,
                                 timer=time.process_time if cpu else time.perf_counter)
            result = run_local(schedule, stages, inputs, targets, loss_fn, clock)
            for st in stages:
                st.zero_grad(set_to_none=True)
            if rep >= warmup:
                runs[i].append((result.timeline.step_time, result.timeline))
    out = []
    for r in runs:
        ordered = sorted(r, key=lambda x: x[0])
        out.append(Measurement([t for t, _ in r], ordered[len(ordered) // 2][1],
                               [tl for _, tl in r]))
    return out
