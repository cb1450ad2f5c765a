"""Published runs the planner is checked against: Megatron-LM's SC'21 Table 1.

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

from .analytic import TransformerShape, shape_profile
from .fit import fit_efficiency
from .hardware import get_hardware
from .layercosts import ProfileSet
from .plans import Request

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
        return self.gpus // (self.tp * self.pp)

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


def request_of(row: Row, gpu_memory: float) -> Request:
    """The published configuration; microbatch size and chunks searched."""
    return Request(gpus=row.gpus, gpu_memory=gpu_memory, global_batch=row.batch,
                   microbatch_sizes=(1, 2, 4, 8), schedules=("interleaved-1f1b", "1f1b"),
                   max_chunks=4, recompute=("full",), tp=(row.tp,), pp=(row.pp,), cp=(1,),
                   sp=(False,), shardings=("ddp",), grad_bytes=4.0, top=1)


def predict_row(row: Row, hw, efficiency: float):
    """The planner's best plan for the row's published configuration."""
    from .planner import search

    prof = ProfileSet([shape_profile(shape_of(row), SEQ, 1, attention="unfused")])
    hw = replace(hw, efficiency=efficiency, tp_overlap=False)  # measured before Megatron-LM
    # overlapped the backward's TP all-reduces with weight gradients (September 2021)
    return search(prof, request_of(row, hw.memory * 0.95), hw, efficiency).plans[0]


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
