"""The lesson's demo: a 4-stage MLP pipeline, 8 microbatches, GPipe.

Prints the per-microbatch trace (when each stage ran F and B for it), the stage x time Gantt
chart, and the bubble beside the closed form (N-1)/(M+N-1) = 27.27%.

Two clocks time the same real run. The *cost-model* clock gives every stage F=1, B=2, so
the bubble equals the closed form exactly. The *measured* clock uses each action's real
duration on this machine, so the bubble is close to the closed form when stages are equal.
"""

from __future__ import annotations

import torch
from rich.console import Console
from torch import nn

from .costs import CostModel
from .formulas import bubble_fraction
from .render.terminal import gantt
from .runtime.pipeline import Pipeline, PipelineStage


def build_stages(num_stages: int = 4, width: int = 256, seed: int = 0) -> list[PipelineStage]:
    """Equal stages: Linear -> GELU -> Linear, the same compute on every stage."""
    torch.manual_seed(seed)
    return [
        PipelineStage(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        for _ in range(num_stages)
    ]


def run_demo(
    num_stages: int = 4,
    num_microbatches: int = 8,
    schedule: str = "gpipe",
    console: Console | None = None,
) -> dict:
    """Run the demo, print it, return the figures."""
    console = console or Console()
    torch.set_num_threads(1)
    width = 256
    stages = build_stages(num_stages, width)
    x = torch.randn(num_microbatches * 32, width)
    y = torch.randn(num_microbatches * 32, width)
    closed = bubble_fraction(num_stages, num_microbatches)

    modelled = Pipeline(stages, num_microbatches, schedule, costs=CostModel(f=1, b=2)).step(x, y)
    Pipeline(stages, num_microbatches, schedule).step(x, y)  # warm-up for the measured clock
    for st in stages:
        st.zero_grad()
    measured = Pipeline(stages, num_microbatches, schedule).step(x, y)

    console.print(f"[bold]{schedule}: {num_stages} stages, {num_microbatches} microbatches[/bold]"
                  f"  (loss {measured.loss:.4f})\n")
    console.print("[bold]Per-microbatch trace[/bold] "
                  "(cost-model clock, F=1 B=2: stage+kind@start-end)")
    for line in Pipeline.trace(modelled):
        console.print("  " + line)
    console.print()
    console.print(gantt(modelled.timeline, title="Gantt chart, cost-model clock (F=1, B=2)"))
    console.print()
    console.print(gantt(measured.timeline, title="Gantt chart, measured clock (real durations)"))
    console.print()
    b_model = modelled.timeline.bubble_fraction
    b_meas = measured.timeline.bubble_fraction
    console.print(f"measured bubble {b_model:.2%} (closed form {closed:.2%})"
                  "   per-stage clock from the cost model, F=1 B=2")
    console.print(f"measured bubble {b_meas:.2%} (closed form {closed:.2%})"
                  f"   per-stage clock from real durations, step "
                  f"{measured.timeline.step_time * 1e3:.2f} ms (real stages are not exactly "
                  "equal: the last one also computes the loss)")
    return {"closed_form": closed, "bubble_cost_clock": b_model, "bubble_measured": b_meas}
