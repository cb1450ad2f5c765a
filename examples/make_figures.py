"""Regenerate the README's pictures (``make figures``): Gantt, memory, predicted vs measured,
bubble sweep, plus a Perfetto trace. Everything is drawn by the same code the CLI uses.

    python examples/make_figures.py [OUT_DIR]     # default docs/img

1. ``gantt.png``: ``pipebubble simulate --schedule 1f1b -p 4 -m 8 --png ...``
2. ``memory.png``: GPipe over 1F1B, p=4, m=8, each with its activation memory under it
   (``pipebubble compare -p 4 -m 8 --memory --png ...`` draws every registered schedule).
3. ``predicted_vs_measured.png``: a 4-stage MLP run for real with ``Pipeline`` (1F1B, 8
   microbatches, measured per-stage clock; the fastest of 5 steps after a warm-up), its
   costs calibrated from that step with ``calibrate.costs_from_timeline``, and the
   simulator's prediction drawn above it.
4. ``sweep.png``: ``pipebubble sweep -p 4 -m 1..128 --png ...`` over six schedules (all nine
   crowd the picture; ``pipebubble sweep`` without ``--schedules`` draws every one).
5. Traces to open in https://ui.perfetto.dev: ``trace_1f1b.json`` (``pipebubble simulate
   ... --trace``, 1 unit = 1 ms) and ``predicted_vs_measured.json`` (real durations).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pipebubble import Pipeline, PipelineStage, get_schedule, simulate
from pipebubble.cli import main
from pipebubble.models import mlp
from pipebubble.plan.calibrate import costs_from_timeline
from pipebubble.render.plots import save, timelines_figure
from pipebubble.render.trace import write_trace


def predicted_vs_measured(path: Path, stages: int = 4, microbatches: int = 8) -> None:
    """Run a small MLP for real, calibrate the cost model on it, draw both timelines."""
    torch.set_num_threads(1)
    spec = mlp(layers=2 * stages, width=1024, seed=0)
    modules = [PipelineStage(*spec.layers[2 * s: 2 * s + 2]) for s in range(stages)]
    x, y = spec.make_batch(microbatches * 128, torch.Generator().manual_seed(0))
    pipe = Pipeline(modules, microbatches, "1f1b", loss_fn=spec.loss_fn)
    pipe.step(x, y)  # warm-up: first calls allocate and pick kernels
    runs = []
    for _ in range(5):  # keep the least disturbed of 5 steps (the machine is shared)
        pipe.zero_grad()
        runs.append(pipe.step(x, y).timeline)
    measured = min(runs, key=lambda t: t.step_time)
    predicted = simulate(pipe.schedule, costs_from_timeline(measured))
    labels = ["predicted: simulator with costs calibrated from the run",
              "measured: Pipeline on a 4-stage MLP (CPU, per-stage clock)"]
    fig = timelines_figure([predicted, measured], labels=labels,
                           title=f"1f1b  p={stages} m={microbatches}: predicted vs measured")
    save(fig, path)
    write_trace(path.with_suffix(".json"), [predicted, measured], ["predicted", "measured"])
    print(f"wrote {path}: predicted step {predicted.step_time * 1e3:.3g} ms, "
          f"measured {measured.step_time * 1e3:.3g} ms")


def run(*argv: str) -> None:
    print("pipebubble " + " ".join(argv))
    if main(list(argv)) != 0:
        raise SystemExit(f"failed: pipebubble {' '.join(argv)}")


def make_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    quiet = ["--json"]  # print the JSON contract rather than the terminal chart
    run("simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--png", str(out / "gantt.png"),
        "--trace", str(out / "trace_1f1b.json"), *quiet)
    pair = [simulate(get_schedule(name, 4, 8)) for name in ("gpipe", "1f1b")]
    save(timelines_figure(pair, title="activation memory: GPipe holds m microbatches, 1F1B "
                          "at most p", memory=True), out / "memory.png")
    predicted_vs_measured(out / "predicted_vs_measured.png")
    run("sweep", "-p", "4", "-m", "1..128", "--png", str(out / "sweep.png"),
        "--schedules", "gpipe,1f1b,interleaved-1f1b,zb-h1,zbv,dualpipev",
        "--csv", str(out / "sweep.csv"))
    for name in ("gantt", "memory", "predicted_vs_measured", "sweep"):
        size = (out / f"{name}.png").stat().st_size
        print(f"{name}.png: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    make_all(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img"))
