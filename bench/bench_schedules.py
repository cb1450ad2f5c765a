"""Generate and simulate every registered schedule; compare generation with PyTorch's.

For each schedule at p=8 ranks and m=256 microbatches (default chunks), time the generator
and ``simulate``, and, where torch.distributed.pipelining has the same schedule, time
torch's construction of the same schedule (``get_schedule_ops``) in the same run. Note that
torch's schedule constructors also lower the schedule (add sends and receives, FSDP and
gradient-reduction markers), work our generators do not do, so the ratio overstates the
difference for generation alone. Prints actions per second (generate + simulate) and the
ratio torch / pipebubble generation. No targets are asserted.

    python bench/bench_schedules.py

Two more sections time the searches that build orders on the evaluation core's clock
(``sim/clock.py``), each as the best of ``--repeat`` runs in CPU seconds of this process
with the garbage collector paused (on a shared machine wall time mostly measures the
neighbours):

- ``--builder``: V-Half and V-Min (``schedules/building_block.py``) at p = 8, 16, 32 and
  m = 3p .. 8p, the builder's caches cleared before each build (each m past 2p + 6 builds
  the order for 2p + 6 microbatches and repeats its steady state);
- ``--greedy``: auto's greedy list scheduler (``schedules/auto/greedy.py``) on the loop
  placement (one chunk and two) at p = 8, 16, 32, m = 4p, the Zero Bubble paper's 1.5B
  costs (F 18.5, I 18.1, W 9.3, comm 0.6; ``M_W = M_B / 2``) under a limit of p M_B,
  every knob setting of the grid;
- ``--wave``: the adaptive stage's cool-down wave (``schedules/auto/adaptive.wave_cooldown``,
  on the clock's unit time) over V-Half's block with its ends reordered
  (``building_block.reorder_ends``) at p = 8, 16, 32 on the adaptive stage's ``2p + 6``
  microbatches, for a peak of the block's own and two more chunk activations.

``--baseline SRC`` times the same section with the package from ``SRC`` (e.g. another
checkout's ``src``) in a child process, alternating with this one, and prints the ratio
baseline / this (above 1: this checkout is faster)::

    python bench/bench_schedules.py --builder --greedy --wave --baseline /work/main/src
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
import time

from pipebubble.costs import CostModel
from pipebubble.schedules import get_schedule, schedule_names
from pipebubble.sim.kernel import simulate

TORCH = {"gpipe": ("GPipe", None), "interleaved-1f1b": ("Interleaved1F1B", 2),
         "looped-bfs": ("LoopedBFS", 2), "zbv": ("ZBVZeroBubble", 2),
         "dualpipev": ("DualPipeV", 2)}


def best_of(fn, repeat: int = 3) -> float:
    from pipebubble.sim import kernel

    times = []
    for _ in range(repeat):
        kernel.KEPT.cache_clear()  # (simulate() keeps its large results: each run anew)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_cpu(fn, repeat: int) -> float:
    """The least CPU time of ``repeat`` runs of ``fn``, the garbage collector paused."""
    times = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
        finally:
            gc.enable()
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


def builder_times(repeat: int) -> dict[str, float]:
    """Seconds per V-Half / V-Min build (best of ``repeat``), the builder's caches cleared."""
    from pipebubble.schedules import building_block as bb
    from pipebubble.schedules.v_half import v_half
    from pipebubble.schedules.v_min import v_min

    caches = [f for f in vars(bb).values() if hasattr(f, "cache_clear")]
    out = {}
    for p in (8, 16, 32):
        for name, fn in (("v-half", v_half), ("v-min", v_min)):
            for m in range(3 * p, 8 * p + 1, p):
                def run(fn=fn, p=p, m=m):
                    for c in caches:
                        c.cache_clear()
                    fn(p, m)
                out[f"{name} p={p} m={m}"] = best_cpu(run, repeat)
    return out


def greedy_times(repeat: int) -> dict[str, float]:
    """Seconds per greedy pass over the whole knob grid (best of ``repeat``)."""
    from pipebubble.ir.schedule import loop_placement
    from pipebubble.schedules.auto import knob_grid
    from pipebubble.schedules.auto.greedy import greedy_order

    costs = CostModel(f=18.5, b=18.1 + 9.3, w=9.3, comm=0.6, activation_memory=1.0,
                      weight_memory=0.5)
    out = {}
    for chunks in (1, 2):
        for p in (8, 16, 32):
            m = 4 * p
            where = loop_placement(p, p * chunks)
            sc = costs.resolve(p * chunks, chunks)
            limits = [float(p)] * p
            grid = knob_grid(p, m, chunks) if p * m * chunks <= 1024 else knob_grid(4, 4, chunks)

            def run(p=p, m=m, sc=sc, where=where, limits=limits, grid=grid):
                for knobs in grid:
                    greedy_order(p, m, sc, where, limits, knobs)
            out[f"greedy loop v={chunks} p={p} m={m} ({len(grid)} knobs)"] = best_cpu(run, repeat)
    return out


def wave_times(repeat: int) -> dict[str, float]:
    """Seconds per cool-down wave (best of ``repeat``), its input orders built first."""
    from pipebubble.schedules import building_block as bb
    from pipebubble.schedules.auto.adaptive import wave_cooldown
    from pipebubble.schedules.v_half import v_half_offsets

    out = {}
    for p in (8, 16, 32):
        m = 2 * p + 6
        times = bb.block(p, v_half_offsets(p))
        rows = bb.repeat(p, m, times)
        cap, cap_i = bb.peak(p, rows), bb.peak(p, rows, frees="I")
        orders = bb.reorder_ends(p, m, times, cap, cap_i)
        for k in (cap, cap + 2):
            out[f"wave p={p} m={m} k={k}"] = best_cpu(
                lambda p=p, m=m, orders=orders, k=k: wave_cooldown(p, m, orders, k), repeat)
    return out


def sections(args) -> dict[str, float]:
    out: dict[str, float] = {}
    if args.builder:
        out.update(builder_times(args.repeat))
    if args.greedy:
        out.update(greedy_times(args.repeat))
    if args.wave:
        out.update(wave_times(args.repeat))
    return out


def compare(args) -> None:
    """This checkout's times, and with ``--baseline`` the baseline's, rounds alternating."""
    mine: dict[str, float] = {}
    base: dict[str, float] = {}
    child = [sys.executable, __file__, "--child", "--repeat", str(args.repeat)]
    child += ["--builder"] * args.builder + ["--greedy"] * args.greedy + ["--wave"] * args.wave
    env = dict(os.environ, PYTHONPATH=args.baseline or "")
    for _ in range(args.rounds):
        for k, v in sections(args).items():
            mine[k] = min(v, mine.get(k, v))
        if args.baseline:
            got = json.loads(subprocess.run(child, env=env, check=True, capture_output=True,
                                            text=True).stdout)
            for k, v in got.items():
                base[k] = min(v, base.get(k, v))
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{'case':>40} {'this':>10}" + (f" {'baseline':>10} {'base/this':>9}"
                                           if args.baseline else ""))
    for k, v in mine.items():
        line = f"{k:>40} {v * 1e3:>8.2f}ms"
        if k in base:
            line += f" {base[k] * 1e3:>8.2f}ms {base[k] / v:>9.3f}"
        print(line)
    if base:
        for group in ("v-half", "v-min", "greedy", "wave"):
            keys = [k for k in mine if k.startswith(group) and k in base]
            if keys:
                total, total_b = sum(mine[k] for k in keys), sum(base[k] for k in keys)
                print(f"{group + ' (sum)':>40} {total * 1e3:>8.2f}ms {total_b * 1e3:>8.2f}ms "
                      f"{total_b / total:>9.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--builder", action="store_true", help="time the V-Half / V-Min builder")
    ap.add_argument("--greedy", action="store_true", help="time auto's greedy (loop)")
    ap.add_argument("--wave", action="store_true", help="time adaptive's cool-down wave")
    ap.add_argument("--baseline", metavar="SRC", help="also time the package in SRC")
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (best kept)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds with --baseline")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.repeat < 1 or ns.rounds < 1:
        ap.error(f"--repeat and --rounds must be >= 1, got {ns.repeat} and {ns.rounds}")
    if ns.child:
        print(json.dumps(sections(ns)))
    elif ns.builder or ns.greedy or ns.wave:
        compare(ns)
    else:
        main()
