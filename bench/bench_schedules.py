"""Generate and simulate every registered schedule; compare generation with PyTorch's.

For each schedule at p=8 ranks and m=256 microbatches (default chunks), time the generator
and ``simulate``, and, where torch.distributed.pipelining has the same schedule, time
torch's construction of the same schedule (``get_schedule_ops``) in the same run. Note that
torch's schedule constructors also lower the schedule (add sends and receives, FSDP and
gradient-reduction markers), work our generators do not do, so the ratio overstates the
difference for generation alone. Prints actions per second (generate + simulate) and the
ratio torch / pipebubble generation. No targets are asserted.

    python bench/bench_schedules.py
"""

from __future__ import annotations

import logging
import time

from pipebubble.costs import CostModel
from pipebubble.schedules import get_schedule, schedule_names
from pipebubble.sim.kernel import simulate

TORCH = {"gpipe": ("GPipe", None), "interleaved-1f1b": ("Interleaved1F1B", 2),
         "looped-bfs": ("LoopedBFS", 2), "zbv": ("ZBVZeroBubble", 2),
         "dualpipev": ("DualPipeV", 2)}


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(p: int = 8, m: int = 256) -> None:
    logging.disable(logging.WARNING)
    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:  # pragma: no cover - torch is a dependency
        get_schedule_ops = None
    print(f"p={p} m={m}")
    print(f"{'schedule':>18} {'actions':>8} {'generate':>10} {'simulate':>10} "
          f"{'actions/s':>11} {'torch ctor':>10} {'torch/ours':>10}")
    for name in schedule_names():
        schedule = get_schedule(name, p, m)
        gen = best_of(lambda name=name: get_schedule(name, p, m))
        sim = best_of(lambda schedule=schedule: simulate(schedule, CostModel()))
        n = schedule.num_actions()
        line = (f"{name:>18} {n:>8} {gen * 1e3:>8.1f}ms {sim * 1e3:>8.1f}ms "
                f"{n / (gen + sim):>11,.0f}")
        if get_schedule_ops is not None and name in TORCH:
            tname, chunks = TORCH[name]
            tgen = best_of(lambda t=tname, c=chunks: get_schedule_ops(t, p, m, c), repeat=1)
            line += f" {tgen * 1e3:>8.1f}ms {tgen / gen:>9.1f}x"
        print(line)


if __name__ == "__main__":
    main()
