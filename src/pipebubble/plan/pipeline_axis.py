"""The pipeline axis: one schedule under one set of per-stage costs, simulated.

This is the only place the planner calls the simulator (DESIGN.md: search scores candidates
with the simulator; closed forms only prune). It answers what the other axes need: when
each rank finishes its last action, each rank's peak activation memory, the pipeline's step
time and bubble. When the simulator's compiled evaluation core lands, only this function
changes.

>>> from pipebubble.costs import CostModel
>>> from pipebubble.schedules import get_schedule
>>> r = run_pipeline(get_schedule("1f1b", 4, 8), CostModel(f=1, b=2))
>>> r.step_time, r.rank_end[0]          # (m + p - 1)(F + B) = 11 x 3
(33.0, 33.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import CostModel
from ..ir.schedule import Schedule
from ..sim.kernel import simulate


@dataclass(frozen=True)
class PipelineRun:
    step_time: float  # first start to last end, over all ranks
    rank_end: list[float]  # per rank: its last action's end, from the step's start
    peak_activations: list[float]  # per rank: the simulated activation peak (bytes)
    bubble_fraction: float


def run_pipeline(schedule: Schedule, costs: CostModel) -> PipelineRun:
    """Simulate ``schedule`` under ``costs`` (:func:`pipebubble.sim.kernel.simulate`)."""
    tl = simulate(schedule, costs)
    t0 = min(tl.start, default=0.0)
    ends = [max(tl.end[tl.offsets[r]:tl.offsets[r + 1]], default=t0) - t0
            for r in range(tl.num_ranks)]
    peaks = [float(st.peak_memory) for st in tl.rank_stats()]
    return PipelineRun(tl.step_time, ends, peaks, tl.bubble_fraction)
