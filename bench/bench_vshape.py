"""What does reordering cost V-Half and V-Min? Against the plain repeated block, in the same run.

``get_schedule("v-half" | "v-min", p, m)`` repeats the building block, then re-times it with
``building_block.reorder`` (a list scheduler over unit time) and keeps the shorter order.
This prints the generator's time, the plain block's (``repeat(block(...))``) and their
ratio, plus the step time both give with unit chunk passes, against the paper's bound.

Run: ``.venv/bin/python bench/bench_vshape.py``. Prints; asserts nothing.
"""

from __future__ import annotations

import time

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.ir.schedule import make_schedule
from pipebubble.schedules.building_block import block, repeat
from pipebubble.schedules.v_half import v_half_offsets
from pipebubble.schedules.v_min import v_min_offsets
from pipebubble.sim.formulas import v_half_memory, v_min_memory, v_shape_bound

UNIT = CostModel(f=2, b=4, w=2, activation_memory=1, weight_memory=1)  # 1 unit per chunk pass
FAMILIES = {"v-half": (v_half_offsets, v_half_memory), "v-min": (v_min_offsets, v_min_memory)}


def best_of(fn, repeats: int = 3):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    print(f"{'schedule':8} {'p':>3} {'m':>4} {'gen s':>7} {'block s':>8} {'ratio':>6} "
          f"{'step':>6} {'block step':>10} {'bound':>6}")
    for name, (offsets, memory) in FAMILIES.items():
        for p, m in ((8, 32), (16, 64), (32, 256)):
            gen, sched = best_of(lambda: get_schedule(name, p, m))  # noqa: B023
            base, rows = best_of(lambda: repeat(p, m, block(p, offsets(p))))  # noqa: B023
            plain = make_schedule("block", rows, 2 * p, m, placement="v")
            step = simulate(sched, UNIT).step_time
            old = simulate(plain, UNIT).step_time
            print(f"{name:8} {p:3} {m:4} {gen:7.3f} {base:8.3f} {gen / base:6.1f} "
                  f"{step:6g} {old:10g} {v_shape_bound(p, m, 2 * memory(p)):6}")


if __name__ == "__main__":
    main()
