"""How fast is simulate()? Against torch.distributed.pipelining's dry run, in the same run.

1. Throughput on about one million actions (1F1B and GPipe, p=16, m=32768), timing the
   simulation and the per-rank metrics (busy, idle, bubble, peak memory, in-flight).
   Target: >= 1,000,000 actions per second.
2. torch's own schedules (from ``get_schedule_ops``): we simulate the compute schedule with
   durations and memory; torch's ``_simulate_comms_compute`` dry-runs the same schedule
   lowered with its send/recv actions (it computes only an order of steps: no durations, no
   memory). Target: ours >= 5x faster.

Run: ``make bench`` or ``.venv/bin/python bench/bench_simulate.py``. Prints ratios; asserts
nothing (timings depend on the machine).
"""

from __future__ import annotations

import time

from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.schedules import _simulate_comms_compute

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.interop.torch_csv import parse_torch_csv

NO_TIME = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}


def best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def from_torch(rows, num_microbatches: int, name: str):
    """torch _Action rows -> our Schedule, through the CSV text torch itself writes."""
    text = "\n".join(",".join("" if a is None else str(a) for a in row) for row in rows)
    return parse_torch_csv(text, name=name, microbatches=num_microbatches)


def throughput() -> None:
    print("1) throughput, simulation + per-rank metrics, best of 3")
    for name in ("1f1b", "gpipe"):
        schedule = get_schedule(name, 16, 32768)
        n = schedule.num_actions()

        def run(schedule=schedule):
            simulate(schedule, CostModel(f=1, b=2)).rank_stats()

        t = best_of(run)
        print(f"   {name:6s} p=16 m=32768: {n:,} actions in {t:.3f} s = "
              f"{n / t / 1e6:.2f} M actions/s  (target >= 1.00)")


def against_torch() -> None:
    print("2) torch's schedules: our simulate vs torch's _simulate_comms_compute dry run")
    cases = [("Interleaved1F1B", 4, 32, 2), ("Interleaved1F1B", 8, 64, 2), ("LoopedBFS", 8, 64, 2),
             ("InterleavedZeroBubble", 8, 64, 2), ("ZBVZeroBubble", 8, 64, 2),
             ("DualPipeV", 4, 32, 2)]
    for name, p, m, v in cases:
        rows = get_schedule_ops(name, p, m, num_stages_per_rank=v)
        ours = from_torch(rows, m, name)
        comm_rows = get_schedule_ops(name, p, m, num_stages_per_rank=v, with_comms=True)
        comm_rows = [[a for a in row if a is not None and a.computation_type.value not in NO_TIME]
                     for row in comm_rows]
        where = ours.stage_to_rank

        def theirs(comm_rows=comm_rows, where=where):
            _simulate_comms_compute({r: list(row) for r, row in enumerate(comm_rows)},
                                    lambda s: where[s], len(where))

        def mine(ours=ours):
            simulate(ours, CostModel(f=1, b=2, w=1)).rank_stats()

        try:
            t_theirs = best_of(theirs, 1)
        except Exception as exc:  # torch's dry run does not support every schedule it makes
            print(f"   {name:22s} p={p} m={m} v={v}: torch dry run failed: "
                  f"{str(exc).splitlines()[0][:60]}")
            continue
        t_mine = best_of(mine)
        print(f"   {name:22s} p={p} m={m} v={v}: {ours.num_actions():6,} actions  ours "
              f"{t_mine * 1e3:8.2f} ms  torch {t_theirs * 1e3:9.2f} ms  ratio "
              f"{t_theirs / t_mine:7.1f}x  (target >= 5x)")


if __name__ == "__main__":
    throughput()
    against_torch()
