"""Analytic profiles of decoder-only transformers: no GPU, no tensors, just the shape.

A model that does not fit on this machine can still be planned: its per-layer parameters,
FLOPs, time and activation bytes follow from its shape. :func:`analytic_profile` writes the
same :class:`~pipebubble.plan.profile.Profile` that ``pipebubble profile`` measures, with the
layers ``tok_embeddings``, ``layers.0`` .. ``layers.{L-1}`` and ``output`` (final norm + head).

Notation: ``L`` layers, ``h`` hidden size, ``f`` FFN size, ``a`` heads, ``k`` key/value heads
(grouped-query attention; ``k = a`` is plain multi-head), ``d = h / a`` head size, ``V``
vocabulary, ``s`` sequence length, ``b`` microbatch size, ``t = s b`` tokens.

**Parameters** (LLaMA: no biases, RMSNorm, SwiGLU MLP with three matrices):

- embedding ``V h``; head ``V h`` (0 with tied embeddings: the profile counts the model
  once; with pp > 1 Megatron keeps a second copy on the last stage, which the planner adds
  to that stage's rank, :class:`~pipebubble.plan.layercosts.LayerCosts` ``tied``); final
  norm ``h``;
- one block: attention ``2 h^2 + 2 h k d`` (Q and O are ``h x h``, K and V ``h x k d``),
  MLP ``3 h f`` (``2 h f`` for a GELU MLP, ``swiglu=False``), two norms ``2 h``.

LLaMA-7B (L=32, h=4096, f=11008, a=32, V=32000, untied): 6,738,415,616 parameters.

**FLOPs** (Narayanan et al. 2021, *Efficient Large-Scale Language Model Training on GPU
Clusters*, appendix on FLOPs: a matrix multiply of ``m x n`` by ``n x p`` is ``2 m n p``;
the backward costs twice the forward):

- block forward: ``2 t P_mm + 4 b s^2 h`` with ``P_mm`` the block's matrix parameters; the
  second term is ``Q K^T`` and ``scores x V`` (full, not halved for causal masking);
- head forward: ``2 t h V``; embedding and norms: 0 (element-wise work);
- backward: the input gradient ``I`` (``2 t P_mm + 8 b s^2 h``) plus the weight gradient
  ``W`` (``2 t P_mm``): each matrix multiply has one of each, attention scores have no weight.

**Time** = FLOPs / (peak FLOP/s x MFU), for F, I and W alike.

**Activation bytes per microbatch** (:mod:`pipebubble.plan.memory`, after Korthikanti et al.
2022, *Reducing Activation Recomputation in Large Transformer Models*, 16-bit activations;
scaled by ``bytes(dtype) / 2`` for other dtypes). With FlashAttention (the default,
``attention="flash"``) no ``s^2`` scores are kept; ``attention="unfused"`` keeps them
(Korthikanti's ``5 a s^2 b``). For a GPT block (4h GELU MLP, ``dropout=True``):

- no recomputation: ``s b h (34 + 5 a s / h)`` unfused, ``34 s b h`` with FlashAttention;
- selective recomputation (attention scores recomputed): ``34 s b h``; the backward
  re-runs the ``4 b s^2 h`` score FLOPs;
- full recomputation: ``2 s b h`` (the block input); the backward re-runs the forward;
- head: ``4 s b h`` (the norm's and the projection's inputs) plus ``4 s b V`` (fp32 logits
  for the cross-entropy); embedding: ``8 s b`` (the int64 token ids).

LLaMA blocks (SwiGLU, grouped-query attention, no dropout) are counted the same way from their
tensors (:func:`pipebubble.plan.memory.block_activation_bytes`). What W alone keeps (Zero
Bubble's ``M_W``: the inputs of the matrix multiplies) is
:func:`~pipebubble.plan.memory.block_weight_grad_bytes`, ``2 s b h`` for the head.

Without ``tflops`` and ``mfu`` the profile is *hardware free* (every time 0): ``plan --gpu``
then prices each layer from the shape (per-op GEMM, attention and memory-bound times).

>>> p = analytic_profile(layers=32, hidden=4096, ffn=11008, heads=32, vocab=32000, seq=2048,
...                      batch=1, tflops=989, mfu=0.4)
>>> sum(layer.params for layer in p.layers)
6738415616
>>> gpt = analytic_profile(layers=2, hidden=4096, ffn=16384, heads=32, vocab=32000,
...     seq=2048, batch=1, swiglu=False, dropout=True, attention="unfused")
>>> gpt.layers[1].activation_bytes == 2048 * 4096 * (34 + 5 * 32 * 2048 / 4096)
True
"""

from __future__ import annotations

import math
from dataclasses import asdict

from ..errors import UserError, param
from ..limits import check_layers
from ..transformer_shape import TransformerShape
from .profile import FORMAT, LayerProfile, Profile

__all__ = ["TransformerShape", "analytic_profile", "shape_profile"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE_MODES = ("none", "selective", "full", "op")  # op: torchtitan's op-level SAC
# (memory.op_sac_matmuls)
SOURCE = ("Korthikanti et al. 2022 (activations); Narayanan et al. 2021 (FLOPs); "
          "time = FLOPs / (tflops x mfu)")


def analytic_profile(layers: int, hidden: int, ffn: int, heads: int, vocab: int, seq: int,
                     batch: int, tflops: float | None = None, mfu: float | None = None,
                     kv_heads: int | None = None, dtype: str = "bf16",
                     tied_embeddings: bool = False, swiglu: bool = True,
                     attention: str = "flash", dropout: bool = False) -> Profile:
    """The profile of one microbatch of ``batch`` sequences of ``seq`` tokens (module doc).

    Each layer carries, beside the usual fields (``forward``/``backward`` seconds with
    ``backward`` = I + W, ``params``, ``activation_bytes`` without recomputation, ``flops``
    forward + backward): ``weight_backward`` (W seconds), ``weight_activation_bytes`` (M_W),
    ``output_bytes`` (what the next stage receives), and per recomputation mode
    ``activation_bytes_full`` / ``recompute_time_full`` (and ``_selective``): the bytes F
    keeps and the forward time the backward re-runs.
    """
    check_layers(layers)  # the library entry point bounds its work too (limits.py)
    shape = TransformerShape(layers, hidden, ffn, heads, vocab, kv_heads, tied_embeddings,
                             swiglu, dropout=dropout)
    return shape_profile(shape, seq, batch, tflops, mfu, dtype, attention)


def shape_profile(shape: TransformerShape, seq: int, batch: int, tflops: float | None = None,
                  mfu: float | None = None, dtype: str = "bf16", attention: str = "flash",
                  source: dict | None = None) -> Profile:
    """:func:`analytic_profile` of a shape. Without ``tflops`` and ``mfu`` the profile is
    hardware free: every time is 0 and ``plan --gpu NAME`` prices the layers from the shape
    (:mod:`pipebubble.plan.parallel_costs`); ``source`` (the HF keys used) is recorded."""
    from .memory import block_activation_bytes, block_weight_grad_bytes, op_sac_matmuls

    layers, hidden, vocab = shape.layers, shape.hidden, shape.vocab
    free = tflops is None and mfu is None
    rate = profile_rate(seq, batch, tflops, mfu, dtype, attention)
    k = DTYPE_BYTES[dtype] / 2  # Korthikanti's byte counts assume 2-byte activations
    s, b, h, V = seq, batch, hidden, vocab
    t = s * b
    pmm = shape.block_matmul_params()
    scores = 4 * b * s * s * shape.heads * shape.head_dim
    flash = attention == "flash"
    qd, kvd, f = shape.heads * shape.head_dim, shape.kv * shape.head_dim, shape.ffn
    redo = {"wk": h * kvd, "wo": qd * h, "w3": h * f, "w2": f * h}  # parameters of each
    # matrix torchtitan's op-level SAC recomputes (memory.op_sac_matmuls)
    out = [embedding_layer(shape.embedding_params(), t, h, k, rate)]
    block_act = block_activation_bytes(shape, s, b, flash=flash) * k
    for n in range(layers):
        out.append(_layer(
            f"layers.{n}", "TransformerBlock", params=shape.block_params(),
            fwd=2 * t * pmm + scores, i=2 * t * pmm + 2 * scores, w=2 * t * pmm, rate=rate,
            act=block_act, act_w=block_weight_grad_bytes(shape, s, b) * k,
            out_bytes=2 * t * h * k,
            full=(2 * t * h * k, (2 * t * pmm + scores) / rate),
            selective=(block_activation_bytes(shape, s, b, recompute="selective",
                                              flash=flash) * k, scores / rate),
            op=(block_activation_bytes(shape, s, b, recompute="op", flash=flash) * k,
                2 * t * sum(redo[n] for n, _, kept in op_sac_matmuls(shape) if not kept)
                / rate)))
    out.append(head_layer(shape.head_params(), t, h, V, k, rate))
    meta = {"format": FORMAT, "source": "analytic", "method": SOURCE, "device": "analytic",
            "dtype": dtype, "batch": batch, "seq": seq, "tflops": tflops, "mfu": mfu,
            "attention": attention, "hardware_free": free,
            "model": asdict(shape), "params": shape.total_params()}
    if source is not None:
        meta["hf_config"] = source
    return Profile(out, meta)


def profile_rate(seq: int, batch: int, tflops: float | None, mfu: float | None, dtype: str,
                 attention: str) -> float:
    """Check an analytic profile's settings; the FLOP/s its times are at (inf: hardware
    free, every time 0)."""
    if attention not in ("flash", "unfused"):
        raise UserError(f"unknown {param('attention')} {attention!r}; valid are flash, unfused")
    for name, value in (("seq", seq), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{param(name)} must be an integer >= 1, got {value!r}")
    if dtype not in DTYPE_BYTES:
        raise UserError(f"unknown {param('dtype')} {dtype!r}; valid are {', '.join(DTYPE_BYTES)}")
    free = tflops is None and mfu is None
    if not free:
        if tflops is None or not (tflops > 0 and tflops != float("inf")):
            raise UserError(f"{param('tflops')} must be a finite number > 0 (peak TFLOP/s), got "
                             f"{tflops}")
        if mfu is None or not 0 < mfu <= 1:
            raise UserError(f"{param('mfu')} must be in (0, 1] (model FLOPs utilisation), got "
                            f"{mfu}")
    rate = float("inf") if free else tflops * 1e12 * mfu
    if not (rate > 0 and (free or math.isfinite(rate))):  # 1e-300 x 1e-300 underflows to 0
        raise UserError(f"{param('tflops')} {tflops:g} x {param('mfu')} {mfu:g} is not a usable "
                        "rate of FLOP/s")
    return rate


def embedding_layer(params: int, t: int, h: int, k: float, rate: float) -> LayerProfile:
    """The token embedding of ``t`` tokens: no FLOPs, keeps the int64 ids (``8 t`` bytes),
    sends ``2 t h`` (times ``k`` = dtype bytes / 2)."""
    return _layer("tok_embeddings", "Embedding", params=params, fwd=0.0, i=0.0, w=0.0,
                  rate=rate, act=8.0 * t, act_w=0.0, out_bytes=2 * t * h * k,
                  full=(8.0 * t, 0.0), selective=(8.0 * t, 0.0))


def head_layer(params: int, t: int, h: int, V: int, k: float, rate: float) -> LayerProfile:
    """Final norm + output projection: ``2 t h V`` FLOPs each for F, I and W; keeps the norm's
    and projection's inputs and the fp32 logits."""
    head_act = 4 * t * h * k + 4 * t * V
    return _layer("output", "NormHead", params=params, fwd=2 * t * h * V, i=2 * t * h * V,
                  w=2 * t * h * V, rate=rate, act=head_act, act_w=2 * t * h * k,
                  out_bytes=0.0, full=(head_act, 0.0), selective=(head_act, 0.0),
                  modules=["norm", "output"])


def _layer(name: str, kind: str, *, params: int, fwd: float, i: float, w: float, rate: float,
           act: float, act_w: float, out_bytes: float, full: tuple[float, float],
           selective: tuple[float, float], op: tuple[float, float] | None = None,
           modules: list[str] | None = None) -> LayerProfile:
    """One layer from FLOPs (forward, input gradient, weight gradient) and bytes."""
    extra: dict = {
        "forward_flops": float(fwd), "input_grad_flops": float(i),
        "weight_grad_flops": float(w),
        "weight_backward": w / rate,
        "weight_activation_bytes": float(act_w),
        "output_bytes": float(out_bytes),
        "activation_bytes_full": float(full[0]),
        "recompute_time_full": float(full[1]),
        "activation_bytes_selective": float(selective[0]),
        "recompute_time_selective": float(selective[1]),
    }
    if op is not None:
        extra["activation_bytes_op"], extra["recompute_time_op"] = float(op[0]), float(op[1])
    if modules:
        extra["modules"] = modules
    return LayerProfile(name, fwd / rate, (i + w) / rate, int(params), float(act),
                        float(fwd + i + w), kind, extra)


def profile_batch(profile: Profile) -> int:
    """The microbatch size a profile was taken at: ``batch`` (analytic profiles) or the
    first dimension of ``batch_shape`` (measured ones). Raises ValueError when neither."""
    meta = profile.metadata
    value = meta.get("batch")
    if value is None and isinstance(meta.get("batch_shape"), list) and meta["batch_shape"]:
        value = meta["batch_shape"][0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError("the profile does not say its microbatch size: it needs a 'batch' "
                         "(or 'batch_shape') entry with an integer >= 1, got "
                         f"{value!r}")
    return value
