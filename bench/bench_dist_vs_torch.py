"""Our distributed runtime against torch.distributed.pipelining, same run, same everything.

Two processes (gloo, CPU, one torch thread each) hold the two halves of the same MLP
(``--layers`` Linear+GELU blocks of width ``--width``). For GPipe and 1F1B, the same batch
split into the same ``--microbatches`` goes through

- ours: the stage interpreter with the P2P transport (``--p2p batched``), and
- torch's: ``torch.distributed.pipelining.PipelineStage`` with ``ScheduleGPipe`` /
  ``Schedule1F1B``,

alternately, step after step, so both see the same machine load. A step is timed from a
barrier to a barrier on rank 0; we report the medians over ``--steps`` steps (after
warm-up), the fastest steps, and the median of the per-step ratios ours / torch's (each
pair of steps ran back to back, so it sees the same load). Target: <= 1.0. The gradients
of the two are compared too (they must agree: same model, same loss, mean over the
batch).

Run: ``.venv/bin/python bench/bench_dist_vs_torch.py [--width 512] [--microbatches 8]``.
Asserts nothing; prints the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from pipebubble.runtime.dist.launch import launch, under_launcher
from pipebubble.runtime.dist.worker import Cluster, DistConfig, Env, Worker, build

TORCH = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def compare(name: str, schedule_cls, args: argparse.Namespace, cluster: Cluster):
    """(median ours, median torch's, this rank's largest gradient difference)."""
    g = cluster.g
    cfg = DistConfig(name, 2, args.microbatches, model="mlp",
                     model_args={"layers": args.layers, "width": args.width},
                     microbatch_size=args.microbatch_size, stall_timeout=120.0)
    ours = Worker(cfg, cluster)
    _, spec, stages = build(cfg)  # a second copy of the same weights for torch
    mod = stages[g]
    sched = schedule_cls(PipelineStage(mod, g, 2, torch.device("cpu")), args.microbatches,
                         loss_fn=spec.loss_fn)
    x, y = torch.cat(ours.xs), torch.cat(ours.ys)
    steps = iter(range(10**9))

    def theirs() -> None:
        mod.zero_grad(set_to_none=True)
        if g == 0:
            sched.step(x)
        else:
            sched.step(target=y)

    def mine() -> None:
        ours.step(next(steps), gather=False)

    t_ours, t_theirs = [], []
    for i in range(args.warmup + args.steps):
        a, b = timed(mine), timed(theirs)
        if i >= args.warmup:
            t_ours.append(a)
            t_theirs.append(b)
    diff = max(float((p.grad - q.grad).abs().max())
               for p, q in zip(ours.modules[g].parameters(), mod.parameters(), strict=True))
    pairs = sorted(a / b for a, b in zip(t_ours, t_theirs, strict=True))
    return (statistics.median(t_ours), statistics.median(t_theirs), min(t_ours), min(t_theirs),
            statistics.median(pairs), diff)


def worker(args: argparse.Namespace) -> None:
    cluster = Cluster(Env.from_environ(), "gloo", stall_timeout=120.0)
    rows = []
    for name, schedule_cls in TORCH.items():
        *times, diff = compare(name, schedule_cls, args, cluster)
        diffs = [None, None] if cluster.g == 0 else None
        dist.gather_object(diff, diffs, dst=0)
        rows.append((name, times, diffs))
    cluster.close()
    if cluster.g == 0:
        print(f"{'schedule':<9}{'ours':>10}{'torch':>10}{'ratio':>7}   {'best ours':>10}"
              f"{'best torch':>11}{'ratio':>7}   {'median of step ratios':>22}  grad diff")
        for name, (a, b, amin, bmin, pair), diffs in rows:
            print(f"{name:<9}{a * 1e3:>8.2f}ms{b * 1e3:>8.2f}ms{a / b:>7.3f}   "
                  f"{amin * 1e3:>8.2f}ms{bmin * 1e3:>9.2f}ms{amin / bmin:>7.3f}   {pair:>22.3f}"
                  f"  {max(diffs):.2g}")
        print("ratio = ours / torch's (target <= 1.0); medians over the steps, then the "
              "fastest steps, then the median of the per-step ratios (each pair ran back to "
              "back)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    if under_launcher():
        worker(args)
        sys.stdout.flush()
        os._exit(0)
    print(f"2 ranks (gloo), MLP {args.layers} x width {args.width}, m={args.microbatches} "
          f"microbatches of {args.microbatch_size}; median of {args.steps} steps, alternating",
          flush=True)
    return launch([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], 2)


if __name__ == "__main__":
    raise SystemExit(main())
