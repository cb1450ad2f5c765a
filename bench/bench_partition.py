"""Time the exact partitioner: 1,000 layers into 64 stages (target: under 1 second).

Baseline, timed in the same run on the same costs: the textbook O(L² S) dynamic programme
(``min_max_partition_dp``, vectorised over the start position with numpy). Both must find
the same bottleneck; the script prints both times and their ratio.

    python bench/bench_partition.py [--layers 1000] [--stages 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import time

from pipebubble.plan.partition import bottleneck, min_max_partition, min_max_partition_dp


def best_of(repeats: int, fn):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(0)
    # Times in seconds like a real profile: blocks of ~1 ms with noise, a big first and last.
    costs = [rng.uniform(0.8e-3, 1.2e-3) for _ in range(args.layers)]
    costs[0], costs[-1] = 2e-4, 8e-3
    L, S = args.layers, args.stages

    fast_t, fast = best_of(args.repeats, lambda: min_max_partition(costs, S))
    slow_t, slow = best_of(1, lambda: min_max_partition_dp(costs, S))
    b_fast, b_slow = bottleneck(costs, fast), bottleneck(costs, slow)
    print(f"{L} layers into {S} stages")
    print(f"  min_max_partition (bisection + reachability): {fast_t * 1e3:8.1f} ms  "
          f"(best of {args.repeats})  bottleneck {b_fast * 1e3:.6f} ms")
    print(f"  O(L^2 S) dynamic programme (numpy):             {slow_t * 1e3:8.1f} ms  "
          f"bottleneck {b_slow * 1e3:.6f} ms")
    print(f"  speed-up {slow_t / fast_t:.1f}x; same bottleneck: "
          f"{abs(b_fast - b_slow) <= 1e-12 * b_slow}; target under 1 s: "
          f"{'met' if fast_t < 1 else 'MISSED'}")
    if abs(b_fast - b_slow) > 1e-12 * b_slow:
        raise SystemExit("the two algorithms disagree")


if __name__ == "__main__":
    main()
