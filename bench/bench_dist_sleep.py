"""Timing fidelity of the distributed runtime: measured vs simulated, sleep workload, 4 ranks.

Four processes (gloo, CPU) run every registered schedule that has a 4-rank form (gpipe,
1f1b, interleaved-1f1b, zb-h1, ... whatever the registry holds) on the sleep workload: each
stage sleeps F, I = B - W and W seconds (per rank-share F = 40 ms, B = 80 ms, W = 40 ms,
split over the chunks), so timing is not disturbed by a 2-core machine. The simulator
predicts the step time and bubble for exactly these costs; the bench prints the measured
figures (the fastest of ``--repeat`` steps, after one warm-up) beside the prediction.
Target: within 10 % for gpipe, 1f1b, interleaved and zb-h1.

Run: ``.venv/bin/python bench/bench_dist_sleep.py [--microbatches 8] [--repeat 3]``.
Asserts nothing (timings depend on the machine); prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys

from pipebubble import CostModel, get_schedule, schedule_names, simulate
from pipebubble.ir.schedule import ScheduleError
from pipebubble.runtime.dist.launch import launch, under_launcher
from pipebubble.runtime.dist.report import measured_comm, measured_timeline, step_span
from pipebubble.runtime.dist.worker import Cluster, DistConfig, Env, Worker

RANKS = 4
F, B, W = 0.040, 0.080, 0.040


def configs(m: int) -> list[tuple[str, object]]:
    out = []
    for name in schedule_names():
        try:
            out.append((name, get_schedule(name, RANKS, m)))
        except ScheduleError:
            continue
    return out


def worker(args: argparse.Namespace) -> None:
    cluster = Cluster(Env.from_environ(), "gloo", stall_timeout=60.0)
    rows = []
    for name, sched in configs(args.microbatches):
        v = sched.chunks
        # each layer (one per stage of a chain) sleeps what the simulator charges its stage
        sc = CostModel(f=F, b=B, w=W).resolve(sched.num_stages, sched.chunks)
        per = sched.num_stages // sched.chains
        cfg = DistConfig(name, RANKS, args.microbatches, model="sleep",
                         model_args={"layers": per, "f": sc.f[:per], "b": sc.b[:per],
                                     "w": sc.w[:per], "width": 4},
                         microbatch_size=1, stall_timeout=60.0)
        w = Worker(cfg, cluster)
        best = None
        for i in range(1 + args.repeat):
            got = w.step(i, gather=i >= 1)
            if got is not None and (best is None or step_span(got) < step_span(best)):
                best = got
        if cluster.g == 0:
            tl, _ = measured_timeline(sched, best)
            pred = simulate(sched, CostModel(f=F, b=B, w=W))
            comm = measured_comm(tl)
            with_comm = simulate(sched, CostModel(f=F, b=B, w=W, comm=comm))
            rows.append((name, v, tl, pred, with_comm, comm))
    cluster.close()
    if cluster.g == 0:
        table(rows)


def table(rows) -> None:
    print(f"{'schedule':<17}{'v':>2} {'step meas.':>11}{'pred.':>9}{'ratio':>7} "
          f"{'bubble meas.':>13}{'pred.':>8}{'ratio':>7}{'diff':>9}   "
          f"{'delay':>7}{'with it':>10}{'bubble':>8}")
    worst = worst_b = 0.0
    for name, v, tl, pred, wc, comm in rows:
        rs = tl.step_time / pred.step_time
        rb = tl.bubble_fraction / pred.bubble_fraction if pred.bubble_fraction else float("nan")
        worst = max(worst, abs(rs - 1))
        worst_b = max(worst_b, abs(tl.bubble_fraction - pred.bubble_fraction))
        print(f"{name:<17}{v:>2} {tl.step_time * 1e3:>9.1f}ms{pred.step_time * 1e3:>7.1f}ms"
              f"{rs:>7.3f} {tl.bubble_fraction:>13.2%}{pred.bubble_fraction:>8.2%}{rb:>7.3f}"
              f"{(tl.bubble_fraction - pred.bubble_fraction) * 100:>+7.2f}pt   "
              f"{comm * 1e3:>5.2f}ms{wc.step_time * 1e3:>8.1f}ms{wc.bubble_fraction:>8.2%}")
    print(f"largest step-time deviation from the prediction: {worst:.1%} (target <= 10%); "
          f"largest bubble difference: {worst_b * 100:.2f} points")
    print("delay: the median delay of a message whose receiver was already waiting; 'with "
          "it': the prediction with that delay per hop")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    if under_launcher():
        worker(args)
        sys.stdout.flush()
        os._exit(0)
    print(f"sleep workload, {RANKS} ranks (gloo), m={args.microbatches}, per rank-share "
          f"F={F * 1e3:g} ms B={B * 1e3:g} ms W={W * 1e3:g} ms; fastest of {args.repeat} "
          f"steps; scheduled: {', '.join(n for n, _ in configs(args.microbatches))}", flush=True)
    return launch([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], RANKS)


if __name__ == "__main__":
    raise SystemExit(main())
