"""The planner against published training runs beyond Megatron-LM's SC'21 Table 1.

Korthikanti et al. 2022 (A100: 22B, GPT-3 175B, MT-NLG 530B, 1T with TP, SP, PP and selective
recomputation), MT-NLG 530B as trained (A100, DeepSpeed's 1F1B pipeline, TP 8 PP 35 on 2,240 /
2,800 / 3,360 GPUs), GPT-NeoX-20B (96 A100 40 GB, TP 2 PP 4 DP 12, ZeRO-1), BLOOM-176B (A100,
TP 4 PP 12 DP 8, ZeRO-1), Llama 3 405B (H100, 8,192 and 16,384 GPUs, TP 8, CP 1 or 16, PP 16)
and torchtitan's Llama 3.1 8B FSDP runs, every number stored with its source in
``bench/published/`` (read by ``pipebubble.plan.published``). One efficiency per (GPU,
framework), fitted on one run each (``published.FRAMEWORK_FITS``, as bench/bench_frameworks.py
fits it): Megatron-LM's A100 on its 18.4B Table 1 row, H100 on the Llama 3 16,384-GPU 8K
row, torchtitan's on its 8-GPU run, DeepSpeed's A100 on GPT-NeoX-20B; every other row is
predicted, and the column at one efficiency per GPU (Megatron-LM's) is beside it. Each row
is planned at its published configuration (``plan --config``: what the source does not give
is searched) at the GPU's physical memory, since the
run ran; the memory column gives the peak rank's need against the planner's default 5 % reserve
and the physical memory, and the next what the planner prices for the configuration under the
reserve. Then it is ranked among the planner's own plans at the same physical memory (a full
search: every axis, every schedule family but auto), with the planner's pick and how much
faster it predicts its pick to be. Runs made on DeepSpeed's pipeline engine (MT-NLG,
GPT-NeoX-20B, BLOOM) are priced as that engine runs the plan (``plan.deepspeed.deepspeed_step``:
blocking P2P in its TrainSchedule order, simulated by ``sim/wire.py``, and the data-parallel
reduction after the flush); the *engine* column gives beside it the error as the planner
prices the plan. The rank and the pick are taken among the plans the row's framework runs
(``plan.frameworks.blocker``: no DualPipe, ZB-V or V-Half for Megatron-LM or DeepSpeed, no
ZeRO-1/2 for torchtitan; the published configuration counts as one it runs), priced under its
framework's profile and, for the DeepSpeed rows, at the engine's step
(``plan.published.rank_config``).

    python bench/bench_published.py [--no-rank] [--explain] [--memory]

``--explain`` adds why the planner's pick for Llama 3 on 16,384 GPUs (8K) is not the
published configuration: the pick with and without the overlap of the backward's TP
collectives, and within the schedule families Llama 3 had (three more full searches).

``--memory`` prints the per-rank memory of Llama 3 on 8,192 GPUs at the paper's layout
(interleaved, v = 8), with the budget lifted (the physical memory and the 5 % reserve's
budget in the header): model states, the simulated activation peak in
units of one block's activations, and the chunk forwards in flight by Megatron-LM's warm-up
count, the numbers tests/test_plan_price_memory.py checks by hand.

Checked by tests/test_plan_published.py (the predictions, not the searches).
"""

from __future__ import annotations

import argparse
import time

from pipebubble.plan.published import (
    FRAMEWORK_FITS,
    explain_pick,
    layer_times,
    memory_breakdown,
    predict_runs,
    published_runs,
)

GIB = 2**30

FIT_NOTE = """
DeepSpeed's A100 fit is GPT-NeoX-20B's: of its five runs, the one whose fit predicts the other
four with the smallest worst error (bench_frameworks.py prints every choice). Fitted on
BLOOM-176B instead (0.714) the MT-NLG rows land 11-15 % and NeoX 8 % faster than they ran:
BLOOM's 2022 engine (bf16, DeepSpeed's BF16 optimizer) ran about 9 % faster than the 2021
fp16 engines of the others priced the same way; what makes it faster is not identified
(bench/published/mt_nlg_530b.toml)."""


def _cfg(p) -> str:
    return (f"tp={p.tp}{' sp' if p.sp else ''} cp={p.cp} pp={p.pp} dp={p.dp} {p.sharding}, "
            f"{p.schedule} v={p.chunks}, mbs {p.microbatch_size}, {p.recompute}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-rank", action="store_true",
                    help="skip the full searches (the rank and the planner's pick)")
    ap.add_argument("--explain", action="store_true",
                    help="why the pick for Llama 3 on 16,384 GPUs differs (3 full searches)")
    ap.add_argument("--memory", action="store_true",
                    help="the per-rank memory of Llama 3 on 8,192 GPUs at v = 8 (and stop)")
    args = ap.parse_args()
    if args.memory:
        memory()
        return
    t0 = time.perf_counter()
    eff, rows = predict_runs(ranks=not args.no_rank, by_framework=True)
    fits = ", ".join(f"{fw} on {gpu} {e:.3f} ({FRAMEWORK_FITS[gpu, fw]})"
                     for (gpu, fw), e in eff.items())
    print(f"Calibration: one efficiency per (GPU, framework), fitted on one run each (marked *)"
          f" as bench/bench_frameworks.py fits it, each row priced under its framework's "
          f"profile: {fits} ({time.perf_counter() - t0:.0f} s). The column 'at one efficiency "
          "per GPU' gives the error at Megatron-LM's fit for every row (the planner's own "
          "pricing): what the DeepSpeed and torchtitan rows would show without their "
          "framework's calibration.\n")
    print("Rows run on DeepSpeed's pipeline engine are priced as it runs "
          "(plan.deepspeed.deepspeed_step: blocking P2P in its instruction order, the "
          "data-parallel reduction after the flush); "
          "the engine column gives the error as the planner prices the plan.\n")
    print("Each configuration is priced at the GPU's physical memory (it ran), and ranked among "
          "the planner's plans at the same memory; the memory column says whether it also fits "
          "the planner's default 5 % reserve, and what the planner prices under that reserve.\n")
    print("| source | run | framework | GPUs | published config | metric | published | "
          "predicted | error | at one efficiency per GPU | engine (error as the planner prices "
          "it) | planned at the config | memory (peak rank) | at the 5 % reserve | rank "
          "(physical memory) | planner's pick (its margin) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["plan"]
        fmt = ".3f" if r["metric"] == "MFU" else ".0f"
        rank = ("-" if args.no_rank else str(r["rank"]) if r["rank"] else ">30")
        best = ("-" if r["best"] is None else
                f"{_cfg(r['best'])} ({1 / (1 + r['margin']) - 1:+.1%} step)"
                if r["margin"] > 1e-9 else "the published config")
        fits = "" if r["fits"] else " (does not fit)"
        print(f"| {r['source']} | {r['model']}{' *' if r['calibration'] else ''} | "
              f"{r['framework']} {r['efficiency']:.3f} | {r['gpus']} |"
              f" {r['config']} | {r['metric']} | {r['published']:{fmt}} | "
              f"{r['predicted']:{fmt}} | {r['error']:+.1%} | {r['gpu_error']:+.1%} | "
              f"{_engine(r)} | {_cfg(p)}{fits} | "
              f"{_memory(r)} | "
              f"{_at_reserve(r)} | {rank} | {best} |")
    others = [r for r in rows if not r["calibration"]]
    d = {id(r): 1 / (1 + r["error"]) - 1 for r in others}  # predicted / published step - 1
    worst = max(others, key=lambda r: abs(d[id(r)]))
    print(f"\nAt each row's (GPU, framework) calibration, predicted / published step - 1 (the "
          f"figure bench_frameworks.py prints; the error column is the metric's): "
          f"{min(d.values()):+.1%} … {max(d.values()):+.1%}, mean |.| "
          f"{sum(abs(x) for x in d.values()) / len(d):.1%} over the {len(d)} predicted rows, "
          f"largest {d[id(worst)]:+.1%} ({worst['source']} {worst['model']}); "
          + ("every published configuration fits its GPU" if all(r["fits"] for r in rows) else
             "over its GPU's memory: " + ", ".join(r["model"] for r in rows if not r["fits"])))
    if not args.no_rank:
        slower = [r for r in rows if r["margin"] < -1e-9]
        print("Planner's pick against the published configuration, each at its framework's "
              "pricing: " + ("no slower on every row" if not slower else
                             "slower on " + ", ".join(f"{r['model']} ({-r['margin']:.1%})"
                                                      for r in slower)))
    g = [1 / (1 + r["gpu_error"]) - 1 for r in others]
    print(f"At one efficiency per GPU (Megatron-LM's) and the planner's pricing: "
          f"{min(g):+.1%} … {max(g):+.1%}")
    over = [r for r in others if abs(d[id(r)]) > 0.10]
    print("Every predicted row within 10 % of its step" if not over else
          "Not within 10 %: " + ", ".join(f"{r['source']} {r['model']} ({d[id(r)]:+.1%})"
                                          for r in over))
    print(FIT_NOTE)
    print("\nKorthikanti et al. Table 4: one 22B layer (TP 8, microbatch 4), ms, at the A100 "
          "efficiency:\n")
    print("| technique | forward | backward | predicted forward | predicted backward | "
          "error (sum) |")
    print("|---|---|---|---|---|---|")
    for r in layer_times(eff["a100-80gb", "megatron"]):
        print(f"| {r['technique']} | {r['forward']} | {r['backward']} | "
              f"{r['predicted_forward']:.2f} | {r['predicted_backward']:.2f} | "
              f"{r['error']:+.1%} |")
    if args.explain:
        run = next(r for r in published_runs() if r.name == "405B 8K 16k")
        print("\nLlama 3 405B, 16,384 GPUs, 8K: the planner's pick vs the published "
              "configuration (same pricing each row)\n")
        print("| search | pick | its step | bubble | published config's step | bubble | "
              "margin |")
        print("|---|---|---|---|---|---|---|")
        for e in explain_pick(run, eff["h100-sxm", "megatron"]):
            b, p = e["pick"], e["published"]
            print(f"| {e['what']} | {_cfg(b)} | {b.step_time:.3f} s | {b.bubble_fraction:.1%} | "
                  f"{p.step_time:.3f} s | {p.bubble_fraction:.1%} | {e['margin']:+.1%} |")


def _engine(r) -> str:
    """The engine whose pricing the row has (published.ENGINES), and the planner's error."""
    return "-" if not r["engine"] else f"{r['engine']} ({r['planner_error']:+.1%})"


def _memory(r) -> str:
    """The peak rank's need against the 5 % reserve and the physical memory."""
    need, budget, gpu = r["need"] / GIB, r["reserve_budget"] / GIB, r["physical"] / GIB
    where = ("under the 5 % reserve" if r["fits_reserve"] else
             f"over the 5 % reserve ({budget:.2f}), " + (
                 "under" if need <= gpu else "over"))
    return f"needs {need:.1f} GiB: {where} {gpu:.2f} GiB physical" if not r["fits_reserve"] \
        else f"needs {need:.1f} GiB: {where} ({budget:.2f} of {gpu:.2f})"


def _at_reserve(r) -> str:
    """What the planner prices for the configuration under its default reserve."""
    t, p = r["reserve_plan"], r["plan"]
    if _cfg(t) == _cfg(p) and r["reserve_plan_fits"] == r["fits"]:
        return "the same plan"
    return (f"{t.schedule} v={t.chunks}, mbs {t.microbatch_size}, {t.recompute}"
            f"{'' if r['reserve_plan_fits'] else ' (does not fit)'}: {r['reserve_error']:+.1%}")


def memory() -> None:
    run = next(r for r in published_runs() if r.name == "405B 8K 8k")
    plan, rows = memory_breakdown(run, 0.551, ",sp=1,mbs=1,schedule=interleaved-1f1b,v=8")
    print(f"Llama 3 405B, 8,192 H100s: {_cfg(plan)}, {plan.microbatches} microbatches; one "
          f"block's activations {rows[0]['block_activation'] / 2**20:.1f} MiB; physical "
          f"{rows[0]['physical'] / GIB:.2f} GiB, {rows[0]['budget'] / GIB:.2f} after the 5 % "
          "reserve (GiB below)\n")
    print("| rank | blocks | ends | weights | gradients | optimizer | activations | in flight "
          "(blocks) | Megatron warm-up + 1 (chunks) | peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ends = "+".join(n for n in ("embedding", "head") if r[n]) or "-"
        print(f"| {r['rank']} | {r['blocks']} | {ends} | {r['weights'] / GIB:.3f} | "
              f"{r['gradients'] / GIB:.3f} | {r['optimizer'] / GIB:.3f} | "
              f"{r['activations'] / GIB:.3f} | {r['in_flight_blocks']:.2f} | "
              f"{r.get('megatron_in_flight', '-')} | {r['peak'] / GIB:.3f} |")


if __name__ == "__main__":
    main()
