"""What the runtime's choices cost, as ratios against a baseline timed in the same run.

1. Split backward: I followed by W vs the fused B, per stage (zero-bubble schedules pay this
   to move W into bubbles; the target is a ratio close to 1).
2. Recomputation: the backward with a re-run forward vs the plain backward; the cost model
   says (F + B) / B.
3. The local executor's overhead: the busy time of a pipelined step (1F1B) vs the same
   forwards and backwards in a plain loop over microbatches, no schedule.

Each figure is the minimum over repeats (the run least disturbed by other work).

    python bench/bench_runtime.py [--model transformer] [--width 1024] [--repeat 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.models import mlp, transformer
from pipebubble.plan.calibrate import stage_times
from pipebubble.runtime.local import run_local
from pipebubble.runtime.stages import split_stages
from pipebubble.schedules import get_schedule


def split_1f1b(ranks: int, microbatches: int):
    """1F1B with every B replaced by I then W (same order otherwise)."""
    base = get_schedule("1f1b", ranks, microbatches)
    orders = []
    for order in base.orders:
        out = []
        for a in order:
            if a.kind == "B":
                out += [Action(a.stage, "I", a.microbatch), Action(a.stage, "W", a.microbatch)]
            else:
                out.append(a)
        orders.append(out)
    return make_schedule("1f1b-split", orders, ranks, microbatches)


def best(fn, repeat: int):
    """The fastest of ``repeat`` runs of fn() (its result and seconds)."""
    out, t_best = None, float("inf")
    for _ in range(repeat):
        r = fn()
        t = r.timeline.step_time if hasattr(r, "timeline") else r[1]
        if t < t_best:
            out, t_best = r, t
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", help="mlp or transformer (dim = --width)")
    ap.add_argument("--width", type=int, default=None, help="mlp width (512) / dim (64)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--rows", type=int, default=32, help="samples per microbatch (mlp)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    p, m = args.ranks, args.microbatches
    if args.model == "transformer":
        spec = transformer(layers=2 * p - 2, dim=args.width or 64, vocab=4096, seq=32)
        args.rows = min(args.rows, 4)
    else:
        spec = mlp(2 * p, args.width or 512)
    stages = split_stages(spec.layers, p)
    x, y = spec.make_batch(args.rows * m, torch.Generator().manual_seed(0))

    def step(schedule, recompute=False):
        def go():
            for s in stages:
                s.zero_grad(set_to_none=True)
            return run_local(schedule, stages, x, y, spec.loss_fn, recompute=recompute)
        go()  # warm-up
        return best(go, args.repeat)

    def total(t, kinds):
        return sum(v for k in kinds for v in t[k] if v is not None)

    fused = stage_times(step(get_schedule("1f1b", p, m)).timeline)
    split = stage_times(step(split_1f1b(p, m)).timeline)
    rec = stage_times(step(get_schedule("1f1b", p, m), recompute=True).timeline)
    b = total(fused, "B")
    print(f"{spec.name} width {args.width or 'default'}, {p} stages x 2 layers, {m} "
          f"microbatches of {args.rows} samples"
          f" (median per stage, summed; best of {args.repeat} steps)")
    print(f"1. split backward: (I + W) / B = {total(split, 'IW') / b:.3f}"
          f"   (I {total(split, 'I') * 1e3:.3f} ms + W {total(split, 'W') * 1e3:.3f} ms"
          f" vs B {b * 1e3:.3f} ms)")
    f = total(fused, "F")
    print(f"2. recomputation: B' / B = {total(rec, 'B') / b:.3f}"
          f"   (cost model (F + B) / B = {(f + b) / b:.3f})")

    def plain_loop():
        for s in stages:
            s.zero_grad(set_to_none=True)
        model = torch.nn.Sequential(*stages)
        t0 = time.perf_counter()
        for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m), strict=True):
            (spec.loss_fn(model(xm), ym) / m).backward()
        return None, time.perf_counter() - t0

    plain_loop()
    _, t_plain = best(plain_loop, args.repeat)
    piped = step(get_schedule("1f1b", p, m)).timeline
    busy = sum(s.busy for s in piped.rank_stats())
    print(f"3. executor overhead: pipelined busy time / plain loop = {busy / t_plain:.3f}"
          f"   ({busy * 1e3:.3f} ms vs {t_plain * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
