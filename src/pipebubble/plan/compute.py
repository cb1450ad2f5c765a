"""The compute model: seconds for one operation on one GPU, from its shape.

Three kinds of work, each priced on a :class:`~pipebubble.plan.hardware.Hardware` at an
efficiency ``E`` (the fraction of peak large GEMMs reach; one default per preset,
``plan --efficiency``, or fitted by ``plan --measured-step``):

- **GEMM** ``(m x k) @ (k x n)``: ``2 m n k`` FLOPs at ``E x g(m) g(n) g(k)`` of peak, where
  ``g(d) = d / (d + 128)`` is the loss of a tile-based kernel on a dimension of ``d`` (a
  dimension of 128 runs at half speed, 4096 at 97 %): small microbatches (few tokens ``m``) and
  large TP degrees (thin ``n`` or ``k``) run less efficiently. It can never run faster than
  reading its operands and writing its result from HBM (``2 (m k + k n + m n)`` bytes).
- **attention**: FlashAttention's ``4 T S q`` FLOPs per forward (``T`` local queries, ``S``
  keys, ``q`` = local heads x head size; half of it with the causal mask) at ``0.8 E g(T)``;
  the backward is 2.5 forwards (it recomputes the scores). Without FlashAttention
  (``unfused``): two batched GEMMs and the softmax and dropout over the ``s^2`` scores as
  memory-bound work.
- **memory-bound** (norms, residual adds, activations, rotary, dropout, cross-entropy): bytes
  moved / HBM bandwidth.

**Precision** (``plan --precision``). ``bf16`` (the default): everything above at the bf16
peak. ``fp8``: the transformer blocks' GEMMs (QKV, attention output, MLP; forward, data and
weight gradients, as Transformer Engine's FP8 recipes and torchao's float8 training run them)
at ``E x`` the preset's FP8 peak (``Hardware.fp8_peak_flops``), reading 1-byte operands and
writing 16-bit results; attention (FlashAttention, or the unfused score GEMMs and softmax),
the head's GEMM (every FP8 recipe keeps the output layer in 16-bit) and the memory-bound work
stay as above. Not priced: the casts to FP8 (Transformer Engine fuses those of the QKV and
MLP-up inputs into the norms; the others are each one read and write of an activation) and
the amax/scale bookkeeping. The same ``E`` is assumed for both peaks (cuBLAS FP8 GEMMs reach a
similar fraction of theirs on large shapes); ``--measured-step`` fits it on an FP8 run.

>>> from pipebubble.plan.hardware import get_hardware
>>> rate = Rates.of(get_hardware("h100-sxm"), 0.5)
>>> big = gemm_time(8192, 8192, 8192, rate)
>>> round(2 * 8192**3 / big / 1e12)      # TFLOP/s: 989 x 0.5 x (8192/8320)^3
472
>>> gemm_time(8192, 1024, 8192, rate) / big > 1 / 8   # an 8x thinner GEMM: less efficient
True
>>> fp8 = Rates.of(get_hardware("h100-sxm"), 0.5, "fp8")
>>> round(big / gemm_time(8192, 8192, 8192, fp8, fp8=True), 3)  # 1979 / 989 TFLOP/s
2.001
>>> gemm_time(8192, 8192, 8192, fp8) == big   # a GEMM not marked FP8 (the head) stays bf16
True
"""

from __future__ import annotations

from dataclasses import dataclass

HALF_TILE = 128.0  # g(d) = d / (d + 128)
ATTENTION_EFFICIENCY = 0.8  # FlashAttention reaches 0.8 of what large GEMMs reach
ATTENTION_BACKWARD = 2.5  # FlashAttention's backward / forward FLOPs


PRECISIONS = ("bf16", "fp8")
"""``plan --precision``: the GEMMs of the blocks in bf16 (every op) or in FP8 (module doc)."""


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else one line listing them."""
    if precision not in PRECISIONS:
        from ..errors import UserError, param

        raise UserError(f"unknown {param('precision')} {precision!r}; valid are "
                        f"{', '.join(PRECISIONS)}")
    return precision


@dataclass(frozen=True)
class Rates:
    """What one GPU does per second: ``flops`` (bf16 peak x efficiency), ``hbm`` bytes/s and
    ``fp8_flops`` (FP8 peak x efficiency, the rate of GEMMs marked FP8; 0: they run at
    ``flops``, ``--precision bf16``)."""

    flops: float
    hbm: float
    flat: bool = False  # ``--mfu``: every FLOP at ``flops``, no shape curve, no HBM time
    grad_accumulation: float = 0.0  # HBM bytes per local parameter per backward (hardware.py)
    fp8_flops: float = 0.0
    loss_bytes: float = 0.0  # memory, carried with the rates: Hardware.loss_bytes

    @classmethod
    def of(cls, hw, efficiency: float | None = None, precision: str = "bf16",
           mfu: float | None = None) -> Rates:
        """``hw``'s rates at ``efficiency`` (default the preset's), or, with ``mfu``
        (``--mfu``), every FLOP at ``peak x mfu`` with no shape curve and no HBM time (so the
        gradient-accumulation bytes carried here cost nothing there)."""
        e = hw.efficiency if efficiency is None else efficiency
        if mfu is not None:
            e = mfu
        return cls(hw.peak_flops * e, hw.hbm_bandwidth, flat=mfu is not None,
                   grad_accumulation=getattr(hw, "grad_accumulation_bytes", 0.0),
                   fp8_flops=fp8_peak(hw, precision) * e,
                   loss_bytes=getattr(hw, "loss_bytes", 0.0))


def fp8_peak(hw, precision: str) -> float:
    """The FP8 peak the blocks' GEMMs run at under ``precision`` (0 for ``bf16``); raises one
    line when ``fp8`` is asked of a GPU without FP8 tensor cores."""
    if check_precision(precision) == "bf16":
        return 0.0
    peak = getattr(hw, "fp8_peak_flops", 0.0)
    if not peak > 0:
        from ..errors import UserError, param

        raise UserError(f"{param('precision')} fp8: {hw.name} has no FP8 tensor cores (its preset "
                        f"has no FP8 peak); use {param('precision')} bf16, or give "
                        f"{param('fp8_peak_flops')}")
    return peak


def shape_factor(d: float) -> float:
    """``g(d)``: how much of its efficiency a GEMM keeps on a dimension of ``d``."""
    return d / (d + HALF_TILE)


def gemm_time(m: float, n: float, k: float, rate: Rates, fp8: bool = False) -> float:
    """Seconds for ``(m x k) @ (k x n)`` in 16-bit, or with ``fp8`` (a block's GEMM) in FP8
    when ``rate`` has an FP8 rate: 1-byte operands, a 16-bit result (module doc)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    eight = fp8 and rate.fp8_flops > 0
    peak = rate.fp8_flops if eight else rate.flops
    if rate.flat:
        return flops / peak
    compute = flops / (peak * shape_factor(m) * shape_factor(n) * shape_factor(k))
    operand = 1.0 if eight else 2.0
    return max(compute, memory_time(operand * (m * k + k * n) + 2.0 * m * n, rate))


def memory_time(nbytes: float, rate: Rates) -> float:
    """Seconds to move ``nbytes`` through HBM (0 under ``--mfu``)."""
    return 0.0 if rate.flat else nbytes / rate.hbm


def attention_time(queries: float, keys: float, width: float, rate: Rates,
                   causal: bool = True, flash: bool = True, sequences: float = 1.0,
                   head_dim: float = 128.0) -> float:
    """Forward seconds of attention: ``queries`` local query tokens (over ``sequences``
    sequences), each against ``keys`` keys, ``width`` = local heads x head size (module doc).
    """
    if flash or rate.flat:
        flops = 4.0 * queries * keys * width * (0.5 if causal else 1.0)
        if rate.flat:
            return 4.0 * queries * keys * width / rate.flops
        return flops / (rate.flops * ATTENTION_EFFICIENCY * shape_factor(queries))
    # Q K^T and scores x V: one GEMM of (queries per sequence x head_dim) by (head_dim x keys)
    # per (sequence, head) pair, twice; softmax and dropout read and write the scores.
    heads = width / head_dim
    gemms = 2 * sequences * heads * gemm_time(queries / sequences, keys, head_dim, rate)
    return gemms + memory_time(9.0 * queries * keys * heads, rate)  # 2+2 B, twice, + mask


def attention_backward_time(forward: float, flash: bool = True) -> float:
    """FlashAttention recomputes the scores (2.5 forwards); unfused: twice the forward."""
    return forward * (ATTENTION_BACKWARD if flash else 2.0)
