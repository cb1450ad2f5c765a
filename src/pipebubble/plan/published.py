"""Published runs the planner is checked against, each number with its source.

Two parts: Megatron-LM's SC'21 Table 1 (below, :func:`predict_table1`, which fits the A100
efficiency), and the other runs (:func:`published_runs`: Korthikanti et al. 2022, MT-NLG
530B, GPT-NeoX-20B, BLOOM, Llama 3 405B, torchtitan), each planned at its published
configuration through ``plan --config``'s path (:func:`predict_config`), with one efficiency
per GPU fitted once (A100 on Table 1's 18.4B row, also for the A100 40 GB; H100 on the Llama
3 row ``H100_CALIBRATION``), and ranked among the planner's plans (:func:`rank_config`).
``bench/bench_megatron.py`` and ``bench/bench_published.py`` print the tables.

Engines. The planner prices any plan one way: P2P batched and buffered, data-parallel
traffic behind the last backward (Megatron-LM's ``--overlap-grad-reduce``). A run on
DeepSpeed's pipeline engine (BLOOM, MT-NLG, GPT-NeoX-20B: ``Run.engine = "deepspeed"``) is
priced as that engine runs its plan (:func:`~pipebubble.plan.deepspeed.deepspeed_step`):
blocking P2P in its ``TrainSchedule`` order
(:func:`~pipebubble.plan.deepspeed.deepspeed_lowering`, simulated by
:func:`pipebubble.sim.wire.run_wire`) and the reduction after the flush. Every other row is
priced as the planner prices it, so neither efficiency moves.

Memory. A published run ran, so memory is not in question for its own configuration: what
is checked is the time model. Each published configuration is therefore priced against the
GPU's physical memory (no reserve), and :func:`predict_runs` reports beside it whether its
peak rank also fits the planner's default budget (the GPU less ``RESERVE``, 5 %: ``plan
--reserve 5%``) and what the planner would price for the configuration under that budget.
Llama 3 on 8,192 GPUs is the row where this decides: at the paper's layout the interleaved
schedule needs 76.5 GiB on rank 1, under the H100's 79.65 GiB (+0.3 %) but over the 75.67
GiB the reserve leaves, where the planner falls back to 1F1B (-26.7 %). The ranking is taken
at the same memory: the planner's own plans also get the physical memory, so that the
published configuration competes with plans given what it had (plans that use the last 5 %
have not been shown to run; a plan ranked above the published one may need that much).
Table 1 is planned at the physical memory as well; every one of its rows plans the same
(microbatch size, chunks) at the reserve, so none of its figures depends on it.

Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM* (SC'21), Table 1: GPT models on A100 80 GB (DGX A100: 8 GPUs a node, NVLink3,
8 x 200 Gb/s HDR InfiniBand), fp16, vocabulary 51,200, sequence 2,048, the interleaved
schedule, full activation recomputation, data-parallel all-reduce without a distributed
optimizer. The table gives TP, PP, the GPUs, the global batch and the achieved TFLOP/s per
GPU, counted by their eq. 3 (with recomputation):

    FLOPs per step = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

so the step time is that over (GPUs x TFLOP/s). :func:`predict_table1` calibrates the compute
model's efficiency on one row (``plan --config ... --measured-step``) and predicts the others
with the published TP, PP and data parallelism, searching what the paper does not give
(microbatch size, chunks). ``bench/bench_megatron.py`` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..schedules import lookup
from .analytic import TransformerShape, shape_profile
from .deepspeed import deepspeed_step
from .dims import ParallelDims
from .fit import fit_efficiency
from .hardware import get_hardware
from .layercosts import ProfileSet
from .plans import NoPlanFits, Request

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Row:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved per GPU, published

    @property
    def dp(self) -> int:
        return self.gpus // ParallelDims(tp=self.tp, pp=self.pp).non_data_parallel

    def flops(self) -> float:
        """Eq. 3: FLOPs of one step with full recomputation."""
        B, s, l, h, V = self.batch, SEQ, self.layers, self.hidden, VOCAB
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))

    def step_time(self) -> float:
        """The published step: eq. 3 FLOPs / (GPUs x TFLOP/s)."""
        return self.flops() / (self.gpus * self.tflops * 1e12)


TABLE1 = (
    Row("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    Row("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    Row("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    Row("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    Row("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    Row("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Row("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    Row("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    Row("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    Row("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
)


def shape_of(row: Row) -> TransformerShape:
    """Megatron's GPT: 4h GELU MLP, learned positions, biases, dropout, tied embeddings."""
    return TransformerShape(layers=row.layers, hidden=row.hidden, ffn=4 * row.hidden,
                            heads=row.heads, vocab=VOCAB, tied_embeddings=True, swiglu=False,
                            positions=SEQ, dropout=True, biases=True)


def _megatron() -> tuple[str, ...]:
    """The families Megatron-LM pipelines (1F1B and interleaved 1F1B): what its published
    runs chose among."""
    from .settings import megatron_families

    return tuple(megatron_families())


def request_of(row: Row, gpu_memory: float) -> Request:
    """The published configuration; microbatch size and chunks searched."""
    return Request(gpus=row.gpus, gpu_memory=gpu_memory, global_batch=row.batch,
                   microbatch_sizes=(1, 2, 4, 8), schedules=_megatron(),
                   max_chunks=4, recompute=("full",), tp=(row.tp,), pp=(row.pp,), cp=(1,),
                   sp=(False,), shardings=("ddp",), grad_bytes=4.0, top=1)


def predict_row(row: Row, hw, efficiency: float):
    """The planner's best plan for the row's published configuration."""
    from .planner import search

    prof = ProfileSet([shape_profile(shape_of(row), SEQ, 1, attention="unfused")])
    hw = replace(hw, efficiency=efficiency, tp_overlap=False)  # measured before Megatron-LM
    # overlapped the backward's TP all-reduces with weight gradients (September 2021)
    # the physical memory, as for every published run (``RESERVE``): at the 5 % reserve every
    # row plans the same (microbatch size and chunks), so no Table 1 figure depends on it
    return search(prof, request_of(row, hw.memory), hw, efficiency).plans[0]


def predict_table1(calibrate_on: str = "18.4B") -> tuple[float, list[dict]]:
    """(the efficiency fitted on ``calibrate_on``, one dict per row: published and predicted
    TFLOP/s, the relative error, the plan's microbatch size and chunks)."""
    hw = get_hardware("a100-80gb")
    cal = next(r for r in TABLE1 if r.name == calibrate_on)
    eff = fit_efficiency(lambda e: predict_row(cal, hw, e).step_time, cal.step_time())
    out = []
    for row in TABLE1:
        plan = predict_row(row, hw, eff)
        tflops = row.flops() / (plan.step_time * row.gpus) / 1e12
        out.append({"model": row.name, "tp": row.tp, "pp": row.pp, "gpus": row.gpus,
                    "batch": row.batch, "published": row.tflops, "predicted": tflops,
                    "error": tflops / row.tflops - 1, "microbatch_size": plan.microbatch_size,
                    "chunks": plan.chunks, "schedule": plan.schedule,
                    "bubble": plan.bubble_fraction, "calibration": row.name == calibrate_on})
    return eff, out


# ---- other published runs: one efficiency per GPU, each run at its published configuration --

@dataclass(frozen=True)
class Run:
    """One published training run: the model, the machine, the configuration it ran
    (``plan --config`` text), and its published throughput in the source's own metric.

    ``step`` is the published step in seconds, derived from that metric by the source's FLOP
    count (:func:`published_runs` says which per run); every metric here is inversely
    proportional to the step, so a prediction is reported as ``published x step / predicted``.
    """

    source: str  # short reference
    name: str
    shape: TransformerShape
    seq: int
    gpus: int
    batch: int  # sequences per step
    gpu: str
    config: str  # plan --config
    metric: str  # what the source publishes: "MFU", "TFLOP/s", "tokens/s"
    published: float
    step: float  # the published step, seconds
    flash: bool = True
    search: tuple = ()  # (field, values) the planner may choose where the source is silent
    hardware: tuple = ()  # (field, value) overrides of the preset (the machine as published)
    note: str = ""
    engine: str = ""  # the pipeline engine it ran on, where its pricing differs from the
    # planner's (ENGINES): "deepspeed" for DeepSpeed's PipelineEngine (deepspeed_step)


ENGINES = ("", "deepspeed")  # "": priced as the planner prices any plan (batched P2P, the
# data-parallel traffic behind the last backward); "deepspeed": :func:`deepspeed_step`


A100_PEAK, H100_PEAK = 312e12, 989e12
SAME_CHIP = {"a100-40gb": "a100-80gb"}  # the same A100 (its tensor cores, its efficiency);
# what differs, the memory and HBM bandwidth, is in the preset


def _gpt(layers, hidden, heads, vocab=VOCAB, positions=SEQ) -> TransformerShape:
    return TransformerShape(layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads,
                            vocab=vocab, tied_embeddings=True, swiglu=False,
                            positions=positions, dropout=True, biases=True)


def korthikanti_flops(shape: TransformerShape, seq: int, batch: int) -> float:
    """Korthikanti et al. 2022 eq. 7, model FLOPs (no recomputation):
    ``72 B L s h^2 (1 + s / (6 h) + V / (12 h L))``."""
    B, s, L, h, V = batch, seq, shape.layers, shape.hidden, shape.vocab
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def llama_flops(shape: TransformerShape, seq: int, batch: int) -> float:
    """Model FLOPs of a LLaMA step as a causal FlashAttention kernel executes them: ``6`` per
    token and matrix parameter (blocks and head) plus the causal half of attention's
    ``12 L s^2 q``. (The Llama 3 paper does not give its count; counting attention in full
    would raise the 131,072-token row's FLOPs by 40 % and the 8,192-token rows' by 4 %.)"""
    q = shape.heads * shape.head_dim
    per_seq = 3 * (2 * seq * shape.layers * shape.block_matmul_params()
                   + 2 * shape.layers * seq * seq * q + 2 * seq * shape.hidden * shape.vocab)
    return per_seq * batch


LLAMA3_405B = TransformerShape(layers=126, hidden=16384, ffn=53248, heads=128, vocab=128256,
                               kv_heads=8)
LLAMA3_8B = TransformerShape(layers=32, hidden=4096, ffn=14336, heads=32, vocab=128256,
                             kv_heads=8)


def published_runs() -> tuple[Run, ...]:
    """The runs, each number from its source (the comments give it)."""
    runs = []
    # Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    # (arXiv 2205.05198): Table 3 (configurations: heads, hidden, layers, TP, PP, GPUs, global
    # batch, microbatch; s = 2048, V = 51,200, A100 80 GB, interleaving 3 for 175B and 530B)
    # and Table 5 (model FLOPs utilisation with sequence parallelism + selective recompute, no
    # data parallelism). The MFU column is also in Megatron-LM's README (commit 2e90a342f5,
    # "22B 41.5 % / 175B 51.4 % / 530B 56.0 % / 1T 56.3 %"). MFU = eq. 7 / (time x GPUs x
    # 312 TFLOP/s); the step follows from it (Table 5's times, 1.10 / 13.75 / 37.83 /
    # 71.49 s, agree within 1 %).
    for name, heads, hidden, layers, pp, gpus, batch, mbs, v, mfu in (
            ("22B", 64, 6144, 48, 1, 8, 4, 4, 1, 0.415),
            ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 0.514),
            ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 0.560),
            ("1T", 160, 25600, 128, 64, 512, 512, 1, 0, 0.563)):
        shape = _gpt(layers, hidden, heads)
        step = korthikanti_flops(shape, SEQ, batch) / (mfu * gpus * A100_PEAK)
        sched = "" if pp == 1 else ",schedule=interleaved-1f1b" + (f",v={v}" if v else "")
        runs.append(Run("Korthikanti'22 T5", name, shape, SEQ, gpus, batch, "a100-80gb",
                        f"tp=8,sp=1,cp=1,pp={pp},dp=1,sharding=ddp,mbs={mbs},"
                        f"recompute=selective{sched}", "MFU", mfu, step, flash=False,
                        note="" if v or pp == 1 else "chunks searched (not published)"))
    # Megatron-Turing NLG 530B (Smith et al. 2022, "Using DeepSpeed and Megatron to Train
    # Megatron-Turing NLG 530B", arXiv 2201.11990): 105 layers, h 20480, 128 heads, sequence
    # 2048, global batch 1920 (section 4); 8-way tensor slicing inside a DGX A100 node and
    # 35-way pipeline across nodes, data parallelism over the rest (section 2.3); A100 80 GB
    # on Selene (8 x 200 Gb/s HDR a node: the preset). Section 2.4: on 280, 350 and 420 DGX
    # A100 servers (2,240 / 2,800 / 3,360 GPUs: DP 8 / 10 / 12) the iteration took 60.1, 50.2
    # and 44.4 s, "126, 121, and 113 teraFLOP/s per GPU". Those are Megatron-LM's eq. 3
    # counts (with recomputation; tests/test_plan_published.py checks that they agree with the
    # times within 1 %), and the step is the published time itself. Vocabulary: GPT-2's
    # 50,257 padded to a multiple of 128 x TP, 51,200, as Megatron-LM pads it. DeepSpeed's
    # pipeline engine runs 1F1B (no interleaving) and its Megatron fork of 2021 had no
    # sequence parallelism and no FlashAttention. Full recomputation is inferred, not printed:
    # eq. 3 counts the recomputed forward (its factor 4 = 3 + 1), and 126 TFLOP/s at 60.1 s is
    # that count; without recomputation the same step would be 94.5 TFLOP/s of model FLOPs.
    # (Left to search at the physical memory, the planner would pick no recomputation: 78.6
    # GiB of the 80, over the 5 % reserve.) Not published, so searched: the microbatch size
    # (1, 2, 4), ZeRO-1 or none. Priced as DeepSpeed's pipeline engine runs it
    # (engine="deepspeed", deepspeed_step), like every run on that engine here.
    # The miss (+22 / +23 / +27 % after that pricing, +23 / +24 / +28 % before) is not
    # explained; what was tested, each against DeepSpeed's source (microsoft/DeepSpeed at
    # 38327e0, the parts that predate the run):
    # (a) the data-parallel reduction after the flush, not behind the backward (engine.py
    #     turns the gradient hooks off, "We schedule the all-reduces", since 2f62697,
    #     2020-12; ReduceGrads is the last step's command): priced, -0.5 points (1.9 B
    #     local parameters reduce in 0.5 s of a 60 s step);
    # (b) blocking P2P in the engine's instruction order (p2p.py: dist.send / dist.recv, or
    #     before e2fdd25, 2021-09, a broadcast on a two-rank group; async refused): priced
    #     by the wire simulation of that order (deepspeed_lowering), -0.6 points: with the
    #     activation split over the 8 TP ranks (pipe_partitioned, on by default) a hop is
    #     0.5 ms against 170 ms of compute a microbatch, and the lock-step order itself
    #     costs nothing without message time (tests/test_plan_published.py); were the split
    #     off (every TP rank sending the whole activation, 8x the hop), +17 / +22 % at 2,240
    #     / 3,360 GPUs: not closed either, and no source says it was off;
    # (c) BLOOM's fp32 accumulation of every microbatch's gradients: that is DeepSpeed's
    #     BF16_Optimizer, added in 56c5223 (2022-04-19, "bf16+pipeline parallelism"), after
    #     this run; the paper does not say bf16. Not priced (it would give +11 / +13 / +16 %);
    # (d) the network: Selene's 8 HDR HCAs a node are the preset. Only an eighth of the
    #     inter-node bandwidth would close it (+8 / +7 / +9 % with this pricing), which no
    #     source supports;
    # left: the same model on the same machine ran at 163 TFLOP/s under Megatron-LM (Table 1,
    # predicted within 1 %); the planner's per-microbatch compute, not the bubble, is what is
    # short (a fit of the three published steps to (m + k) t gives t 15 % over the planned
    # microbatch and k 51 against the bubble's 34), and the paper prints no breakdown.
    for nodes, seconds, tflops in ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113)):
        gpus = 8 * nodes
        runs.append(Run("MT-NLG \u00a72.4", f"530B {gpus}", _gpt(105, 20480, 128), SEQ, gpus,
                        1920, "a100-80gb",
                        f"tp=8,sp=0,cp=1,pp=35,dp={gpus // 280},recompute=full,schedule=1f1b",
                        "TFLOP/s", tflops, seconds, flash=False,
                        search=(("shardings", ("ddp", "zero1")),), engine="deepspeed",
                        note="mbs, ddp/zero1 searched; recompute inferred from the FLOP count"))
    # GPT-NeoX-20B (Black et al. 2022, arXiv 2204.06745): the configuration it was trained
    # with is github.com/EleutherAI/gpt-neox configs/20B.yml (at 252ddc5, "as it was trained
    # on 96x 40GB A100 GPUs"): PP 4, TP 2 (so DP 12), 44 layers, h 6144, 64 heads, sequence
    # 2048, rotary positions on 25 % of each head (no position table), untied embeddings,
    # GPT-J's parallel attention and MLP, no dropout, fp16, DeepSpeed ZeRO stage 1,
    # microbatch 4 per GPU and 32 accumulation steps (1536 sequences a step; the paper's
    # section 3 says 1538 contexts, about 3.15M tokens), checkpoint-activations (full
    # recomputation), DeepSpeed's pipeline (1F1B). The model card gives the vocabulary padded
    # to 50,432 and 20,556,201,984 parameters. Throughput: 117 TFLOP/s per GPU (the paper's
    # section 3; the PDF is not in the store this was checked with, the figure is from a
    # quotation of it), counted here by eq. 3 with its recomputation factor, the count
    # gpt-neox logs (megatron/logging.py, get_flops, "from Megatron-DeepSpeed"): the step is
    # that over 96 x 117 TFLOP/s. The 12 servers have four ConnectX-6 HCAs for eight GPUs
    # (section 3) on HDR switches (MQM8700-HS2R): 4 x 200 Gb/s for 8 GPUs, 12.5 GB/s a GPU,
    # half the preset's (the hardware override; -1.3 points). Priced as DeepSpeed's
    # pipeline engine runs it (engine="deepspeed"): the reduction after the flush (-3.3
    # points: 2.6 B local parameters over 12.5 GB/s) and blocking P2P (-0.9). Left: +20 %,
    # unexplained. Ruled out: BLOOM's fp32 accumulation (fp16 here: the fp16 gradients
    # accumulate in .grad as any autograd run's do); the config's synchronize-each-layer (a
    # device synchronisation per layer: the host stops running ahead, about 0.3 ms of
    # launches a layer against 17 ms of forward, not priced); the FLOP count (the factor 4
    # is get_flops' with checkpoint-activations; with 3 the step would be 25 % shorter and
    # the row -10 %, but the paper's count is not in the store to check).
    neox = TransformerShape(layers=44, hidden=6144, ffn=4 * 6144, heads=64, vocab=50432,
                            swiglu=False, biases=True)
    runs.append(Run("GPT-NeoX-20B \u00a73", "20B", neox, SEQ, 96, 1536, "a100-40gb",
                    "tp=2,sp=0,cp=1,pp=4,dp=12,sharding=zero1,mbs=4,recompute=full,"
                    "schedule=1f1b", "TFLOP/s", 117,
                    96 * 1536 * SEQ * 44 * 6144**2 * (1 + SEQ / (6 * 6144)
                                                      + 50432 / (16 * 44 * 6144))
                    / (96 * 117e12), flash=False, engine="deepspeed",
                    hardware=(("inter_node_bandwidth", 12.5e9),),
                    note="parallel attention + MLP priced as sequential"))
    # BLOOM-176B (BigScience tr11-176B-ml, github.com/bigscience-workshop/bigscience,
    # train/tr11-176B-ml/README.md and tr11-176B-ml.slurm at 9e64ede): 384 A100 80 GB (48
    # nodes of 8), TP 4, PP 12, DP 8, MBS 2, GBS 2048, seq 2048, 70 layers, h 14336, 112
    # heads, vocabulary padded to 250,880, ALiBi (no position table), GeLU, bf16 with
    # DeepSpeed's BF16 optimizer ("implements its own ZeRO stage 1"), --checkpoint-activations
    # (full recomputation), DeepSpeed's pipeline (1F1B); the README's log line at the end of
    # the first epoch: 104.70 s per iteration at GBS 2048, "TFLOPs: 149.77" (hardware FLOPs:
    # 4 x 2 x params x tokens). Network: 4 Omni-Path 100 Gb/s links per node (BLOOM paper,
    # arXiv 2211.05100, section 3.4.1): 6.25 GB/s per GPU, not the preset's 25. DeepSpeed's
    # BF16 optimizer under its pipeline engine adds each microbatch's bf16 gradients into fp32
    # after every backward (deepspeed/runtime/pipe/engine.py, _exec_backward_pass ->
    # optimizer.update_hp_grads; runtime/bf16_optimizer.py: hp_grad.add_(lp.grad.to(fp32))):
    # 18 bytes of HBM traffic per local parameter and microbatch (hardware.py). On
    # DeepSpeed's pipeline engine (engine="deepspeed"): the reduction after the flush and
    # blocking P2P take it from +4.4 % to +2.1 %.
    bloom = TransformerShape(layers=70, hidden=14336, ffn=4 * 14336, heads=112, vocab=250880,
                             tied_embeddings=True, swiglu=False, dropout=True, biases=True)
    runs.append(Run("BLOOM tr11", "176B", bloom, 2048, 384, 2048, "a100-80gb",
                    "tp=4,sp=0,cp=1,pp=12,dp=8,sharding=zero1,mbs=2,recompute=full,"
                    "schedule=1f1b", "TFLOP/s", 149.77, 104.70, flash=False,
                    hardware=(("inter_node_bandwidth", 6.25e9),
                              ("grad_accumulation_bytes", 18.0)), engine="deepspeed"))
    # Llama 3 405B (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, section
    # 3.3.2, Table 4): GPUs, TP, CP, PP, DP, sequence, batch size per DP group, TFLOP/s per
    # GPU (430 / 400 / 380; "BF16 MFU" 43 / 41 / 38 %). The PDF prints DP = 4 for the 131,072
    # row, which contradicts its 16,384 GPUs (8 x 16 x 16 x 4 = 8,192) and its 16M tokens
    # per batch (4 x 16 x 131,072 = 8M): DP = 8 is the only value consistent with both.
    # Section 3.3.2 also gives: FSDP sharding optimizer states and gradients, weights not
    # resharded after forward (zero2 here); the interleaved schedule; 8K sequences trained
    # without activation checkpointing; CP by all-gathering K and V (not a ring). H100 80 GB,
    # 400 Gb/s per GPU (section 3.3.1). The layout (section 3.3.2, "memory imbalance"): one
    # block fewer on the first and the last stage, so that the first chunk of the first rank
    # holds the embedding alone and the last chunk of the last rank the head and loss alone.
    # With chunks of equal size that is one unit a chunk: 126 blocks + 2 = 128 = PP 16 x 8
    # chunks, so v up to 8 is searched (the paper does not print V; v = 8 is inferred).
    for gpus, cp, dp, seq, per_dp, tflops, rec in (
            (8192, 1, 64, 8192, 32, 430, ",recompute=none"),
            (16384, 1, 128, 8192, 16, 400, ",recompute=none"),
            (16384, 16, 8, 131072, 16, 380, "")):
        batch = dp * per_dp
        step = llama_flops(LLAMA3_405B, seq, batch) / (tflops * 1e12 * gpus)
        runs.append(Run("Llama 3 T4", f"405B {seq // 1024}K {gpus // 1024}k", LLAMA3_405B,
                        seq, gpus, batch,
                        "h100-sxm", f"tp=8,cp={cp},pp=16,dp={dp},sharding=zero2{rec}",
                        "TFLOP/s", tflops, step,
                        search=(("schedules", _megatron()),
                                ("max_chunks", 8)),
                        note="mbs, v (up to 8: the paper's layout)" + (
                            ", recompute" if not rec else "") + ", sp searched"))
    # torchtitan docs/performance.md (github.com/pytorch/torchtitan, last at 820504e20^):
    # Llama 3.1 8B, FSDP (1D), local batch 2, selective activation checkpointing, bf16 (no
    # Float8, no torch.compile), seq 8192 (train_configs/llama3_8b.toml at the commit the
    # page names, 9dec370): Table 1 (8 GPUs) 5,762 and Table 3 (128 GPUs) 5,605 tokens/s
    # per GPU. The GPUs are H100 with 96 GB HBM2e at 2.4 TB/s and a 500 W limit ("peak
    # between SXM and NVL"), so the 989 TFLOP/s preset is optimistic for them.
    for gpus, tps, table in ((8, 5762, "T1"), (128, 5605, "T3")):
        batch = 2 * gpus
        runs.append(Run(f"torchtitan {table}", f"8B FSDP {gpus}", LLAMA3_8B, 8192, gpus, batch,
                        "h100-sxm", f"tp=1,cp=1,pp=1,dp={gpus},sharding=fsdp,mbs=2,"
                        "recompute=selective", "tokens/s", tps, batch * 8192 / (tps * gpus),
                        hardware=(("memory", 96e9), ("hbm_bandwidth", 2.4e12)),
                        note="500 W HBM2e H100; its op-level SAC priced as selective"))
    return tuple(runs)


H100_CALIBRATION = "405B 8K 16k"  # the Llama 3 row the H100 efficiency is fitted on: 16,384
# GPUs, sequence 8,192. Kept from when configurations were priced at the 5 % reserve, under
# which the 8,192-GPU row falls back to 1F1B and could not be fitted on; at the physical
# memory it could (0.549 against this row's 0.551), so the choice moves nothing.


RESERVE = 0.05  # the planner's default reserve (``plan --reserve 5%``): its budget is the
# GPU's memory less 5 %, for what the memory model does not count (CUDA context, NCCL
# buffers, the allocator's fragmentation). A published run ran, so its own configuration is
# priced against the physical memory (``reserve=0``) and the reserve is reported beside it.


def _setup(run: Run, efficiency: float, top: int = 1, reserve: float = 0.0):
    """(profiles, the request as ``plan`` builds it, the hardware): the model at the run's
    sequence, the GPU preset with the run's overrides, the budget the GPU's memory less
    ``reserve`` (a fraction; 0: the physical memory)."""
    from ..schedules import schedule_names

    hw = replace(get_hardware(run.gpu), **dict(run.hardware), efficiency=efficiency)
    prof = ProfileSet([shape_profile(run.shape, run.seq, 1,
                                     attention="flash" if run.flash else "unfused")])
    fields = dict(microbatch_sizes=(1, 2, 4), max_chunks=4, recompute=None,
                  schedules=tuple(schedule_names(searched=False)))
    fields.update(run.search)
    req = Request(gpus=run.gpus, gpu_memory=hw.memory * (1 - reserve), global_batch=run.batch,
                  grad_bytes=4.0, top=top, **fields)
    return prof, req, hw


def predict_config(run: Run, efficiency: float, reserve: float = 0.0):
    """The planner's plan for the run's published configuration (what ``plan --config`` puts
    beside the plans: the request restricted to the configuration, the rest searched), at
    the physical memory unless ``reserve`` is given."""
    return _predict(run, efficiency, reserve)[0]


def _predict(run: Run, efficiency: float, reserve: float = 0.0):
    """(the plan, whether it fits the budget: the GPU's memory less ``reserve``); one that
    does not is the least-memory plan, as ``plan --config`` reports it."""
    from .config import parse_config, restrict
    from .planner import search

    prof, req, hw = _setup(run, efficiency, reserve=reserve)
    one = replace(restrict(req, parse_config(run.config, run.gpus)), top=1)
    try:
        return search(prof, one, hw, efficiency).plans[0], True
    except NoPlanFits as exc:
        if exc.plan is None:
            raise
        return exc.plan, False


def engine_step(run: Run, plan, efficiency: float) -> float:
    """``plan``'s step as ``run``'s engine runs it (:data:`ENGINES`)."""
    if run.engine not in ENGINES:
        raise ValueError(f"unknown engine {run.engine!r} of run {run.name!r}; valid are "
                         f"{', '.join(repr(e) for e in ENGINES)}")
    if run.engine != "deepspeed":
        return plan.step_time
    hw = replace(get_hardware(run.gpu), **dict(run.hardware), efficiency=efficiency)
    tied = run.shape.vocab * run.shape.hidden if run.shape.tied_embeddings else 0.0
    return deepspeed_step(plan, hw, tied)


def rank_config(run: Run, efficiency: float, top: int = 30, reserve: float = 0.0):
    """(the published configuration's rank among the planner's ``top`` plans, None if
    slower than all of them; the planner's own best plan), as ``plan --config`` ranks it:
    every axis searched (tp, sp, cp, pp, dp, sharding, microbatch size, every schedule family
    but ``auto``, chunks, recompute). Both under the same budget, the GPU's memory less
    ``reserve`` (0 by default: the physical memory the published configuration is priced
    at), so that the published configuration competes with plans given the same memory."""
    from ..schedules import schedule_names
    from .planner import search

    prof, req, hw = _setup(run, efficiency, top, reserve)
    req = replace(req, schedules=tuple(schedule_names(searched=False)))
    plans = search(prof, req, hw, efficiency).plans
    mine = predict_config(run, efficiency, reserve)
    faster = sum(1 for p in plans if p.step_time < mine.step_time * (1 - 1e-12))
    return (faster + 1 if faster < len(plans) else None), plans[0]


def memory_of(run: Run) -> float:
    """The physical memory of one of the run's GPUs, bytes (the preset with its overrides)."""
    return replace(get_hardware(run.gpu), **dict(run.hardware)).memory


def a100_efficiency() -> float:
    """The A100 efficiency: Megatron-LM's SC'21 Table 1, calibrated on its 18.4B row."""
    return predict_table1()[0]


def h100_efficiency(runs: tuple[Run, ...] | None = None) -> float:
    """The H100 efficiency: fitted to the Llama 3 405B row ``H100_CALIBRATION``."""
    runs = runs or published_runs()
    cal = next(r for r in runs if r.name == H100_CALIBRATION)
    return fit_efficiency(lambda e: predict_config(cal, e).step_time, cal.step)


def predict_runs(runs: tuple[Run, ...] | None = None, ranks: bool = False,
                 efficiencies: dict[str, float] | None = None) -> tuple[dict, list[dict]]:
    """({gpu: efficiency}, one dict per run: published and predicted metric, the error, the
    plan chosen for the published configuration and, with ``ranks``, its rank among the
    planner's plans and the planner's own pick with its predicted margin)."""
    runs = runs or published_runs()
    eff = dict(efficiencies or {})
    if "a100-80gb" not in eff:
        eff["a100-80gb"] = a100_efficiency()
    if "h100-sxm" not in eff:
        eff["h100-sxm"] = h100_efficiency(runs)
    out = []
    for run in runs:
        e = eff[SAME_CHIP.get(run.gpu, run.gpu)]
        plan, fits = _predict(run, e)
        step = engine_step(run, plan, e)
        tight, tight_fits = _predict(run, e, RESERVE)
        rank, best = rank_config(run, e) if ranks else (None, None)
        physical = memory_of(run)
        need = max(plan.peak_memory)
        item = {"source": run.source, "model": run.name, "gpus": run.gpus,
                "config": run.config, "metric": run.metric, "published": run.published,
                "predicted": run.published * run.step / step,
                "error": run.step / step - 1, "step": step, "engine": run.engine,
                "planner_error": run.step / plan.step_time - 1, "plan": plan, "rank": rank,
                "best": best, "calibration": run.name == H100_CALIBRATION, "note": run.note,
                "fits": fits, "need": need, "physical": physical,
                "reserve_budget": physical * (1 - RESERVE),
                "fits_reserve": need <= physical * (1 - RESERVE),
                "reserve_plan": tight, "reserve_plan_fits": tight_fits,
                "reserve_error": run.step / (step if (tight.config, tight.step_time) == (
                    plan.config, plan.step_time) else engine_step(run, tight, e)) - 1,
                "margin": plan.step_time / best.step_time - 1 if best is not None else None}
        out.append(item)
    return eff, out


def interleaved_in_flight(p: int, v: int, m: int, rank: int) -> int:
    """Chunk forwards rank ``rank`` has done before its first backward in Megatron-LM's
    interleaved 1F1B (``megatron/core/pipeline_parallel/schedules.py``): its warm-up
    ``2 (p - rank - 1) + (v - 1) p`` (microbatch groups of ``p``), capped at all ``m v``,
    plus the first steady-state forward, which runs before the first backward. Each of them
    holds its chunk's activations at the rank's peak.

    >>> interleaved_in_flight(16, 8, 32, 1), interleaved_in_flight(16, 8, 16, 1)
    (141, 128)
    """
    warm = min(2 * (p - rank - 1) + (v - 1) * p, m * v)
    return warm + (1 if warm < m * v else 0)


def memory_breakdown(run: Run, efficiency: float, config: str = "") -> tuple:
    """(the plan, one dict per pipeline rank) of ``run`` at its configuration plus ``config``
    (``plan --config`` text appended), with the budget lifted so that it is planned whatever
    it needs: per rank the blocks and end layers it holds, its local parameters, the model
    states and the simulated activation peak (bytes, the plan's ``memory``), the peak in
    units of one block's activations, and, for the interleaved schedule, the chunk forwards
    in flight by Megatron-LM's warm-up count (:func:`interleaved_in_flight`), to check the
    simulator against by hand (``bench_published.py --memory``)."""
    from .config import parse_config, restrict
    from .planner import search

    prof, req, hw = _setup(run, efficiency)
    one = replace(restrict(req, parse_config(run.config + config, run.gpus)), top=1,
                  gpu_memory=1e15)
    plan = search(prof, one, hw, efficiency).plans[0]
    lc = plan.costs
    act = list(lc.activation_memory)
    n = len(plan.ranges)
    last = len(act) // n * n  # stages of one model copy
    block = act[1] if n > 1 else act[0]
    rows = []
    for r in range(plan.pp):
        stages = [s for s, x in enumerate(plan.stage_to_rank) if x == r and s < last]
        layers = [i for s in stages for i in range(plan.ranges[s][0], plan.ranges[s][1] + 1)]
        blocks = sum(1 for i in layers if 0 < i < len(prof) - 1)
        row = {"rank": r, "blocks": blocks, "embedding": 0 in layers,
               "head": len(prof) - 1 in layers, **plan.memory[r],
               "peak": plan.peak_memory[r], "physical": hw.memory,
               "budget": hw.memory * (1 - RESERVE),
               "block_activation": block,
               "in_flight_blocks": plan.memory[r]["activations"] / block}
        if plan.chunks > 1 and lookup(plan.schedule).megatron:  # Megatron's interleaved
            row["megatron_in_flight"] = interleaved_in_flight(plan.pp, plan.chunks,
                                                              plan.microbatches, r)
        rows.append(row)
    return plan, rows


# Korthikanti et al. 2022, Table 4: forward and backward milliseconds of one transformer
# layer of the 22B model (a = 64, h = 6144, TP 8, s = 2048; the microbatch of its Table 3,
# 4 sequences), by technique: (sequence parallel, recompute, forward, backward).
TABLE4 = (
    ("baseline (no recompute)", False, "none", 7.7, 11.9),
    ("sequence parallel", True, "none", 7.2, 11.8),
    ("full recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective", 7.7, 13.2),
    ("selective + sequence parallel", True, "selective", 7.2, 13.1),
)


def layer_times(efficiency: float, tp_overlap: bool = True) -> list[dict]:
    """Table 4's rows beside the planner's forward and backward (I + W, with what the
    recompute re-runs) of one 22B block on the A100 preset at ``efficiency``."""
    from .compute import Rates
    from .network import Network
    from .parallel_costs import ParallelCosts

    shape = _gpt(48, 6144, 64)
    hw = replace(get_hardware("a100-80gb"), efficiency=efficiency, tp_overlap=tp_overlap)
    out = []
    for name, sp, rec, fwd, bwd in TABLE4:
        lc = ParallelCosts(shape, SEQ, Rates.of(hw), Network.of(hw), tp=8, sp=sp,
                           flash=False).at(4, rec)
        f, b = lc.f[1] * 1e3, (lc.i[1] + lc.w[1]) * 1e3
        out.append({"technique": name, "forward": fwd, "backward": bwd, "predicted_forward": f,
                    "predicted_backward": b, "error": (f + b) / (fwd + bwd) - 1})
    return out


def explain_pick(run: Run, efficiency: float) -> list[dict]:
    """Why the planner's pick for ``run`` differs from the published configuration: the pick
    (every axis, every family but ``auto``) with the backward's TP collectives overlapped and
    not, and within the families the source had (``run.search``), each beside the published
    configuration priced the same way."""
    from ..schedules import schedule_names
    from .planner import search

    every = tuple(schedule_names(searched=False))
    out = []
    for what, overlap, families in (("every family", True, every),
                                    ("every family, TP not overlapped", False, every),
                                    ("the source's families", True, None)):
        prof, req, hw = _setup(run, efficiency)
        hw = replace(hw, tp_overlap=overlap)
        mine = replace(run, hardware=(*run.hardware, ("tp_overlap", overlap)))
        req = replace(req, schedules=families or req.schedules)
        best = search(prof, req, hw, efficiency).plans[0]
        pub = predict_config(mine, efficiency)
        out.append({"what": what, "pick": best, "published": pub,
                    "margin": pub.step_time / best.step_time - 1})
    return out
