"""Time the planner: a 32-layer analytic model on 64 GPUs (target: the whole search < 10 s).

The model is LLaMA-7B's shape (32 blocks, h 4096, FFN 11008, 32 heads, vocab 32000) at
sequence 4096 on 80 GiB GPUs (989 TFLOP/s x 40 % MFU), global batch 512, microbatch sizes
1, 2, 4, every registered schedule (and auto when available), chunks <= 4, recomputation
none and full. Baseline, timed in the same run: the same search with pruning off (every
configuration simulated). Both must return the same plans; the script prints both times,
configurations per second (Calculon: ~430/s) and the ratio.

With ``--validate``: also plan a small model for 4 GPUs and run its top 3 plans for real
(``pipebubble plan --validate 3``), printing each plan's predicted and measured step and
whether the top plan is within 15 % of its prediction and within 5 % of the best measured.

With ``--cut-gap N`` (instead): how far the min-max cut rule the planner uses beyond
``--exhaustive-cuts`` is from the best cut, on N random small instances.

With ``--scale`` (instead): every axis (tp with and without SP, cp, pp, dp, sharding,
microbatch size, every schedule family and auto, chunks, recompute) for LLaMA-3 405B's shape
(126 blocks, h 16384, FFN 53248, 128 heads, 8 K/V heads, vocab 128256, sequence 8192) on
16,384 H100s, global batch 2048; target < 10 s. Each repeat starts cold (no schedule
generated, no auto answer remembered: :func:`cold`), as a fresh process would; it prints the
automatic scheduler's share of the time. ``--no-auto`` leaves auto out. It prints
the top 5 plans exactly; ``--save-top FILE`` writes them and ``--compare-top FILE`` checks
them against a file another version wrote (pruning must never change them).

    python bench/bench_plan.py [--repeats 3] [--validate [--target-step 1.0]] [--cut-gap N]
    python bench/bench_plan.py --scale [--no-auto] [--gpus 16384] [--repeats 1]
                               [--save-top FILE | --compare-top FILE]
    python bench/bench_plan.py --table [all | gpt-1t:512:unfused,llama-7b:64,...]
                               [--jobs N] [--save-top FILE | --compare-top FILE]
    python bench/bench_plan.py --config [all | gpt-1t:512,...] [--no-baseline]

With ``--table``: a full search (every axis, auto included) per dense shape and scale
(LLaMA-7B on 64 A100s up to a 2T GPT shape on 16,384 H100s, flash and unfused attention),
and DeepSeek-V3 (MoE) on 2,048 H800s as bench/bench_deepseek_v3.py plans it but with auto
in the candidate set (row ``deepseek-v3:2048``): wall and CPU seconds, configurations
priced, simulations run and auto's searches; the target (under 10 s) is checked on the
CPU seconds, which a loaded machine inflates less than the wall. With ``--jobs N`` (default:
the CPUs this process may use) each row runs again over N worker processes
(``plan --jobs``), in a fresh Python process as ``plan`` runs it (forked from this one,
whose heap holds the first search's leavings, the workers ran slower): its wall beside the
one-process CPU seconds, the ratio, whether its top plans are the same (the run stops if
not), and the target judged on that wall, at the load printed beside it (other work on the
machine inflates it).

With ``--config``: ``pipebubble plan --config`` (in-process, after the imports, each run
cold) on a published-like configuration per shape (:data:`CONFIG_ROWS`: GPT-1T on 512
A100s, GPT-3 175B on 1,024, LLaMA-3 405B on 16,384 H100s, and GPT-3 175B with
``schedule=auto``, one search of the automatic scheduler): the configuration priced on its
own and ranked by the bounds (target < 1 s of CPU), against the same command with
``--exact-rank`` (the full search, what ``--config`` cost before) timed in the same run,
the ratio, the rank interval and, when the full search shows it, the exact rank.
"""

from __future__ import annotations

import argparse
import os
import time

from pipebubble.limits import available_cores
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, search


def cold() -> None:
    """Forget the generated schedules (the registry's cache), auto's remembered answers and
    every function-level cache (``functools.lru_cache``) of the loaded ``pipebubble``
    modules (auto's blocks and orders, building_block's kept builds and reorders, the cut
    price's tables, ...), so that a repeat in this process costs what a fresh process's
    run does."""
    import sys

    from pipebubble.schedules import registry

    registry._cache.clear()
    registry._cached_actions = 0
    from pipebubble.sim import program

    program._peaks_kept.clear()  # the orders' peaks by memory table
    from pipebubble.ir import check

    check._checked.clear()  # the schedules known valid
    for name, module in list(sys.modules.items()):
        if name.startswith("pipebubble.") and module is not None:
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)) and hasattr(
                        value, "cache_info"):
                    value.cache_clear()
    try:
        from pipebubble.schedules import auto
    except ImportError:
        return
    auto._REMEMBERED.clear()
    if hasattr(auto, "_RUNS"):  # the registered schedules' scores
        auto._RUNS.clear()
    if hasattr(auto.bounds, "_PATHS"):  # the bounds' paths per costs
        auto.bounds._PATHS.clear()
    if hasattr(auto.adaptive, "_KEPT"):
        auto.adaptive._KEPT.clear()
        auto.adaptive._kept_actions = 0


def best_of(repeats: int, fn, reset=None):
    """(fastest wall-clock seconds, the CPU seconds of that run, the result); ``reset``
    runs before each repeat, untimed."""
    times, out = [], None
    for _ in range(repeats):
        if reset is not None:
            reset()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    wall, cpu = min(times)
    return wall, cpu, out


def bench_search(repeats: int) -> None:
    prof = ProfileSet([analytic_profile(layers=32, hidden=4096, ffn=11008, heads=32,
                                        vocab=32000, seq=4096, batch=1, tflops=989, mfu=0.4)])
    req = Request(gpus=64, gpu_memory=80 * 2**30, global_batch=512, microbatch_sizes=(1, 2, 4),
                  max_chunks=4, recompute=("none", "full"), top=5)
    fast_t, fast_cpu, fast = best_of(repeats, lambda: search(prof, req))
    slow_t, slow_cpu, slow = best_of(1, lambda: search(prof, Request(**{**req.__dict__,
                                                                       "prune": False})))
    same = top_lines(fast.plans) == top_lines(slow.plans)  # every field, cut, step, peak
    n = fast.searched
    print(f"LLaMA-7B shape (34 layers), 64 GPUs x 80 GiB, global batch 512: {n} configurations")
    print(f"  planner (bounds prune):   {fast_t:7.2f} s  (best of {repeats}; CPU {fast_cpu:.2f} s)"
          f"  {n / fast_t:6.0f} configurations/s, {fast.simulated} simulations")
    print(f"  every configuration simulated: {slow_t:7.2f} s (CPU {slow_cpu:.2f} s)  "
          f"{n / slow_t:6.0f} configurations/s, {slow.simulated} simulations")
    print(f"  speed-up {slow_t / fast_t:.1f}x; same plans: {same}; target under 10 s: "
          f"{'met' if fast_t < 10 else 'MISSED'}")
    b = fast.plans[0]
    print(f"  best: pp={b.pp} dp={b.dp} {b.schedule} v={b.chunks} microbatch {b.microbatch_size}"
          f" (m={b.microbatches}) recompute {b.recompute}: {b.step_time:.3f} s/step, "
          f"{b.samples_per_second:.1f} samples/s, peak {max(b.peak_memory) / 2**30:.1f} GiB")
    if not same:
        raise SystemExit("pruning changed the plans")


def bench_scale(gpus: int, auto: bool, repeats: int = 1, save_top: str | None = None,
                compare_top: str | None = None) -> None:
    from pipebubble.plan.analytic import TransformerShape, shape_profile
    from pipebubble.plan.hardware import get_hardware
    from pipebubble.plan.planner import schedule_list

    shape = TransformerShape(layers=126, hidden=16384, ffn=53248, heads=128, vocab=128256,
                             kv_heads=8)
    prof = ProfileSet([shape_profile(shape, 8192, 1)])
    hw = get_hardware("h100-sxm")
    names = None if auto else tuple(n for n in schedule_list(None) if n != "auto")
    req = Request(gpus=gpus, gpu_memory=hw.memory * 0.95, global_batch=2048,
                  recompute=("none", "full"), schedules=names, top=5)  # as plan --gpu does:
    # with FlashAttention selective keeps what none keeps and re-runs attention
    load = os.getloadavg()[0]
    wall, cpu, res = best_of(repeats, lambda: search(prof, req, hw), cold)  # each run cold
    b = res.plans[0]
    print(f"LLaMA-3 405B shape, {gpus} x h100-sxm, global batch 2048, every axis"
          f"{'' if auto else ' (auto left out)'}: {res.searched} configurations, "
          f"{res.simulated} simulations in {wall:.1f} s (best of {repeats}; CPU {cpu:.1f} s; "
          f"load {load:.1f} on {os.cpu_count()} CPUs): {res.searched / wall:.0f} "
          f"configurations/s; target under 10 s: {'met' if wall < 10 else 'MISSED'}")
    if auto:
        print(f"  the automatic scheduler searched {res.auto_runs} orders in "
              f"{res.auto_seconds:.1f} s (the rest: {wall - res.auto_seconds:.1f} s)")
    print(f"  best: tp={b.tp}{' sp' if b.sp else ''} cp={b.cp} pp={b.pp} dp={b.dp} {b.sharding} "
          f"{b.schedule} v={b.chunks} mbs={b.microbatch_size} recompute {b.recompute}: "
          f"{b.step_time:.3f} s/step, peak {max(b.peak_memory) / 2**30:.1f} GiB")
    lines = top_lines(res.plans)
    print("  top plans (every field, step and peak to the last digit; --save-top adds the cuts):")
    for line in lines:
        print("    " + line.split(" ranges=")[0])
    if save_top:
        with open(save_top, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    if compare_top:
        with open(compare_top) as f:
            before = f.read().splitlines()
        same = before == lines
        print(f"  the same top {len(lines)} plans as {compare_top}: {same}")
        if not same:
            raise SystemExit("the top plans changed")


SHAPES = {  # name: (layers, hidden, ffn, heads, kv heads, vocab, sequence, GPU preset)
    "llama-7b": (32, 4096, 11008, 32, 32, 32000, 4096, "a100-80gb"),
    "gpt-175b": (96, 12288, 4 * 12288, 96, 96, 51200, 2048, "a100-80gb"),
    "gpt-1t": (128, 25600, 4 * 25600, 160, 160, 51200, 2048, "a100-80gb"),
    "llama3-405b": (126, 16384, 53248, 128, 8, 128256, 8192, "h100-sxm"),
    "gpt-2t": (160, 32768, 4 * 32768, 256, 256, 51200, 2048, "h100-sxm"),
}
TABLE = [  # (shape, GPUs, attention): the --table rows
    ("llama-7b", 64, "flash"), ("gpt-175b", 1024, "flash"), ("gpt-1t", 512, "flash"),
    ("gpt-1t", 512, "unfused"), ("llama3-405b", 16384, "flash"), ("gpt-2t", 16384, "flash"),
    ("llama3-405b", 2048, "unfused"),  # the slowest row found (2026-12-07): memory-bound auto
    ("deepseek-v3", 2048, "flash"),
]


def moe_case():
    """DeepSeek-V3 on 2,048 H800s as bench/bench_deepseek_v3.py plans it (its config,
    sequence 4,096, global batch 15,360, FP8, bf16 weights / fp32 gradients / fp32 master +
    bf16 Adam states, microbatch sizes 1 and 2, the H100 efficiency fitted to Llama 3 405B),
    with every schedule, auto included: (profiles, request, hardware, efficiency)."""
    from dataclasses import replace

    from bench_deepseek_v3 import BATCH, DEEPSEEK_V3, GPUS, SEQ, STATES

    from pipebubble.plan.hardware import get_hardware
    from pipebubble.plan.moe import moe_profile, moe_shape_from_hf
    from pipebubble.plan.published import h100_efficiency

    eff = h100_efficiency()
    shape, _ = moe_shape_from_hf(DEEPSEEK_V3)
    prof = ProfileSet([moe_profile(shape, SEQ, 1)])
    hw = replace(get_hardware("h800"), efficiency=eff)
    req = Request(gpus=GPUS, gpu_memory=hw.memory * 0.95, global_batch=BATCH,
                  microbatch_sizes=(1, 2), recompute=None, precision="fp8",
                  state_bytes=STATES, grad_bytes=4.0, top=5)
    return prof, req, hw, eff


def bench_table(rows: list[tuple[str, int, str]], repeats: int = 1,
                save_top: str | None = None, compare_top: str | None = None,
                jobs: int = 1) -> None:
    """One full search per row (a dense shape of :data:`SHAPES` on that many GPUs of its
    preset, global batch 2048, recompute none and full, every axis, auto included), each
    cold: wall and CPU seconds, configurations priced, simulations run, auto's searches
    and their seconds; target under 10 s. ``save_top`` / ``compare_top``: each row's top
    plans (:func:`top_lines`, under the row's name) written to / checked against a file
    another version wrote, row by row (rows not in the file are not checked). With ``jobs``
    > 1 each row also runs over that many worker processes (``Request.jobs``), cold too:
    its wall seconds beside the one-process CPU seconds, their ratio, the same plans (or
    the run stops), and the target judged on that wall at the printed load."""
    saved: dict[str, list[str]] = {}
    if compare_top:
        with open(compare_top) as f:
            for line in f.read().splitlines():
                row, _, plan = line.partition(" | ")
                saved.setdefault(row, []).append(plan)
    written, changed = [], []

    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; each row cold, best of "
          f"{repeats}" + (f"; then over {jobs} worker processes, cold" if jobs > 1 else ""))
    print(f"{'shape':<12} {'GPUs':>6} {'attention':<8} {'wall s':>7} {'CPU s':>7} "
          f"{'configs':>8} {'simulated':>9} {'auto':>5} {'auto s':>7}  best")
    for name, gpus, attention in rows:
        prof, req, hw, eff = row_case(name, gpus, attention)
        wall, cpu, res = best_of(
            repeats, lambda prof=prof, req=req, hw=hw, eff=eff: search(prof, req, hw, eff),
            cold)
        b = res.plans[0]
        print(f"{name:<12} {gpus:>6} {attention:<8} {wall:>7.1f} {cpu:>7.1f} "
              f"{res.searched:>8} {res.simulated:>9} {res.auto_runs:>5} "
              f"{res.auto_seconds:>7.1f}  tp={b.tp}{' sp' if b.sp else ''} cp={b.cp} "
              f"pp={b.pp} dp={b.dp} {b.sharding} {b.schedule} v={b.chunks} "
              f"mbs={b.microbatch_size} {b.recompute} {b.step_time:.3f} s"
              + ("" if jobs > 1 else f"; target under 10 s: {'met' if cpu < 10 else 'MISSED'}"),
              flush=True)
        if jobs > 1:  # in a fresh process, as plan runs it (this one's heap is the first
            # search's: its workers would fork from it)
            got = [child_search(name, gpus, attention, jobs) for _ in range(repeats)]
            pwall, simulated, auto_runs, auto_s, lines = min(got)
            same = lines == top_lines(res.plans)
            print(f"  {jobs} jobs: wall {pwall:.1f} s (one process {cpu:.1f} CPU s: "
                  f"x{cpu / pwall:.2f}, efficiency {cpu / pwall / jobs:.0%}) at load "
                  f"{os.getloadavg()[0]:.1f}; simulated {simulated}, auto "
                  f"{auto_runs} in {auto_s:.1f} s; the same top plans: "
                  f"{same}; target under 10 s: {'met' if pwall < 10 else 'MISSED'}",
                  flush=True)
            if not same:
                changed.append(f"{name}:{gpus}:{attention} (jobs {jobs})")
        row = f"{name}:{gpus}:{attention}"
        lines = top_lines(res.plans)
        written += [f"{row} | {line}" for line in lines]
        if row in saved:
            same = saved[row] == lines
            print(f"  the same top {len(lines)} plans as {compare_top}: {same}", flush=True)
            if not same:
                changed.append(row)
    if save_top:
        with open(save_top, "w") as f:
            f.write("".join(line + "\n" for line in written))
    if changed:
        raise SystemExit(f"the top plans changed: {', '.join(changed)}")


def row_case(name: str, gpus: int, attention: str):
    """(profiles, request, hardware, efficiency) of a --table row: a dense shape of
    :data:`SHAPES` on ``gpus`` of its preset (global batch 2048, recompute none and full,
    every axis, auto in), or the MoE row (:func:`moe_case`)."""
    from pipebubble.plan.analytic import TransformerShape, shape_profile
    from pipebubble.plan.hardware import get_hardware

    if name == "deepseek-v3":  # the MoE row (bench_deepseek_v3.py's search, auto in)
        return moe_case()
    layers, hidden, ffn, heads, kv, vocab, seq, gpu = SHAPES[name]
    shape = TransformerShape(layers=layers, hidden=hidden, ffn=ffn, heads=heads,
                             vocab=vocab, kv_heads=kv)
    prof = ProfileSet([shape_profile(shape, seq, 1, attention=attention)])
    hw = get_hardware(gpu)
    req = Request(gpus=gpus, gpu_memory=hw.memory * 0.95, global_batch=2048,
                  recompute=("none", "full"), top=5)
    return prof, req, hw, None


def child_search(name: str, gpus: int, attention: str, jobs: int) -> tuple:
    """A row's search over ``jobs`` workers in a fresh Python process (``--child``), as
    ``plan`` runs it: (wall s, simulated, auto's searches, their seconds, top lines)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, __file__, "--child", f"{name}:{gpus}:{attention}",
                          "--jobs", str(jobs)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return (got["wall"], got["simulated"], got["auto_runs"], got["auto_seconds"],
            got["top"])


def child(row: str, jobs: int) -> None:
    """--child: one row's search over ``jobs`` workers, timed, as one JSON line."""
    import json
    from dataclasses import replace

    name, gpus, attention = row.split(":")
    prof, req, hw, eff = row_case(name, int(gpus), attention)
    t0 = time.perf_counter()
    res = search(prof, replace(req, jobs=jobs), hw, eff)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall": wall, "simulated": res.simulated, "auto_runs": res.auto_runs,
                      "auto_seconds": res.auto_seconds, "top": top_lines(res.plans)}))


CONFIG_ROWS = [  # (shape, GPUs, attention, --config): the --config rows
    ("gpt-1t", 512, "flash",
     "tp=8,pp=16,dp=4,sharding=zero1,mbs=1,schedule=interleaved-1f1b,v=2,recompute=full"),
    ("gpt-175b", 1024, "flash",
     "tp=8,pp=8,dp=16,sharding=zero1,mbs=1,schedule=interleaved-1f1b,v=2,recompute=full"),
    ("llama3-405b", 16384, "flash",
     "tp=8,cp=1,pp=16,dp=128,sharding=fsdp,mbs=1,schedule=interleaved-1f1b,v=2,"
     "recompute=none"),
    ("gpt-175b", 1024, "flash",  # the automatic scheduler's order (one auto search)
     "tp=4,sp=1,pp=16,dp=16,sharding=zero2,mbs=1,schedule=auto,v=2,recompute=none"),
]


def bench_config(rows, baseline: bool = True) -> None:
    """``plan --config`` against ``plan --config --exact-rank`` (module doc), each through
    the command line's own code (``pipebubble.cli.main``, output captured), cold."""
    import contextlib
    import io
    import json
    import tempfile

    from pipebubble.cli import main as cli
    from pipebubble.commands import plan as _plan_command  # noqa: F401  (imports, untimed)
    from pipebubble.plan import bound_rank as _bound_rank  # noqa: F401

    def run(argv: list[str]) -> tuple[float, float, dict]:
        cold()
        buf = io.StringIO()
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(buf):
            rc = cli(argv)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if rc != 0:
            raise SystemExit(f"plan {' '.join(argv)} exited {rc}")
        return wall, cpu, json.loads(buf.getvalue())

    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; plan --config in-process "
          "after the imports, each run cold; target < 1 s of CPU")
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the CSV orders the pastes write land there
        try:
            _config_rows(rows, baseline, tmp, run)
        finally:
            os.chdir(here)


def _config_rows(rows, baseline: bool, tmp: str, run) -> None:
    """:func:`bench_config`'s rows, in ``tmp``."""
    from pipebubble.plan.analytic import TransformerShape, shape_profile

    warm = os.path.join(tmp, "warm.json")  # the lazy imports of one run, untimed
    shape_profile(TransformerShape(layers=2, hidden=256, ffn=688, heads=4, vocab=1000),
                  256, 1).save(warm)
    run(["plan", "--profile", warm, "--gpus", "8", "--gpu", "h100-sxm", "--global-batch",
         "16", "--config", "tp=1,pp=2,dp=4", "--json"])
    for name, gpus, attention, text in rows:
        layers, hidden, ffn, heads, kv, vocab, seq, gpu = SHAPES[name]
        shape = TransformerShape(layers=layers, hidden=hidden, ffn=ffn, heads=heads,
                                 vocab=vocab, kv_heads=kv)
        path = os.path.join(tmp, f"{name}.json")
        shape_profile(shape, seq, 1, attention=attention).save(path)
        argv = ["plan", "--profile", path, "--gpus", str(gpus), "--gpu", gpu,
                "--global-batch", "2048", "--recompute", "none,full", "--config", text,
                "--json"]
        wall, cpu, out = run(argv)
        cfg = out["config"]
        rb = cfg.get("rank_bounds") or {}
        print(f"{name} on {gpus} x {gpu} ({attention}), --config {text}:")
        print(f"  --config:             {wall:7.2f} s wall, {cpu:6.2f} s CPU "
              f"({'met' if cpu < 1 else 'MISSED'} < 1 s); step "
              f"{cfg['predicted_step_time']:.3f} s; rank #{rb.get('low')}..#"
              f"{rb.get('high')} of {rb.get('considered')} configurations "
              f"({rb.get('faster')} of {rb.get('priced')} priced faster, "
              f"{rb.get('could_be_faster')} could be faster, {rb.get('slower')} slower, "
              f"{rb.get('cannot_fit')} cannot fit); bounds {rb.get('seconds', 0):.2f} s",
              flush=True)
        if not baseline:
            continue
        b_wall, b_cpu, b_out = run([*argv, "--exact-rank"])
        same = b_out["config"]["predicted_step_time"] == cfg["predicted_step_time"]
        exact = b_out["config"]["rank"]
        held = exact is None or rb.get("low", 1) <= exact <= rb.get("high", exact)
        print(f"  --exact-rank (full):  {b_wall:7.2f} s wall, {b_cpu:6.2f} s CPU; "
              f"{b_out['searched']} configurations, {b_out['simulated']} simulations; "
              f"--config is {b_wall / wall:.0f}x faster (CPU {b_cpu / cpu:.0f}x); same "
              f"step: {same}; exact rank "
              f"{'#' + str(exact) if exact else b_out['config']['rank_note']}"
              f"{'' if held else ' OUTSIDE the bounds interval'}", flush=True)
        if not same or not held:
            raise SystemExit("plan --config disagrees with the full search")
        top = b_out["plans"][0]  # the search's best, asked for: its interval holds #1
        text = (f"tp={top['tp']},sp={int(top['sp'])},cp={top['cp']},pp={top['pp']},"
                f"dp={top['dp']},sharding={top['sharding']},mbs={top['microbatch_size']},"
                f"schedule={top['schedule']},v={top['chunks']},"
                f"recompute={top['recompute']}")
        t_wall, t_cpu, t_out = run([*argv[:-3], "--config", text, "--json"])
        trb = t_out["config"]["rank_bounds"]
        ok = (trb["low"] == 1 and t_out["config"]["predicted_step_time"]
              == top["predicted_step_time"])
        print(f"  the search's #1 as --config ({text}): {t_wall:.2f} s wall, {t_cpu:.2f} s "
              f"CPU; rank #{trb['low']}..#{trb['high']} ({trb['could_be_faster']} could "
              f"be faster; best bound {trb['best_bound_vs_step'] or 0:+.1%}); "
              f"{'holds #1' if ok else 'DOES NOT hold #1'}", flush=True)
        if not ok:
            raise SystemExit("plan --config disagrees with the full search")


def top_lines(plans) -> list[str]:
    """One line per plan: its configuration, cut, step and peak, exactly (repr)."""
    return [f"tp={p.tp} sp={p.sp} cp={p.cp} pp={p.pp} dp={p.dp} {p.sharding} {p.schedule} "
            f"v={p.chunks} mbs={p.microbatch_size} m={p.microbatches} {p.recompute} "
            f"cut={p.cut_search}/{len(p.ranges)} step={p.step_time!r} "
            f"peak={max(p.peak_memory)!r} ranges={p.ranges}"
            for p in plans]


def bench_validate(target: float) -> None:
    from pipebubble.plan.validate import fits_here, validate

    prof = ProfileSet([analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000,
                                        seq=1024, batch=1, tflops=300, mfu=0.4)])
    res = search(prof, Request(gpus=4, gpu_memory=4 * 2**30, global_batch=16, top=10))
    runs = validate([p for p in res.plans if fits_here(p, 8)][:3], target=target)
    print("validation: 8-block model (h 1024), 4 GPUs x 4 GiB, global batch 16, top 3 run "
          "for real (auto orders from their CSV); measured = median of the steps")
    m = runs[0].machine
    print(f"  this machine: {m.overhead * 1e3:.2f} ms per action, {m.hop * 1e3:.2f} ms per "
          f"message (calibration run at 1/50 scale: {m.empty_step * 1e3:.1f} ms); "
          f"scale {runs[0].scale:.3g}")
    measured = [v.measured for v in runs if v.measured is not None]
    for k, v in enumerate(runs):
        p = v.plan
        got = "failed: " + (v.error or "") if v.measured is None else (
            f"measured {v.measured * 1e3:7.1f} ms ({v.measured / v.predicted - 1:+.1%}; "
            f"fastest {v.measured_min * 1e3:.1f} ms, {len(v.steps)} steps)")
        print(f"  #{k + 1} pp={p.pp} dp={p.dp} {p.schedule:>16} v={p.chunks} m={p.microbatches:<3}"
              f" predicted {v.predicted * 1e3:7.1f} ms  {got}")
    top = runs[0]
    if top.measured is not None and measured:
        err = top.measured / top.predicted - 1
        vs = top.measured / min(measured) - 1
        print(f"  top plan: {err:+.1%} from its prediction (target within 15 %: "
              f"{'met' if abs(err) <= 0.15 else 'MISSED'}), {vs:+.1%} from the best measured "
              f"(target within 5 %: {'met' if vs <= 0.05 else 'MISSED'})")


def bench_cut_gap(instances: int, seed: int = 0) -> None:
    """How far the min-max cut rule is from the best cut: random models of 8-12 layers on 4
    or 8 GPUs (every registered family, chunks <= 2, random memory budgets), the best plan
    with the rule for every configuration (``exhaustive_cuts=0``) against the best plan with
    every cut scored (``exhaustive_cuts`` unbounded; tests/test_plan.py checks that branch
    against brute force)."""
    import random

    from pipebubble.plan.planner import NoPlanFits, schedule_list
    from pipebubble.plan.profile import Profile

    rng = random.Random(seed)
    families = tuple(n for n in schedule_list(None) if n != "auto")
    gaps, kinds, t_rule, t_all = [], {}, 0.0, 0.0
    while len(gaps) < instances:
        layers = [{"name": f"l{i}", "forward": f, "backward": f + rng.randint(1, 6),
                   "params": rng.randint(0, 50), "activation_bytes": rng.randint(0, 40),
                   "flops": 0} for i, f in enumerate(rng.randint(1, 4)
                                                     for _ in range(rng.randint(8, 12)))]
        prof = ProfileSet([Profile.from_dict({"batch": 1, "layers": layers})])
        req = Request(gpus=rng.choice([4, 8]), gpu_memory=rng.randint(300, 4000),
                      global_batch=rng.choice([8, 16]), microbatch_sizes=(1, 2), max_chunks=2,
                      recompute=("none",), bytes_per_param=2, grad_bytes=1,
                      allreduce_bandwidth=1e3, p2p_bandwidth=1e9, latency=0.01, top=1,
                      schedules=families)
        try:
            t0 = time.process_time()
            rule = search(prof, Request(**{**req.__dict__, "exhaustive_cuts": 0})).plans[0]
            t1 = time.process_time()
            best = search(prof, Request(**{**req.__dict__, "exhaustive_cuts": 10**12})).plans[0]
            t2 = time.process_time()
        except NoPlanFits:
            continue
        t_rule, t_all = t_rule + t1 - t0, t_all + t2 - t1
        gaps.append(rule.step_time / best.step_time - 1)
        kinds[rule.cut_search] = kinds.get(rule.cut_search, 0) + 1
    gaps.sort()
    same = sum(g <= 1e-12 for g in gaps)
    print(f"cut rule vs every cut: {instances} random instances (8-12 layers, 4 or 8 GPUs, "
          f"seed {seed}): the rule's best plan is the optimum in {same}; gap median "
          f"{gaps[len(gaps) // 2]:.2%}, 95th percentile {gaps[int(0.95 * (len(gaps) - 1))]:.2%},"
          f" mean {sum(gaps) / len(gaps):.2%}, worst {gaps[-1]:.2%}; CPU {t_rule:.1f} s (rule) "
          f"vs {t_all:.1f} s (every cut); "
          f"best plans' cuts: {kinds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs to take the best of (3; --scale: 1)")
    ap.add_argument("--validate", action="store_true",
                    help="also run the top 3 plans of a small model for real (minutes)")
    ap.add_argument("--target-step", type=float, default=1.0,
                    help="--validate: seconds the first plan's step sleeps (1.0)")
    ap.add_argument("--scale", action="store_true", help="405B on 16,384 GPUs, every axis")
    ap.add_argument("--no-auto", action="store_true", help="--scale without auto")
    ap.add_argument("--gpus", type=int, default=16384, help="--scale: GPUs (16384)")
    ap.add_argument("--save-top", metavar="FILE",
                    help="--scale, --table: write the top plans' lines")
    ap.add_argument("--compare-top", metavar="FILE",
                    help="--scale, --table: check the top plans against lines --save-top wrote "
                    "(another version's run), exit 1 if they differ")
    ap.add_argument("--cut-gap", type=int, default=0, metavar="N",
                    help="also compare the min-max cut rule with every cut on N random "
                    "small instances")
    ap.add_argument("--table", nargs="?", const="all", default=None, metavar="ROWS",
                    help="a full search per shape and scale (all, or a comma list of "
                    "SHAPE:GPUS[:unfused], shapes " + ", ".join(SHAPES) + ")")
    ap.add_argument("--jobs", type=int, default=available_cores(), metavar="N",
                    help="--table: also search over N worker processes (the CPUs this "
                    "process may use; 1: one process only)")
    ap.add_argument("--config", nargs="?", const="all", default=None, metavar="ROWS",
                    help="plan --config against plan --config --exact-rank (all, or a comma "
                    "list of SHAPE:GPUS of " + ", ".join(r[0] for r in CONFIG_ROWS) + ")")
    ap.add_argument("--no-baseline", action="store_true",
                    help="--config: skip the full searches (--exact-rank)")
    ap.add_argument("--child", metavar="ROW", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.jobs)
        return
    if args.config:
        rows = CONFIG_ROWS if args.config == "all" else [
            r for x in args.config.split(",") for r in CONFIG_ROWS
            if (r[0], r[1]) == (x.split(":")[0], int(x.split(":")[1]))]
        bench_config(rows, not args.no_baseline)
        return
    if args.table:
        rows = TABLE if args.table == "all" else [
            (x.split(":")[0], int(x.split(":")[1]),
             x.split(":")[2] if x.count(":") > 1 else "flash") for x in args.table.split(",")]
        bench_table(rows, args.repeats or 1, args.save_top, args.compare_top, args.jobs)
        return
    if args.scale:
        bench_scale(args.gpus, not args.no_auto, args.repeats or 1, args.save_top,
                    args.compare_top)
        return
    if args.cut_gap:
        bench_cut_gap(args.cut_gap)
        return
    bench_search(args.repeats or 3)
    if args.validate:
        bench_validate(args.target_step)


if __name__ == "__main__":
    main()
