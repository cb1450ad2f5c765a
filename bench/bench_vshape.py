"""V-Half and V-Min against the step-time bound, and what building them costs.

Part 1, the bound (unit chunk passes: F = I = W = 1 per chunk, no comm; k = the stated
peak in chunk activations): for every p in 2..P and every m from 1 to 3p + 2, the units
each schedule lies above ``6m + 6p - 1 - 3k`` (``sim/formulas.v_shape_bound``), summarised
per p as the smallest m from which it is at the bound for every larger m tried (the bound
holds from m = k/2 + 1), the gap there, and the published block's gap. Computed with the
unit-time helpers of ``building_block`` (``tests/test_vshape.py`` checks they agree with
the simulator, and checks the same up to p = 12 with it).

Part 2, speed: ``get_schedule("v-half" | "v-min", p, m)`` (repeat the block, reorder, keep
the shorter) against the plain repeated block, best of 3 (CPU time), with the step time both
give and the bound.

Run: ``.venv/bin/python bench/bench_vshape.py [P]`` (P defaults to 24). Prints; asserts
nothing.
"""

from __future__ import annotations

import sys
import time

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.ir.schedule import make_schedule
from pipebubble.schedules.building_block import block, build, peak, repeat, unit_step
from pipebubble.schedules.v_half import v_half_offsets, v_half_published_offsets
from pipebubble.schedules.v_min import v_min_offsets, v_min_published_offsets
from pipebubble.sim.formulas import v_half_memory, v_min_memory, v_shape_bound

UNIT = CostModel(f=2, b=4, w=2, activation_memory=1, weight_memory=1)  # 1 unit per chunk pass
FAMILIES = {
    "v-half": (v_half_offsets, v_half_published_offsets, v_half_memory),
    "v-min": (v_min_offsets, v_min_published_offsets, v_min_memory),
}


def gaps(p: int, offsets, memory) -> dict[int, tuple[int, int]]:
    """m -> (step - bound, peak in chunk activations) for m = 1 .. 3p + 2."""
    k = 2 * memory(p)
    out = {}
    for m in range(1, 3 * p + 3):
        orders = build(p, m, [offsets(p)], k)
        out[m] = (unit_step(p, m, orders) - v_shape_bound(p, m, k), peak(p, orders))
    return out


def bound_table(top: int) -> None:
    print("step - bound (6m + 6p - 1 - 3k), unit chunk passes; 'from m' = the smallest m "
          "from which every larger m tried (to 3p + 2) has the same gap at the full peak")
    print(f"{'schedule':8} {'p':>3} {'k/2':>4} {'from m':>6} {'gap':>4} {'published gap':>13}")
    for name, (ours, published, memory) in FAMILIES.items():
        for p in range(2, top + 1):
            k = 2 * memory(p)
            got = gaps(p, ours, memory)
            last = got[3 * p + 2]
            start = 3 * p + 2
            while start > 1 and got[start - 1] == last:
                start -= 1
            m = 2 * p + 1
            pub = build(p, m, [published(p)], k)
            pub_gap = unit_step(p, m, pub) - v_shape_bound(p, m, k)
            full = "" if last[1] == k else f" (peak {last[1]} < {k})"
            print(f"{name:8} {p:3} {memory(p):4} {start:6} {last[0]:4} {pub_gap:13}{full}")


def best_of(fn, repeats: int = 3):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def speed() -> None:
    print(f"\n{'schedule':8} {'p':>3} {'m':>4} {'gen s':>7} {'block s':>8} {'ratio':>6} "
          f"{'step':>6} {'block step':>10} {'bound':>6}")
    for name, (offsets, _, memory) in FAMILIES.items():
        for p, m in ((8, 32), (16, 64), (32, 256)):
            gen, sched = best_of(lambda: get_schedule(name, p, m))  # noqa: B023
            base, rows = best_of(lambda: repeat(p, m, block(p, offsets(p))))  # noqa: B023
            plain = make_schedule("block", rows, 2 * p, m, placement="v")
            step = simulate(sched, UNIT).step_time
            old = simulate(plain, UNIT).step_time
            print(f"{name:8} {p:3} {m:4} {gen:7.3f} {base:8.3f} {gen / base:6.1f} "
                  f"{step:6g} {old:10g} {v_shape_bound(p, m, 2 * memory(p)):6}")


def main() -> None:
    bound_table(int(sys.argv[1]) if len(sys.argv) > 1 else 24)
    speed()


if __name__ == "__main__":
    main()
