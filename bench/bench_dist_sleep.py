"""Timing fidelity of the distributed runtime: measured vs simulated, sleep workload, 4 ranks.

Four processes (gloo, CPU) run every registered schedule that has a 4-rank form (gpipe,
1f1b, interleaved-1f1b, zb-h1, ... whatever the registry holds) on the sleep workload: each
stage sleeps F, I = B - W and W seconds (per rank-share F = 20 ms, B = 40 ms, W = 20 ms,
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
from pipebubble.runtime.distributed import Cluster, DistConfig, Env, Worker
from pipebubble.runtime.launch import launch, under_launcher
from pipebubble.runtime.report import measured_timeline, step_span
from pipebubble.schedule import ScheduleError

RANKS = 4
F, B, W = 0.020, 0.040, 0.020


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
        cfg = DistConfig(name, RANKS, args.microbatches, chunks=v, model="sleep",
                         model_args={"layers": sched.num_stages, "f": F / v, "b": B / v,
                                     "w": W / v, "width": 4},
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
            rows.append((name, v, tl, pred))
    cluster.close()
    if cluster.g == 0:
        table(rows)


def table(rows) -> None:
    print(f"{'schedule':<18}{'v':>2}  {'step meas.':>11}{'step pred.':>11}{'ratio':>7}  "
          f"{'bubble meas.':>12}{'bubble pred.':>13}{'ratio':>7}")
    worst = 0.0
    for name, v, tl, pred in rows:
        rs = tl.step_time / pred.step_time
        rb = tl.bubble_fraction / pred.bubble_fraction if pred.bubble_fraction else float("nan")
        worst = max(worst, abs(rs - 1))
        print(f"{name:<18}{v:>2}  {tl.step_time * 1e3:>9.1f}ms{pred.step_time * 1e3:>9.1f}ms"
              f"{rs:>7.3f}  {tl.bubble_fraction:>12.2%}{pred.bubble_fraction:>13.2%}{rb:>7.3f}")
    print(f"largest step-time deviation from the prediction: {worst:.1%} (target <= 10%)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
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
