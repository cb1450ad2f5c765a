"""DeepSeek-V3's training run predicted by the planner: a public check of the MoE pricing.

DeepSeek-V3 technical report (DeepSeek-AI, arXiv 2412.19437): 671B parameters, 37B active, 61
layers (the first 3 dense), MLA attention, 256 routed experts + 1 shared, top-8 within 4 of 8
groups, trained at sequence 4,096 with a global batch of 15,360 sequences (its batch after the
first 469B tokens) on 2,048 H800 GPUs: PP 16 with DualPipe, EP 64 over 8 nodes, ZeRO-1 data
parallelism (dp 128), no tensor parallelism, FP8 mixed precision, fp32 master weights and
gradients, bf16 AdamW moments. Its cost: "180K H800 GPU hours" per trillion tokens (Table 1),
i.e. 1e12 / (180e3 x 3600) = 1,543 tokens/s per GPU.

What the bench does:

1. **Calibration on a dense run**: the compute model's efficiency fitted to Llama 3 405B on
   16,384 H100s (``plan.published.h100_efficiency``, the row ``H100_CALIBRATION``; bf16). The
   H800 is the H100's compute (``plan/hardware.py``'s ``h800`` preset: the H100 SXM with
   NVLink 200 GB/s one way, 160 GB/s at the 0.8 bus fraction as the report measures, and one
   400 Gb/s IB NIC a GPU), so the fitted efficiency carries over; FP8 GEMMs run at the same
   fraction of the FP8 peak.
2. **DeepSeek's configuration** (``plan --config tp=1,cp=1,pp=16,dp=128,ep=64,sharding=zero1,
   schedule=dualpipe,recompute=none``; microbatch size searched) priced with its memory
   lifted: the run ran, and it fit by means the planner does not count (FP8 caching of the
   activations, recomputing every RMSNorm and the MLA up-projections, the EMA on the CPU), so
   the time model is what is checked; the memory our count gives is printed beside.
3. The all-to-all: the simulator of this version times every action whole, so the prediction
   has DualPipe's all-to-all exposed; the same schedule re-simulated with the all-to-all
   removed (``CostModel.a2a_f``/``a2a_b`` taken out of F and B) is the most DualPipe's overlap
   could hide. The two bracket what DualPipe's overlapped pairs give
   (``StageCosts.pair_duration``) once the simulator honours them.
4. **The planner's own pick** for the workload: every axis searched (tp, sp, cp, ep, pp, dp,
   sharding, microbatch size, every schedule family but ``auto``, chunks, recompute) under
   the H800's memory less the 5 % reserve, with the work it took.

    python bench/bench_deepseek_v3.py [--no-search]

Run it with ``PYTHONPATH=src``. Every figure is printed with the command-line equivalent.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from pipebubble.costs import CostModel
from pipebubble.plan.config import parse_config, restrict
from pipebubble.plan.expert import moe_model_flops_per_sequence
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.moe import moe_profile, moe_shape_from_hf
from pipebubble.plan.pipeline_axis import run_pipeline
from pipebubble.plan.planner import Request, search
from pipebubble.plan.published import h100_efficiency

# DeepSeek-V3's released config.json (the keys plan/moe.py reads)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc"}
SEQ, BATCH, GPUS = 4096, 15360, 2048
PUBLISHED = 1e12 / (180e3 * 3600)  # tokens/s per GPU: 180K H800 GPU-hours per 1T tokens
CONFIG = "tp=1,cp=1,pp=16,dp=128,ep=64,sharding=zero1,schedule=dualpipe,recompute=none"
STATES = (2.0, 4.0, 8.0)  # bf16 weights (+ the FP8 copy), fp32 gradients, fp32 master + bf16
# AdamW moments (report section 3.3.1: "BF16 ... for the first and second moments")
TARGET = 0.15


def tokens_per_gpu(step: float) -> float:
    return BATCH * SEQ / step / GPUS


def hidden_step(plan) -> float:
    """The plan's schedule re-simulated with every all-to-all removed from F and B: the
    most an overlap can hide (the data-parallel tail and optimizer step kept as priced)."""
    c = plan.costs
    f = [x - a for x, a in zip(c.f, c.a2a_f, strict=True)]
    b = [x - a for x, a in zip(c.b, c.a2a_b, strict=True)]
    bare = CostModel(f=f, b=b, w=c.w, comm=c.comm, activation_memory=c.activation_memory,
                     weight_memory=c.weight_memory, allreduce=c.allreduce, i_extra=c.i_extra,
                     overlap=c.overlap)
    run = run_pipeline(plan.schedule_obj, bare)
    return run.step_time + (plan.step_time - plan.pipeline_time)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-search", action="store_true", help="skip the planner's own pick")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    eff = h100_efficiency()
    print(f"calibration: H100 efficiency {eff:.3f}, fitted to Llama 3 405B on 16,384 H100s "
          f"(dense, bf16; plan.published.H100_CALIBRATION) in {time.perf_counter() - t0:.1f} s")
    shape, _ = moe_shape_from_hf(DEEPSEEK_V3)
    prof = ProfileSet([moe_profile(shape, SEQ, 1)])
    hw = replace(get_hardware("h800"), efficiency=eff)
    base = Request(gpus=GPUS, gpu_memory=hw.memory, global_batch=BATCH,
                   microbatch_sizes=(1, 2), recompute=None, precision="fp8",
                   state_bytes=STATES, grad_bytes=4.0, top=5)
    print(f"DeepSeek-V3: {shape.total_params() / 1e9:.1f}B total, "
          f"{shape.active_params() / 1e9:.1f}B active; {GPUS} H800s, global batch {BATCH} x "
          f"{SEQ}; published {PUBLISHED:,.0f} tokens/s/GPU (180K GPU-hours per 1T tokens)")

    # 2. DeepSeek's configuration, memory lifted (the run ran)
    cfg = restrict(replace(base, gpu_memory=2.0**50), parse_config(CONFIG, GPUS))
    t0 = time.perf_counter()
    res = search(prof, replace(cfg, top=1), hw, eff)
    plan = res.plans[0]
    secs = time.perf_counter() - t0
    tok = tokens_per_gpu(plan.step_time)
    err = tok / PUBLISHED - 1
    flops = moe_model_flops_per_sequence(shape, SEQ) * BATCH
    mfu = flops / (plan.step_time * GPUS * hw.peak_flops)
    a2a_f = max(plan.costs.a2a_f)
    print(f"\nDeepSeek's configuration ({CONFIG}, mbs={plan.microbatch_size}, "
          f"m={plan.microbatches}): step {plan.step_time:.2f} s, {tok:,.0f} tokens/s/GPU "
          f"({err:+.1%} vs published; target within {TARGET:.0%}: "
          f"{'met' if abs(err) <= TARGET else 'NOT met'}), model-FLOP MFU {mfu:.1%} of the "
          f"bf16 peak, bubble {plan.bubble_fraction:.1%}; priced in {secs:.2f} s")
    lo = hidden_step(plan)
    print(f"  all-to-all: {a2a_f * 1e3:.1f} ms in one F of the slowest stage (ep 64 over 8 "
          f"nodes, 3.5 IB crossings a token by the group-limited routing); as simulated, "
          f"DualPipe's pairs hiding what the other half's compute covers: {tok:,.0f}; all of "
          f"it hidden: step {lo:.2f} s, "
          f"{tokens_per_gpu(lo):,.0f} tokens/s/GPU ({tokens_per_gpu(lo) / PUBLISHED - 1:+.1%})")
    for prec in ("bf16",):  # FP8's gain is what the dense bf16 calibration cannot say
        other = search(prof, replace(cfg, top=1, precision=prec), hw, eff).plans[0]
        t_exp, t_hid = tokens_per_gpu(other.step_time), tokens_per_gpu(hidden_step(other))
        print(f"  the same in {prec} (FP8 gaining nothing): {t_exp:,.0f} tokens/s/GPU as simulated "
              f"({t_exp / PUBLISHED - 1:+.1%}), {t_hid:,.0f} hidden ({t_hid / PUBLISHED - 1:+.1%})")
    peak = max(plan.peak_memory)
    print(f"  memory by our count: peak {peak / 2**30:.0f} GiB on an 80 GB H800 (activations "
          f"{plan.memory[0]['activations'] / 2**30:.0f} GiB on rank 0): DeepSeek fits by FP8 "
          f"activation caching and recomputation the planner does not count")
    print("  = pipebubble plan --profile dsv3.json --gpu h800 --gpus 2048 --global-batch "
          f"15360 --precision fp8 --param-bytes 2 --grad-bytes 4 --optimizer-bytes 8 "
          f"--gpu-memory 1PiB --config {CONFIG}")
    print("  why it misses: the efficiency is a bf16 dense fit, assumed to hold at the FP8 "
          "peak (2x): DeepSeek's FP8 GEMMs with fine-grained (1x128, 128x128) scaling and "
          "their casts reach less, and DeepSeek gives 20 of 132 SMs to communication, which "
          "the planner does not take from compute; so the FP8 figure is too fast, and the bf16 "
          "one (FP8 gaining nothing) lands nearer. Also: the dispatch moves "
          "16-bit values (DeepSeek: FP8), and the MTP module (one more layer and head, ~2 % "
          "of the FLOPs) is left out")

    if args.no_search:
        return 0
    # 4. the planner's own pick, at the H800's memory less the 5 % reserve
    from pipebubble.schedules import schedule_names

    req = replace(base, gpu_memory=hw.memory * 0.95,
                  schedules=tuple(schedule_names(searched=False)))
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    got = search(prof, req, hw, eff)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = got.plans[0]
    c = best.config
    gain = plan.step_time / best.step_time - 1
    print(f"\nthe planner's pick (every axis, every family but auto, "
          f"{hw.memory * 0.95 / 2**30:.1f} GiB budget): tp={c.tp} cp={c.cp} pp={c.pp} "
          f"dp={c.dp} ep={c.dims.ep} {c.sharding} {c.schedule} v={c.chunks} "
          f"mbs={c.microbatch_size} recompute {c.recompute}: "
          f"{tokens_per_gpu(best.step_time):,.0f} tokens/s/GPU ({gain:+.1%} throughput over "
          f"DeepSeek's configuration as priced), peak {max(best.peak_memory) / 2**30:.1f} GiB")
    print(f"  search: {got.searched:,} configurations, {got.simulated} simulations in "
          f"{secs:.1f} s wall, {cpu:.1f} s CPU (load {load:.1f} at the start, "
          f"{os.cpu_count()} cores); auto left out (its order search is most of a full "
          "search's time)")
    print(f"  why it differs: DeepSeek's configuration needs {max(plan.peak_memory) / 2**30:.0f}"
          f" GiB by the planner's count, so the pick keeps what fits (cp={c.cp} halves the "
          f"activations per rank, ep={c.dims.ep}); and where the schedule has no overlapped "
          f"pairs to hide the all-to-all behind, a smaller EP group wins: "
          f"{max(best.costs.a2a_f) * 1e3:.1f} ms of all-to-all in one F of its slowest stage "
          f"against DeepSeek's "
          f"{a2a_f * 1e3:.1f} (EP 64 spans 8 nodes, 3.5 IB crossings a token; EP "
          f"{c.dims.ep} fewer). DualPipe exists to hide exactly that, in a layout that does "
          f"not fit by the planner's memory count")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
