"""Activation memory on real tensors: GPipe vs 1F1B vs 1F1B with recomputation (and split I/W).

For one model cut into p stages and m microbatches, run each schedule for real in one process,
measure the bytes every rank holds for later backward passes, and print the peaks per rank
in bytes and in microbatches (units of the rank's own per-microbatch activations, M_B),
next to what the simulator predicts from costs calibrated on the plain 1F1B run. Then the
price of recomputation: backward time measured vs the cost model's one extra forward.

    python examples/run_memory.py [--model transformer|mlp] [-p 4] [-m 8] [--repeat 5]

GPipe holds m microbatches on every rank; 1F1B at most p - r on rank r; recomputation keeps
only each stage's input per microbatch in flight plus one stage's activations while its
backward runs.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from rich.console import Console
from rich.table import Table

from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.models import build_model
from pipebubble.plan.calibrate import calibrated_costs, stage_times
from pipebubble.runtime.local import run_local
from pipebubble.runtime.stages import split_stages
from pipebubble.schedules import get_schedule
from pipebubble.sim.kernel import simulate


def zb_like(ranks: int, microbatches: int):
    """1F1B with every B split into I then W, and each W delayed to the rank's next F."""
    orders = []
    for order in get_schedule("1f1b", ranks, microbatches).orders:
        out, waiting = [], []
        for a in order:
            if a.kind == "B":
                out.append(Action(a.stage, "I", a.microbatch))
                waiting.append(Action(a.stage, "W", a.microbatch))
            else:
                out.append(a)
                if waiting:
                    out.append(waiting.pop(0))
        orders.append(out + waiting)
    return make_schedule("1f1b-split (I, W later)", orders, ranks, microbatches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer")
    ap.add_argument("-p", "--ranks", type=int, default=4)
    ap.add_argument("-m", "--microbatches", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4, help="samples per microbatch")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    p, m = args.ranks, args.microbatches
    if args.model == "transformer":
        spec = build_model("transformer", layers=2 * p - 2, dim=64, heads=4, vocab=4096, seq=32)
    else:
        spec = build_model("mlp", layers=2 * p, width=256)
    stages = split_stages(spec.layers, p)
    x, y = spec.make_batch(args.rows * m, torch.Generator().manual_seed(0))

    one_f_one_b = get_schedule("1f1b", p, m)
    rows = [
        ("gpipe", get_schedule("gpipe", p, m), False),
        ("1f1b", one_f_one_b, False),
        ("1f1b + recompute", one_f_one_b, True),
        ("1f1b, split I/W", zb_like(p, m), False),
    ]
    # The variants take turns, so a busy spell on a shared machine slows them alike; each
    # keeps its fastest step. The first round is a warm-up.
    results: dict = {}
    for i in range(args.repeat + 1):
        for label, schedule, rec in rows:
            for s in stages:
                s.zero_grad(set_to_none=True)
            r = run_local(schedule, stages, x, y, spec.loss_fn, recompute=rec)
            if i and (label not in results
                      or r.timeline.step_time < results[label].timeline.step_time):
                results[label] = r
    plain = results["1f1b"]
    costs = calibrated_costs(plain.timeline, False, plain.input_bytes)
    m_b = costs.activation_memory
    console = Console()
    console.print(f"[bold]{spec.name}, {len(spec.layers)} layers in {p} stages, {m} microbatches"
                  f" of {args.rows} samples[/bold]; M_B per stage (bytes): "
                  + ", ".join(f"{v:,.0f}" for v in m_b))
    table = Table(title="peak activation memory per rank, measured (predicted), and in "
                  "microbatches of the rank's M_B; step time", show_edge=False)
    table.add_column("schedule")
    for r in range(p):
        table.add_column(f"rank {r}", justify="right")
    table.add_column("step: measured / predicted", justify="right")
    for label, schedule, rec in rows:
        res = results[label]
        if schedule.uses_split_backward():
            # what I keeps for W (M_W) and the I/W times are only known from a split run
            model = calibrated_costs(res.timeline, False, res.input_bytes)
        else:
            model = replace(costs, recompute=rec)
        pred = simulate(schedule, model)
        cells = []
        for r, (peak, ps) in enumerate(zip(res.peak_bytes, pred.rank_stats(), strict=True)):
            cells.append(f"{peak / 2**10:,.0f} KiB ({ps.peak_memory / 2**10:,.0f})"
                         f"\n{peak / m_b[r]:.2f} mb")
        cells.append(f"{res.timeline.step_time * 1e3:.1f} / {pred.step_time * 1e3:.1f} ms")
        table.add_row(label, *cells)
    console.print(table)
    console.print("predicted: the simulator with costs calibrated on the plain 1F1B run "
                  "(recompute=True for the recomputed row); the split row from its own run")

    t_plain = stage_times(plain.timeline)
    t_rec = stage_times(results["1f1b + recompute"].timeline)
    b, f, b_rec = sum(t_plain["B"]), sum(t_plain["F"]), sum(t_rec["B"])
    before, after = plain.peak_bytes, results["1f1b + recompute"].peak_bytes
    console.print("recomputation, peak per rank: " + ", ".join(
        f"{x / 2**10:,.0f} -> {y / 2**10:,.0f} KiB ({y / x - 1:+.0%})"
        for x, y in zip(before, after, strict=True)))
    console.print(
        f"recomputation, backward time (median per stage, summed): {b * 1e3:.2f} ms -> "
        f"{b_rec * 1e3:.2f} ms ({b_rec / b - 1:+.1%}); the cost model adds one forward "
        f"({f * 1e3:.2f} ms): {f / b:+.1%}"
    )


if __name__ == "__main__":
    main()
