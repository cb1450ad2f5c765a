"""How fast are the generators, validate + simulate, and the terminal Gantt chart?

Every figure is measured in this run and printed next to its target; ratios compare with a
baseline measured in the same run (torch's own dry run; the same simulation at a quarter of
the ranks). Times are the best of a few repeats, in wall-clock seconds (on a machine shared
with other work the best repeat is the least disturbed one) and, in brackets, the CPU time
of that repeat.

1. Throughput of validate + simulate on about a million actions: 1F1B p=64 m=8192 (its
   ranks advance in lock-step, a rank switch every two actions: the hard case), GPipe
   p=16 m=32768, interleaved 1F1B p=16 m=8192 v=4, ZB-V p=16 m=10240, DualPipe p=16
   m=32768 and DualPipeV p=16 m=16384 (Overlap pairs; the simulator runs a pair as one
   step, so these are not slower per action than the others). Target >= 3 M actions/s for
   every family (issue 19; it was 2 M/s for issue 10); on a loaded machine the ratios
   DualPipe / 1F1B and DualPipeV / 1F1B, measured in the same run, move less. Each
   repeat validates a fresh copy of the schedule (validate() remembers the last schedule it
   checked, so that simulate() does not check it again: a repeat on the same object would
   skip the validation).
2. torch.distributed.pipelining's dry run on torch's own schedules: ``_add_send_recv`` (lower
   the compute orders to send/recv actions) + ``_simulate_comms_compute`` (order them; no
   durations, no memory) against our validate + simulate of the same orders (read through
   the CSV torch writes; durations and memory included). Target >= 10x on each case.
3. Generating the 1M-action 1F1B (target < 0.5 s); drawing its terminal Gantt (< 0.3 s).
4. Linear in ranks: simulate p=16000, m=1 against p=4000, m=1 (4x the actions; a quadratic
   simulator would take 16x). Target: ratio near 4.
5. Incremental re-time (the evaluation core ``sim/program.py`` with answers from the tails,
   ``bench/large_search/``: ``core.py`` and ``critical.py``):
   ZB-H1 p=16 m=1042 (50,016 actions, comm 0.1): one action moved by one place on its rank
   (``Compiled.swap`` of neighbours), against a full validate + simulate of the schedule
   (best of 3, this run). Three sorts of move (two neighbouring Ws traded; a W with its
   neighbour; any action with its neighbour), each measured two ways. *Tried*: the
   search's pattern, 200 random moves each tried, its step time read, and taken back; the
   time of all three calls (the move is answered from the tails, or re-timed where the tails
   cannot tell, and left pending; taking it back cancels it). *Kept*: 30 moves kept; the
   time of the move, ``settle()`` (its re-time) and the next try (which first brings the
   tails up to date, backwards from what the kept move changed, and answers). Each:
   the median ratio and the share >= 100x. *Mix*: 200 moves, every tenth kept, against 200
   full runs (all calls timed). Target: >= 100x median for a tried move (issue 19). A
   random move kept shifts many ends after it and tails before it (median 5 % and 16 %
   here), so it costs about a full run.
6. Kept moves (``python bench/bench_simulate.py kept``): on ZB-H1 p=16 m=1042, ZB-V p=16
   m=528, interleaved 1F1B p=16 m=784 v=2 (about 50,000 actions each, comm 0.1) and ZB-V
   with unequal stages, 40 moves of each of two sorts kept: random neighbour swaps, and
   the moves a search keeps (a critical action moved 1 to 3 places, kept when the step is
   not worse). Timed: the move, ``settle()`` and bringing the tails up to date (what the
   next try needs first), against a full validate + simulate; beside it the share of
   actions whose end, and whose tail, changed (computed untimed), and for the moves that
   shortened the step their own speed-up and shares.
7. The local search over large orders (``python bench/bench_simulate.py large``,
   ``bench/large_search/search.py``) from auto's answer on bench_auto's Table 8 settings and two
   Zero Bubble Table 9 rows, and from the registered ZB-H1 / ZB-V orders with unequal
   stages: the step before and after, the gap to auto's lower bound, the seconds, moves
   tried, kept (shorter) / kept on flat ground, and the cost of each kept move against a
   full run; then the same search's moves per second with every move re-timed.

Run: ``make bench`` or ``.venv/bin/python bench/bench_simulate.py [incremental|kept|large]``.
Prints; asserts nothing.
"""

from __future__ import annotations

import io
import sys
import time
from dataclasses import replace
from pathlib import Path

from pipebubble import CostModel, get_schedule, simulate, validate
from pipebubble.sim import kernel

sys.path.insert(0, str(Path(__file__).parent))  # (large_search/, beside this file)

NO_TIME = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}  # torch bookkeeping actions, not compute


def best_of(fn, repeats: int = 3) -> tuple[float, float]:
    """(best wall time, CPU time of that run) over ``repeats`` calls of ``fn``, each with
    nothing kept from the last (simulate() keeps its large results: sim/kernel.py's KEPT)."""
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        kernel.KEPT.cache_clear()
        w, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w, time.process_time() - c))
    return best


def fmt(t: tuple[float, float]) -> str:
    return f"{t[0]:7.3f} s ({t[1]:.3f} s CPU)"


THROUGHPUT_CASES = (("1f1b", 64, 8192, None), ("gpipe", 16, 32768, None),
                    ("interleaved-1f1b", 16, 8192, 4), ("zbv", 16, 10240, None),
                    ("dualpipe", 16, 32768, None), ("dualpipev", 16, 16384, None))


def throughput() -> None:
    print("1) validate + simulate, about a million actions")
    rate = {}
    for name, p, m, v in THROUGHPUT_CASES:
        schedule = get_schedule(name, p, m, v)
        n = schedule.num_actions()  # an Overlap pair counts as its two actions
        costs = CostModel(f=1, b=2, w=1, comm=0.1, overlap=0.8)

        def run(schedule=schedule, costs=costs):
            fresh = replace(schedule)  # a new object: validated again (see the docstring)
            validate(fresh)
            simulate(fresh, costs)

        t = best_of(run, 5)
        label = f"{name} p={p} m={m}" + (f" v={v}" if v else "")
        print(f"   {label:28s}: {n:>9,} actions in {fmt(t)} = "
              f"{n / t[0] / 1e6:.2f} M actions/s ({n / t[1] / 1e6:.2f} per CPU second)  "
              f"target >= 3.00")
        rate[name] = n / t[0], n / t[1]
    for name in ("dualpipe", "dualpipev"):  # a ratio in one run: less noisy under load
        print(f"   {name} / 1f1b, actions per second: {rate[name][0] / rate['1f1b'][0]:.2f} "
              f"({rate[name][1] / rate['1f1b'][1]:.2f} per CPU second)")


def against_torch() -> None:
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    from torch.distributed.pipelining.schedules import _add_send_recv, _simulate_comms_compute

    from pipebubble.interop.torch_csv import parse_torch_csv

    print("2) torch's dry run (_add_send_recv + _simulate_comms_compute) vs our validate + "
          "simulate, same orders")
    cases = [("Interleaved1F1B", 16, 128, 4), ("ZBVZeroBubble", 16, 128, 2),
             ("GPipe", 32, 256, 1), ("Interleaved1F1B", 8, 64, 2), ("DualPipeV", 4, 32, 2)]
    for name, p, m, v in cases:
        rows = [[a for a in row if a is not None and a.computation_type.value not in NO_TIME]
                for row in get_schedule_ops(name, p, m, num_stages_per_rank=v)]
        text = "\n".join(",".join("" if a is None else str(a) for a in row) for row in rows)
        ours = parse_torch_csv(text, name=name, microbatches=m)
        where = ours.stage_to_rank
        compute = rows

        def theirs(compute=compute, where=where):
            lowered = _add_send_recv({r: list(row) for r, row in enumerate(compute)},
                                     lambda s: where[s], len(where))
            _simulate_comms_compute(lowered, lambda s: where[s], len(where))

        def mine(ours=ours):
            fresh = replace(ours)  # validated again each repeat (see section 1)
            validate(fresh)
            simulate(fresh, CostModel(f=1, b=2, w=1))

        try:
            t_theirs = best_of(theirs, 1)
        except Exception as exc:  # torch's dry run does not support every schedule it makes
            print(f"   {name:16s} pp{p} m{m} v{v}: torch dry run failed: "
                  f"{str(exc).splitlines()[0][:60]}")
            continue
        t_mine = best_of(mine)
        print(f"   {name:16s} pp{p:<2d} m{m:<3d} v{v}: {ours.num_actions():6,} actions  ours "
              f"{t_mine[0] * 1e3:7.2f} ms  torch {t_theirs[0] * 1e3:8.2f} ms  ratio "
              f"{t_theirs[0] / t_mine[0]:6.1f}x (CPU {t_theirs[1] / max(t_mine[1], 1e-9):.1f}x)"
              f"  target >= 10x")


def generation_and_gantt() -> None:
    from rich.console import Console

    from pipebubble.render.terminal import gantt

    print("3) the 1M-action 1F1B (p=64, m=8192)")
    t = best_of(lambda: get_schedule("1f1b", 64, 8192))
    print(f"   generate: {fmt(t)}  target < 0.5 s")
    timeline = simulate(get_schedule("1f1b", 64, 8192))
    timeline.rank_stats()

    def draw():
        Console(file=io.StringIO(), width=120, force_terminal=True).print(
            gantt(timeline, width=110))

    t = best_of(draw)
    print(f"   terminal Gantt (64 rows x 110 columns, rendered): {fmt(t)}  target < 0.3 s")


def linear_in_ranks() -> None:
    print("4) linear in ranks: simulate 1F1B with m=1")
    small, big = get_schedule("1f1b", 4000, 1), get_schedule("1f1b", 16000, 1)
    t_small = best_of(lambda: simulate(small))
    t_big = best_of(lambda: simulate(big))
    print(f"   p=4000: {fmt(t_small)}   p=16000: {fmt(t_big)}   ratio "
          f"{t_big[0] / t_small[0]:.1f} for 4x the ranks (quadratic: 16)")


def incremental() -> None:
    import random

    from large_search import TailsCompiled as Compiled

    print("5) incremental re-time of one moved action, ZB-H1 p=16 m=1042, vs a full simulation")
    schedule = get_schedule("zb-h1", 16, 1042)
    costs = CostModel(f=1, b=2, w=1, comm=0.1)
    core = Compiled(schedule, costs)
    n = schedule.num_actions()
    edited = core.schedule()
    full = best_of(lambda: (validate(s := replace(edited)), simulate(s, costs)))[0]
    print(f"   full validate + simulate of {n:,} actions: {full * 1e3:.1f} ms (best of 3)")
    rng = random.Random(0)

    def pick(kinds: str) -> tuple[int, int]:
        while True:
            r = rng.randrange(16)
            order = core.orders[r]
            k = rng.randrange(len(order) - 1)
            a, b = core.steps[order[k]], core.steps[order[k + 1]]
            if (a.kind + b.kind)[:len(kinds)] != kinds:
                continue
            if (a.stage, a.microbatch) == (b.stage, b.microbatch):
                continue  # its own I or W: the rank may not swap them
            return r, k

    def report(label: str, what: str, ratios: list[float], target: str) -> None:
        ratios.sort()
        share = sum(x >= 100 for x in ratios) / len(ratios)
        print(f"   {label:26s} {what:5s}: median {ratios[len(ratios) // 2]:7.1f}x faster, "
              f"{share:4.0%} >= 100x ({len(ratios)} moves)  {target}")

    for label, kinds in (("a W swapped with a W", "WW"), ("a W moved one place", "W"),
                         ("any action moved one place", "")):
        tried, before = [], dict(core.counts)
        while len(tried) < 200:  # the search's pattern: try a move, read the step, undo
            r, k = pick(kinds)
            t0 = time.perf_counter()
            core.swap(r, k, k + 1)
            _ = core.step_time
            core.swap(r, k, k + 1)  # taken back
            tried.append(full / (time.perf_counter() - t0))
        lazy = core.counts["lazy"] - before["lazy"]
        report(label, "tried", tried, "target >= 100x")
        kept = []
        while len(kept) < 30:  # a move kept: re-timed, and the tails refreshed for the next
            r, k = pick(kinds)
            r2, k2 = pick("")
            t0 = time.perf_counter()
            core.swap(r, k, k + 1)
            core.settle()
            core.swap(r2, k2, k2 + 1)  # the next try: refreshes the tails (and answers)
            kept.append(full / (time.perf_counter() - t0))
            core.swap(r2, k2, k2 + 1)  # (untimed: back to the first order, tails refreshed)
            core.swap(r, k, k + 1)
            core.settle()
            core.swap(r2, k2, k2 + 1)
            core.swap(r2, k2, k2 + 1)
        report("", "kept", kept, "(no target)")
        t0 = time.perf_counter()
        for i in range(200):  # a search's mix: every tenth move kept, the others taken back
            r, k = pick(kinds)
            core.swap(r, k, k + 1)
            _ = core.step_time
            if i % 10:
                core.swap(r, k, k + 1)
        core.settle()
        mix = 200 * full / (time.perf_counter() - t0)
        print(f"   {'':26s} {'mix':5s}: {mix:7.1f}x faster than 200 full runs (1 move in 10 "
              f"kept); {lazy} of the 200 tries answered from the tails")


KEPT_CASES = (("zb-h1", 16, 1042, None, False), ("zbv", 16, 528, None, False),
              ("interleaved-1f1b", 16, 784, 2, False), ("zbv", 16, 528, None, True))


def unequal(stages: int, comm: float = 0.1) -> CostModel:
    """Stages 1 to 1.4 times as slow as the fastest (drawn, seeded), B = 2F, W = F."""
    import random

    rng = random.Random(5)
    f = [1 + 0.4 * rng.random() for _ in range(stages)]
    return CostModel(f=f, b=[2 * x for x in f], w=f, comm=comm)


def _by_node(core):
    """(ends, tails) of every action, indexed by node (the tails brought up to date)."""
    import numpy as np

    t = core._tails
    if t.dirty:
        core._update_tails()
    real = np.flatnonzero(core._real)
    pos = np.asarray(core._pos_of)[real]
    return np.asarray(core._end)[pos], t.tails(pos)


def kept_moves(cases=KEPT_CASES, moves: int = 40) -> None:
    """Section 6: kept moves (module docstring)."""
    print("6) kept moves, re-timed forwards and backwards only where ends and tails change "
          "(move, settle, tails brought up to date), vs a full validate + simulate")
    for name, p, m, v, uneven in cases:
        _kept_case(name, p, m, v, uneven, moves)


def _kept_case(name: str, p: int, m: int, v: int | None, uneven: bool, moves: int) -> None:
    """Section 6 on one schedule."""
    import random
    import statistics

    import numpy as np
    from large_search import TailsCompiled as Compiled
    from large_search.critical import tolerance

    schedule = get_schedule(name, p, m, v)
    costs = unequal(schedule.num_stages) if uneven else CostModel(f=1, b=2, w=1, comm=0.1)
    core = Compiled(schedule, costs)
    n = schedule.num_actions()
    edited = core.schedule()
    full = best_of(lambda edited=edited: (validate(s := replace(edited)),
                                          simulate(s, costs)))[0]
    keys = [(st.stage, st.microbatch) for st in core.steps]
    rng = random.Random(1)
    core._tails_ready()
    label = f"{name} p={p} m={m}" + (f" v={v}" if v else "") + \
        (", unequal stages (1-1.4x)" if uneven else "")
    print(f"   {label}: {n:,} actions, full validate + simulate {full * 1e3:.1f} ms")

    def allowed(r, k, to):
        order = core.orders[r]
        lo, hi = (to, k) if to < k else (k + 1, to + 1)
        return 0 <= to < len(order) and all(keys[i] != keys[order[k]]
                                             for i in order[lo:hi])

    def neighbours():
        while True:
            r = rng.randrange(p)
            k = rng.randrange(len(core.orders[r]) - 1)
            if allowed(r, k, k + 1):
                return r, k

    for kind in ("random", "critical"):
        ratios, fe, ft, better = [], [], [], []
        e0 = t0s = None
        crit = core.critical() if kind == "critical" else []
        while len(ratios) < moves:
            if kind == "random":
                r, k = neighbours()
                to = k + 1
            else:
                r, k = crit[rng.randrange(len(crit))]
                to = k + rng.choice((-3, -2, -1, 1, 2, 3))
                if not allowed(r, k, to):
                    continue
            if e0 is None:
                e0, t0s = _by_node(core)
            step = core.step_time
            t0 = time.perf_counter()
            got = core.move(r, k, to)
            if kind == "critical" and got > step + 2 * tolerance(n, step):
                core.move(r, to, k)  # a search would not keep it: taken back
                continue
            core.settle()
            if not core.deadlocked:
                core._tails_ready()  # what the next try needs: the tails up to date
            ratios.append(full / (time.perf_counter() - t0))
            if core.deadlocked:  # (a deadlock kept: back, untimed)
                core.move(r, to, k)
                ratios.pop()
                continue
            e1, t1s = _by_node(core)
            fe.append(float(np.mean(e1 != e0)))
            ft.append(float(np.mean(t1s != t0s)))
            if core.step_time < step:  # (a move that shortens the step)
                better.append(f"{ratios[-1]:.1f}x/{fe[-1]:.0%}/{ft[-1]:.0%}")
            e0, t0s = e1, t1s
            if kind == "critical" and len(ratios) % 10 == 0:
                crit = core.critical()
        ratios.sort()
        q = statistics.quantiles(ratios, n=10)
        what = ("random neighbour swaps kept" if kind == "random" else
                "critical action moved 1-3, kept when not worse")
        share = sum(x >= 20 for x in ratios) / len(ratios)
        print(f"     {what:46s}: median {statistics.median(ratios):7.1f}x "
              f"(p10 {q[0]:.1f}x, p90 {q[-1]:.1f}x), {share:4.0%} >= 20x; ends changed: "
              f"median {statistics.median(fe):6.2%} (max {max(fe):.1%}), tails changed: "
              f"median {statistics.median(ft):6.2%} (max {max(ft):.1%}); "
              f"{len(better)} of {len(ratios)} shortened the step"
              + (f" (speed-up/ends/tails changed: {', '.join(better)})" if better else ""))


T8 = (14316.0, 14306.0, 9639.0, 1619.0)  # bench_auto's Table 8 costs (per chunk F, I, W, comm)
LARGE_CASES = (  # (label, p, m, costs, memory limit, placement)
    *((f"Table 8 p={p} m={m}", p, m,
       CostModel(f=2 * T8[0], b=2 * (T8[1] + T8[2]), w=2 * T8[2], comm=T8[3],
                 weight_memory=1.0), (p + 2) // 2, "v")
      for p, m in ((16, 48), (16, 128), (24, 96), (32, 96), (32, 256))),
    ("ZB Table 9 14.6B p=16 m=128 ZB-1p", 16, 128,
     CostModel(f=11.325, b=11.308 + 8.109, w=8.109, comm=0.378, weight_memory=0.5), 16,
     "loop"),
    ("ZB Table 9 28.3B p=32 m=256 ZB-1p", 32, 256,
     CostModel(f=10.402, b=10.248 + 7.698, w=7.698, comm=0.460, weight_memory=0.5), 32,
     "loop"),
)


def large_search(tries: int = 20000) -> None:
    """Section 7: the local search over large orders (``large_search/search.py``) from
    auto's answer."""
    from large_search import TailsCompiled, local_search

    from pipebubble import auto_schedule

    print(f"7) local search over large orders (large_search/, at most {tries:,} moves) from "
          "auto's answer")
    print(f"   {'setting':34s} {'actions':>7s} {'auto s':>6s} {'auto step':>12s} "
          f"{'searched':>12s} {'gain':>7s} {'gap before/after':>17s} {'search s':>8s} "
          f"{'tried':>6s} {'kept':>9s} {'moves/s':>7s}  kept move vs a full run: median "
          "(min-max)")
    for label, p, m, costs, limit, placement in LARGE_CASES:
        t0 = time.perf_counter()
        s = auto_schedule(p, m, costs, memory_limit=limit, placement=placement)
        secs = time.perf_counter() - t0
        info = s.options["auto"]
        out = local_search(s, costs, limit, tries=tries)
        assert simulate(out.schedule, costs).step_time == out.step_time
        full = best_of(lambda s=s, costs=costs: (validate(x := replace(s)),
                                                 simulate(x, costs)))[0]
        ks = sorted(full / x for x in out.kept_seconds)
        kept = (f"{ks[len(ks) // 2]:.1f}x ({ks[0]:.1f}-{ks[-1]:.1f}x)" if ks else "-")
        bound = info["lower_bound"]
        gain = (out.start_time - out.step_time) / out.start_time
        print(f"   {label:34s} {s.num_actions():>7,} {secs:6.2f} {out.start_time:12.1f} "
              f"{out.step_time:12.1f} {gain:7.3%} {(out.start_time - bound) / bound:8.2%}/"
              f"{(out.step_time - bound) / bound:.2%} {out.seconds:8.2f} {out.tried:6,} "
              f"{out.kept:4d}/{out.sideways:<4d} {out.tried / out.seconds:7.0f}  {kept}")
    for name, p, m in (("zb-h1", 16, 1042), ("zbv", 16, 528)):  # registered orders
        s = get_schedule(name, p, m)
        costs = unequal(s.num_stages)
        out = local_search(s, costs, tries=tries)
        full = best_of(lambda s=s, costs=costs: (validate(x := replace(s)),
                                                 simulate(x, costs)))[0]
        ks = sorted(full / x for x in out.kept_seconds)
        kept = (f"{ks[len(ks) // 2]:.1f}x ({ks[0]:.1f}-{ks[-1]:.1f}x)" if ks else "-")
        gain = (out.start_time - out.step_time) / out.start_time
        print(f"   {name + ' unequal, registered start':34s} {s.num_actions():>7,} {'-':>6s} "
              f"{out.start_time:12.1f} {out.step_time:12.1f} {gain:7.3%} {'-':>17s} "
              f"{out.seconds:8.2f} {out.tried:6,} {out.kept:4d}/{out.sideways:<4d} "
              f"{out.tried / out.seconds:7.0f}  {kept}")
    # The same search with every move re-timed (no answers from the tails), a few moves:
    label, p, m, costs, limit, placement = LARGE_CASES[1]
    s = auto_schedule(p, m, costs, memory_limit=limit, placement=placement)
    rates = []
    for tails_from in (TailsCompiled.TAILS_FROM, 10 ** 9):
        TailsCompiled.TAILS_FROM = tails_from
        try:
            out = local_search(s, costs, limit, tries=500)
        finally:
            TailsCompiled.TAILS_FROM = 4096
        rates.append(out.tried / out.seconds)
    print(f"   {label}, 500 moves: {rates[0]:.0f} moves/s answered from the tails, "
          f"{rates[1]:.0f} moves/s each re-timed: {rates[0] / rates[1]:.1f}x")


if __name__ == "__main__":
    if sys.argv[1:] == ["incremental"]:
        incremental()
        raise SystemExit
    if sys.argv[1:] == ["kept"]:
        kept_moves()
        raise SystemExit
    if sys.argv[1:] == ["large"]:
        large_search()
        raise SystemExit
    throughput()
    against_torch()
    generation_and_gantt()
    linear_in_ranks()
    incremental()
    kept_moves()
    large_search()
