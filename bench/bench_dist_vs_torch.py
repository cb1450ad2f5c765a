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

A second table is ``run --engine torch`` against ``run --engine pipebubble``: the two
engines of the run command, exactly as it builds them (``Worker``: our stage interpreter over
our P2P transport; ``TorchWorker``: torch's ``PipelineStage`` s and
``_PipelineScheduleRuntime`` running the same order, each compute action timed into our
Timeline), for ``--engines`` schedules (split backward and V placement included), steps
alternating the same way. Ratio = ours / torch's (target <= 1.0).

Run: ``.venv/bin/python bench/bench_dist_vs_torch.py [--width 512] [--microbatches 8]
[--engines gpipe,1f1b,zb-h1,zbv,interleaved-1f1b]``. Asserts nothing; prints the figures.
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
from pipebubble.runtime.dist.worker import Cluster, DistConfig, Env, Worker, build, global_batch

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


def compare_engines(name: str, args: argparse.Namespace, cluster: Cluster):
    """``run --engine pipebubble`` vs ``--engine torch`` on one schedule: as ``compare``."""
    from pipebubble.runtime.torch_engine import TorchWorker

    chunks = 2 if name.startswith("interleaved") else None
    cfg = DistConfig(name, 2, args.microbatches, chunks=chunks, model="mlp",
                     model_args={"layers": args.layers, "width": args.width},
                     microbatch_size=args.microbatch_size, stall_timeout=120.0)
    ours = Worker(cfg, cluster)
    schedule, spec, stages = build(cfg)  # a second copy of the same weights for torch
    x, y = global_batch(cfg, spec)
    theirs = TorchWorker(cfg, cluster, (schedule, spec, stages, x, y))
    _, _, stages2 = build(cfg)  # torch's runtime with nothing of ours around its stages
    bare = TorchWorker(cfg, cluster, (schedule, spec, stages2, x, y), measure=False)
    steps = iter(range(10**9))
    t_ours, t_theirs, t_bare, cpu = [], [], [], []
    for i in range(args.warmup + args.steps):
        c0 = time.process_time()
        a = timed(lambda: ours.step(next(steps), gather=False))
        c1 = time.process_time()
        b = timed(lambda: theirs.step(next(steps), gather=False))
        c2 = time.process_time()
        c = timed(lambda: bare.step(next(steps), gather=False))
        if i >= args.warmup:
            t_ours.append(a)
            t_theirs.append(b)
            t_bare.append(c)
            cpu.append((c1 - c0, c2 - c1))
    # CPU seconds per step summed over the ranks: the work each engine does, which other
    # jobs on a shared machine disturb far less than wall time
    everyone = [None, None] if cluster.g == 0 else None
    dist.gather_object(cpu, everyone, dst=0)
    cpu_ratio = None
    if cluster.g == 0:
        per_step = [(sum(r[i][0] for r in everyone), sum(r[i][1] for r in everyone))
                    for i in range(len(cpu))]
        cpu_ratio = (statistics.median(a for a, _ in per_step),
                     statistics.median(b for _, b in per_step))
    diff = max(float((p.grad - q.grad).abs().max())
               for s in ours.modules
               for p, q in zip(ours.modules[s].parameters(), theirs.modules[s].parameters(),
                               strict=True))
    pairs = sorted(a / b for a, b in zip(t_ours, t_theirs, strict=True))
    bare_pairs = [a / c for a, c in zip(t_ours, t_bare, strict=True)]
    return (statistics.median(t_ours), statistics.median(t_theirs), min(t_ours), min(t_theirs),
            statistics.median(pairs), cpu_ratio, statistics.median(bare_pairs), diff)


def _table(title: str, rows: list) -> None:
    print(title)
    cpu = any(len(t) == 7 for _, t, _ in rows)
    print(f"{'schedule':<17}{'ours':>10}{'torch':>10}{'ratio':>7}   {'best ours':>10}"
          f"{'best torch':>11}{'ratio':>7}   {'median of step ratios':>22}"
          + (f"{'CPU s/step ours':>17}{'torch':>8}{'ratio':>7}{'vs unmeasured':>15}"
             if cpu else "")
          + "  grad diff")
    for name, (a, b, amin, bmin, pair, *rest), diffs in rows:
        extra = ""
        if rest and rest[0] is not None:
            ca, cb = rest[0]
            extra = f"{ca * 1e3:>15.2f}ms{cb * 1e3:>6.1f}ms{ca / cb:>7.3f}{rest[1]:>15.3f}"
        print(f"{name:<17}{a * 1e3:>8.2f}ms{b * 1e3:>8.2f}ms{a / b:>7.3f}   "
              f"{amin * 1e3:>8.2f}ms{bmin * 1e3:>9.2f}ms{amin / bmin:>7.3f}   {pair:>22.3f}"
              f"{extra}  {max(diffs):.2g}")


def worker(args: argparse.Namespace) -> None:
    cluster = Cluster(Env.from_environ(), "gloo", stall_timeout=120.0)
    rows, engine_rows = [], []
    for name, schedule_cls in TORCH.items() if args.torch_schedules else ():
        *times, diff = compare(name, schedule_cls, args, cluster)
        diffs = [None, None] if cluster.g == 0 else None
        dist.gather_object(diff, diffs, dst=0)
        rows.append((name, times, diffs))
    for name in [n for n in args.engines.split(",") if n]:
        *times, diff = compare_engines(name, args, cluster)
        diffs = [None, None] if cluster.g == 0 else None
        dist.gather_object(diff, diffs, dst=0)
        engine_rows.append((name, times, diffs))
    cluster.close()
    if cluster.g == 0 and engine_rows:
        _table("run --engine pipebubble (ours) vs run --engine torch (torch's "
               "_PipelineScheduleRuntime on the same order)", engine_rows)
        print("ratio = ours / torch's (target <= 1.0); CPU: per step, summed over the ranks "
              "(medians); vs unmeasured: the median step ratio against torch's runtime with "
              "no timing wrappers on its stages\n")
    if cluster.g == 0 and args.torch_schedules:
        _table("ours vs torch's ScheduleGPipe / Schedule1F1B", rows)
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
    ap.add_argument("--engines", default="gpipe,1f1b,zb-h1,zbv,interleaved-1f1b",
                    help="schedules for the engine table (comma list; empty: none)")
    ap.add_argument("--no-torch-schedules", dest="torch_schedules", action="store_false",
                    help="skip the table against torch's ScheduleGPipe/Schedule1F1B")
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
