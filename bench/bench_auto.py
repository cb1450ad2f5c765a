"""How fast is the automatic scheduler? Against one simulate() of ZB-V, in the same run.

``auto_schedule`` searches both placements (the registered schedules that fit, then the
greedy list scheduler over its knob grid), re-scores the winner with the simulator and
validates it (on small instances, after a local search and the MIP windows). Targets
(issue 11, on the project's 2-core machine): p=16, m=64 in < 1 s;
p=32, m=256 in < 2 s. The ratio against one simulation of ZB-V at the same size (a
baseline timed in this run) says how the search scales apart from the machine's load.

Run: ``.venv/bin/python bench/bench_auto.py``. Prints; asserts nothing.
"""

from __future__ import annotations

import time

from pipebubble import CostModel, auto_schedule, get_schedule, simulate

CASES = [  # (p, m, memory limit in M_B per rank: None, ZB-H1's p, half of it)
    (16, 64, None), (16, 64, 16), (16, 64, 8),
    (32, 256, None), (32, 256, 32), (32, 256, 16),
]
TARGET = {(16, 64): 1.0, (32, 256): 2.0}
SMALL = [  # where the local search (<= 300 actions) and the MIP windows (<= 200) run: no target
    (2, 5, 1.5), (3, 6, 2), (4, 4, 2.5), (4, 8, 3), (4, 8, 2), (5, 6, 3),
]


def best_of(fn, repeats: int = 2) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    costs = CostModel(f=1, b=2, w=1, comm=0.05, weight_memory=0.5)
    print(f"{'p':>3} {'m':>4} {'limit':>6} {'seconds':>8} {'target':>7} {'x simulate':>10}  "
          f"{'step':>8} {'bound':>8}  from")
    for p, m, limit in CASES:
        row(p, m, limit, costs, f"{TARGET[p, m]:>7.1f}")
    # Small instances with unequal stages (what bench_auto_gap.py draws): the search's cost
    print("small instances, unequal stages (local search and MIP windows):")
    for p, m, limit in SMALL:
        f = [1.35, 1.7, 0.59, 0.68, 1.1, 0.9, 1.25, 0.75, 1.5, 0.8][:2 * p]
        w = [0.5 * x for x in f]
        row(p, m, limit, CostModel(f=f, b=[2.2 * x for x in f], w=w, comm=0.3,
                                   weight_memory=0.5), f"{'-':>7}")


def row(p: int, m: int, limit, costs: CostModel, target: str) -> None:
    base, _ = best_of(lambda: simulate(get_schedule("zbv", p, m), costs))
    secs, s = best_of(lambda: auto_schedule(p, m, costs, memory_limit=limit))
    info = s.options["auto"]
    print(f"{p:>3} {m:>4} {str(limit):>6} {secs:>8.2f} {target} "
          f"{secs / base:>10.1f}  {info['step_time']:>8.2f} {info['lower_bound']:>8.2f}  "
          f"{info['placement']} {info['from']}")


if __name__ == "__main__":
    main()
