"""How fast is the wire: lowering a schedule to SEND/RECV programs and simulating them?

For each case (1F1B p=16 m=1024, interleaved 1F1B p=8 m=512 v=2, ZB-V p=8 m=512,
DualPipe p=8 m=1024: 8,000 to 33,000 compute steps, comm 0.1): ``lower`` (naive and
batched) and ``run_wire`` of the lowered program (naive with buffered sends, which do not
deadlock; batched with blocking ones, as gloo), against validate + simulate of the same
schedule in the same run (the ratio: how many simulations one wire pass costs). Times are
the best of 3 repeats, in wall-clock seconds. The wire runs in Python one step at a time
and the simulator does not, so the ratio is large; it is for comparing one version of the
wire with another on one machine (a change to ``sim/wire.py`` should not move it).

Run: ``.venv/bin/python bench/bench_wire.py``. Prints; asserts nothing.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pipebubble import CostModel, get_schedule, simulate, validate
from pipebubble.sim.wire import lower, run_wire

CASES = (("1f1b", 16, 1024, None), ("interleaved-1f1b", 8, 512, 2), ("zbv", 8, 512, None),
         ("dualpipe", 8, 1024, None))


def best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(s, costs: CostModel) -> tuple[float, dict, dict]:
    """(validate + simulate, lower per ordering, run_wire per ordering), best of 3 each."""

    def sim():
        fresh = replace(s)  # a new object: validated again (validate() remembers the last)
        validate(fresh)
        simulate(fresh, costs)

    t_lower = {o: best_of(lambda o=o: lower(s, o)) for o in ("naive", "batched")}
    wired = {o: lower(s, o) for o in ("naive", "batched")}
    t_wire = {"naive": best_of(lambda: run_wire(wired["naive"], costs, blocking=False)),
              "batched": best_of(lambda: run_wire(wired["batched"], costs, blocking=True))}
    return best_of(sim), t_lower, t_wire


def main() -> None:
    costs = CostModel(f=1.0, b=2.0, w=1.0, comm=0.1)
    print(f"{'case':<28} {'actions':>8} {'simulate':>9} {'lower n':>8} {'lower b':>8} "
          f"{'wire n':>8} {'wire b':>8}   wire/simulate (n, b)")
    for name, p, m, v in CASES:
        s = get_schedule(name, p, m, v)
        n = sum(len(o) for o in s.orders)
        t_sim, t_lower, t_wire = measure(s, costs)
        label = f"{name} p={p} m={m}" + (f" v={v}" if v else "")
        print(f"{label:<28} {n:>8} {t_sim:>9.3f} {t_lower['naive']:>8.3f} "
              f"{t_lower['batched']:>8.3f} {t_wire['naive']:>8.3f} {t_wire['batched']:>8.3f}"
              f"   {(t_lower['naive'] + t_wire['naive']) / t_sim:>6.1f}x "
              f"{(t_lower['batched'] + t_wire['batched']) / t_sim:>6.1f}x")


if __name__ == "__main__":
    main()
