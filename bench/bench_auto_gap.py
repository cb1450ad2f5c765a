"""How far is ``auto`` from the exact optimum? Random small instances against the MIP.

Each instance: p in 2..4 ranks, m microbatches (p x m <= 32 in the loop placement, fewer in
V, whose MIP has twice the actions), loop or V placement, unequal stages (F, W and I drawn
per stage), comm 0 or > 0, M_W = M_B / 2, and a memory limit from none down to the
smallest feasible one (``bounds.min_limits``). ``auto_schedule`` (the heuristic alone) gives
an order; ``exact.optimal_schedule`` (HiGHS) gives the optimum, started from auto's order,
or, when its time limit stops it, the best order it found and a proven lower bound.

Columns: the instance, the step of the local search alone (auto without its MIP windows),
auto's step, the MIP's best order's step, the optimum (``>= bound`` when not proven), the gap in
% (auto over the optimum; against the bound when not proven, so an upper bound on the gap),
auto's and the MIP's CPU seconds, and where auto's order came from (``+ MIP windows``: the
window search of ``exact.polish`` improved it).

Run: ``.venv/bin/python bench/bench_auto_gap.py [--seeds 40] [--mip-seconds 60]
[--first 1] [--placement loop|v|any] [--sizes small|big]`` (``--sizes big --mip-seconds 0``:
what the windows gain where the MIP proves nothing). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import time

from pipebubble import CostModel, auto_schedule
from pipebubble.ir.schedule import loop_placement, v_placement
from pipebubble.schedules.auto.bounds import min_limits

SIZES = {  # (p, m) drawn per placement: what the MIP proves in seconds to a minute
    "loop": [(2, 4), (2, 6), (2, 8), (3, 4), (3, 6), (3, 8), (4, 4), (4, 6), (4, 8)],
    "v": [(2, 3), (2, 4), (2, 5), (2, 6), (3, 3), (3, 4), (3, 5), (3, 6), (4, 3), (4, 4)],
}
BIG = {  # --sizes big: beyond what the MIP proves (V up to p x m = 32, its windows' limit)
    "loop": [(4, 10), (5, 8), (6, 6), (4, 12), (6, 8), (8, 4)],
    "v": [(4, 5), (4, 6), (3, 7), (3, 8), (4, 7), (4, 8), (5, 4), (5, 5), (5, 6)],
}


def instance(seed: int, placement: str = "any", sizes: dict | None = None):
    """(p, m, placement, costs, limit) drawn from ``seed``; the limit is None, the smallest
    feasible one, or a little (0.25 to 2 M_B) above it."""
    rng = random.Random(seed)
    kind = rng.choice(["loop", "v"]) if placement == "any" else placement
    p, m = rng.choice((sizes or SIZES)[kind])
    stages = p if kind == "loop" else 2 * p
    f = [round(rng.uniform(0.5, 2), 2) for _ in range(stages)]
    w = [round(rng.uniform(0.2, 1.5), 2) for _ in range(stages)]
    b = [x + y + round(rng.uniform(0, 1), 2) for x, y in zip(f, w, strict=True)]
    if rng.random() < 0.3:  # equal stages too (the hand-made schedules' home ground)
        f, w, b = 1.0, 1.0, 2.0
    costs = CostModel(f=f, b=b, w=w, comm=rng.choice([0, 0, 0.1, 0.3]), weight_memory=0.5)
    where = loop_placement(p, p) if kind == "loop" else v_placement(p)
    need = max(min_limits(costs.resolve(stages, 1 if kind == "loop" else 2), where))
    extra = rng.choice([None, 0, 0, 0.25, 0.5, 0.5, 1, 1.5, 2])
    limit = None if extra is None else need + extra
    return p, m, kind, costs, limit


def describe(costs: CostModel) -> str:
    if isinstance(costs.f, int | float):
        return f"equal comm={costs.comm:g}"
    return f"unequal comm={costs.comm:g}"


def main() -> None:
    from pipebubble.schedules.auto.exact import optimal_schedule

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--mip-seconds", type=float, default=60.0)
    ap.add_argument("--placement", choices=["any", "loop", "v"], default="any")
    ap.add_argument("--sizes", choices=["small", "big"], default="small",
                    help="big: p x m up to 32 in V, where the MIP proves little (0 s skips it)")
    args = ap.parse_args()
    print(f"{'seed':>4} {'p':>2} {'m':>2} {'place':>5} {'limit':>6} {'costs':<18} "
          f"{'local':>8} {'auto':>8} {'MIP best':>8} {'optimum':>10} {'gap %':>6} "
          f"{'auto s':>7} {'MIP s':>6}  from")
    gaps, proven, gains = [], [], []
    for seed in range(args.first, args.first + args.seeds):
        p, m, kind, costs, limit = instance(seed, args.placement,
                                            BIG if args.sizes == "big" else SIZES)
        t0 = time.process_time()
        auto = auto_schedule(p, m, costs, memory_limit=limit, placement=kind)
        auto_s = time.process_time() - t0
        step = auto.options["auto"]["step_time"]
        local = auto_schedule(p, m, costs, memory_limit=limit, placement=kind,
                              mip_windows=False).options["auto"]["step_time"]
        gains.append(100 * (local / step - 1))
        row = (f"{seed:>4} {p:>2} {m:>2} {kind:>5} {'-' if limit is None else f'{limit:g}':>6} "
               f"{describe(costs):<18} {local:>8.2f} {step:>8.2f}")
        if args.mip_seconds <= 0:
            print(f"{row} {'-':>8} {'-':>10} {'-':>6} {auto_s:>7.2f} {'-':>6}  "
                  f"{auto.options['auto']['from']}", flush=True)
            continue
        t0 = time.process_time()
        best = optimal_schedule(p, m, costs, memory_limit=limit, placement=kind, start=auto,
                                time_limit=args.mip_seconds)
        mip_s = time.process_time() - t0
        ref = best.step_time if best.proven else best.lower_bound
        gap = 100 * (step / ref - 1)
        gaps.append(gap)
        if best.proven:
            proven.append(gap)
        opt = f"{best.step_time:.2f}" if best.proven else f">={best.lower_bound:.2f}"
        print(f"{row} {best.step_time:>8.2f} {opt:>10} {gap:>6.2f} {auto_s:>7.2f} "
              f"{mip_s:>6.1f}  {auto.options['auto']['from']}", flush=True)
    print(f"the MIP windows over the local search alone: faster on "
          f"{sum(g > 0.01 for g in gains)} of {len(gains)}, by up to {max(gains):.2f} %")
    if not gaps:
        return
    print(f"instances {len(gaps)}; gap mean {sum(gaps) / len(gaps):.2f} %, max {max(gaps):.2f} %;"
          f" over 2 %: {sum(g > 2 for g in gaps)}")
    if proven:
        print(f"proven optimal by the MIP: {len(proven)}; auto at that optimum on "
              f"{sum(g < 0.01 for g in proven)}, within 2 % on {sum(g <= 2 for g in proven)}, "
              f"max gap {max(proven):.2f} %")


if __name__ == "__main__":
    main()
