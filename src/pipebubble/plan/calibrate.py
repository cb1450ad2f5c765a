"""Calibration: a CostModel from a measured Timeline, so the simulator predicts the same run.

The one place that turns measurements into costs (``run`` and its distributed path, the
planner's rebalance, the benches use it).

**Times.** Per stage: F = median forward time; B = median full-backward time, or median
I + median W when the backward was split; W = median W (0 when never split). Comm is given
by the caller (the distributed run measures it: ``runtime.dist.report.measured_comm``).

>>> from pipebubble import CostModel, get_schedule, simulate
>>> tl = simulate(get_schedule("1f1b", 2, 4), CostModel(f=[1, 2], b=[2, 4], w=[1, 1]))
>>> costs_from_timeline(tl).f
[1.0, 2.0]

**Memory, and the prediction.** A measured Timeline has, per action, its real duration and
the bytes it added or freed. From it we take, per stage, the median F, B (or I and W) times
(:func:`costs_from_timeline`) and the median activation bytes (``M_B``: what F keeps;
``M_W``: what I keeps for W; the stage input, what recomputation keeps), build a CostModel,
and simulate the same schedule. If the simulator models the runtime well, predicted and
measured step time, bubble and memory peaks agree; where they do not, the difference is
what the model leaves out. In the example below, stage 0 keeps its input and tanh's output
(2 x 32 bytes); the last stage also keeps the target for the loss (3 x 32).

With recomputation the measured B (or I) already includes the forward it re-runs; the
calibrated ``b`` takes it out again, since ``CostModel(recompute=True)`` adds it back.

>>> import torch
>>> from torch import nn
>>> from pipebubble import get_schedule
>>> from pipebubble.runtime.local import run_local
>>> stages = [nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(2)]
>>> sched = get_schedule("gpipe", 2, 4)
>>> res = run_local(sched, stages, torch.randn(8, 4), torch.randn(8, 4), nn.functional.mse_loss)
>>> costs = calibrated_costs(res.timeline)
>>> costs.activation_memory    # bytes per microbatch of 2 rows x 4 floats (32 bytes a tensor)
[64.0, 96.0]
>>> predicted = simulate(sched, costs)
>>> [s.peak_memory for s in predicted.rank_stats()] == [float(b) for b in res.peak_bytes]
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from ..costs import CostModel
from ..ir.schedule import Schedule
from ..sim.kernel import simulate
from ..timeline import Timeline


def stage_times(timeline: Timeline) -> dict[str, list[float | None]]:
    """Median duration per (kind, stage); None where the stage never ran that kind."""
    buckets: dict[tuple[str, int], list[float]] = {}
    for e in timeline.events():
        buckets.setdefault((e.kind, e.stage), []).append(e.end - e.start)
    return {
        k: [median(buckets[k, s]) if (k, s) in buckets else None
            for s in range(timeline.num_stages)]
        for k in "FIWB"
    }


def costs_from_timeline(timeline: Timeline, comm: float = 0.0, **memory: object) -> CostModel:
    """A per-stage CostModel that reproduces ``timeline``'s action durations."""
    t = stage_times(timeline)
    f, b, w = [], [], []
    for s in range(timeline.num_stages):
        f.append(t["F"][s] or 0.0)
        if t["I"][s] is not None:
            w_s = t["W"][s] or 0.0
            b.append(t["I"][s] + w_s)
            w.append(w_s)
        else:
            b.append(t["B"][s] or 0.0)
            w.append(min(b[-1], t["W"][s] or 0.0))
    return CostModel(f=f, b=b, w=w, comm=comm, **memory)  # type: ignore[arg-type]


def stage_memory(timeline: Timeline, recompute: bool | Sequence[bool] = False,
                 input_bytes: Sequence[float] | None = None) -> dict[str, list]:
    """Per-stage memory of a measured run, in the CostModel's terms.

    ``activation_memory`` (M_B), ``weight_memory`` (M_W, kept by I for W), ``input_memory``
    (what F keeps with recomputation; from ``input_bytes`` when the run did not recompute),
    ``recompute`` (one flag per stage). Medians over microbatches.
    """
    S = timeline.num_stages
    flags = [recompute] * S if isinstance(recompute, bool) else [bool(x) for x in recompute]
    by: dict[tuple[str, int], list] = {}
    for e in timeline.events():
        by.setdefault((e.kind, e.stage), []).append(e)
    m_b, m_w, m_in = [], [], []
    for s in range(S):
        kept_f = _med([e.mem_start for e in by.get(("F", s), [])])
        if ("I", s) in by:
            w = _med([-e.mem_end for e in by.get(("W", s), [])])
            remat = _med([e.mem_start for e in by["I", s]])
            total = kept_f + remat
            m_w.append(w)
        else:
            remat = _med([e.mem_start for e in by.get(("B", s), [])])
            total = kept_f + remat
            m_w.append(0.0)
        m_b.append(total)
        if flags[s]:
            m_in.append(kept_f)
        else:
            m_in.append(float(input_bytes[s]) if input_bytes is not None else 0.0)
    return {"activation_memory": m_b, "weight_memory": m_w, "input_memory": m_in,
            "recompute": flags}


def calibrated_costs(timeline: Timeline, recompute: bool | Sequence[bool] = False,
                     input_bytes: Sequence[float] | None = None) -> CostModel:
    """A per-stage CostModel (times and memory) that reproduces a measured run."""
    mem = stage_memory(timeline, recompute, input_bytes)
    base = costs_from_timeline(timeline)
    f = list(base.f)  # type: ignore[arg-type]
    b = list(base.b)  # type: ignore[arg-type]
    w = list(base.w)  # type: ignore[arg-type]
    for s, rec in enumerate(mem["recompute"]):
        if rec:  # the measured backward re-ran the forward; the cost model adds it back
            b[s] = max(b[s] - f[s], w[s])
    return CostModel(f=f, b=b, w=w, **mem)


@dataclass
class Prediction:
    """A measured run, its calibrated costs, and the simulator's timeline for them."""

    measured: Timeline
    costs: CostModel
    predicted: Timeline


def predict(schedule: Schedule, measured: Timeline, recompute: bool | Sequence[bool] = False,
            input_bytes: Sequence[float] | None = None) -> Prediction:
    """Calibrate from ``measured`` and simulate ``schedule`` with those costs."""
    costs = calibrated_costs(measured, recompute, input_bytes)
    return Prediction(measured, costs, simulate(schedule, costs))


def _med(xs: list[float]) -> float:
    return float(median(xs)) if xs else 0.0
