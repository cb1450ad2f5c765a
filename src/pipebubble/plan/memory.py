"""Memory per rank: model states by sharding, activations by recompute mode and TP/SP/CP.

**Model states** (Rajbhandari et al. 2020, ZeRO): per parameter ``w`` bytes of 16-bit
weights, ``g`` of gradients and ``o`` of optimizer state (mixed-precision Adam: fp32 master
weights and two moments, ``o = 12``), ``N`` ranks sharing the states (the data-parallel
group; with context parallelism ``dp x cp``, whose ranks hold the same weights):

============  ==========================  ==============================================
 sharding      bytes per parameter          framework
============  ==========================  ==============================================
 ``ddp``       ``w + g + o``                DDP, Megatron without the distributed optimizer
 ``zero1``     ``w + g + o / N``            Megatron ``--use-distributed-optimizer``
 ``zero2``     ``w + (g + o) / N``          DeepSpeed ZeRO-2
 ``fsdp``      ``(w + g + o) / N``          FSDP / ZeRO-3 (torchtitan ``data_parallel_shard``)
 ``hsdp``      ``(w + g + o) / S``          FSDP sharded over ``S`` ranks inside a node,
                                            replicated across (torchtitan shard x replicate)
============  ==========================  ==============================================

FSDP and HSDP resharded ``never`` (``plan --fsdp-reshard``, :mod:`pipebubble.plan.sharding`:
torchtitan under PP) hold the gathered weights and the unsharded gradients across the
microbatches: ``w + g + o / N`` (``keep``); resharded ``always`` they hold the sharded states
and, for the layers in flight, the gathered transient of
:func:`~pipebubble.plan.sharding.gathered_bytes`.

Defaults ``w = 2, g = 2, o = 12`` are the ZeRO paper's 16 bytes for DDP. Each is a flag of
``plan`` (:func:`model_states`):

- ``--param-bytes w`` (2): the weights the forward and backward read (bf16; 4 for fp32);
- ``--grad-bytes g`` (2): the gradient each parameter accumulates over the microbatches.
  Frameworks that keep fp32 gradients (Megatron-LM's main gradients, Llama 3's fp32
  accumulation, torchtitan's FSDP reduced in fp32) hold ``g = 4``; at the default the count
  is 2 bytes a parameter low for them (``2 / N`` sharded), never high;
- ``--optimizer-bytes o`` (12): what the optimizer keeps per parameter, **master copy and
  both Adam moments together**: 12 = fp32 master + fp32 ``m`` + fp32 ``v`` (mixed-precision
  Adam, ZeRO's ``K``); 8 = fp32 master + bf16 moments (Megatron-LM
  ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``); 6 =
  bf16 master + bf16 moments; 8 for plain fp32 Adam whose weights are their own master
  (``w = 4``, ``o = m + v``).

``--bytes-per-param B`` (the older form, still read) splits one total as ``B/8 : B/8 :
3B/4``. With ``--precision fp8`` every weight also has an FP8 copy, ``FP8_COPY_BYTES`` (1)
more in ``w`` (Transformer Engine casts each weight to FP8 once and keeps it across the
microbatches; with FP8 primary weights it is the weight itself, the 16-bit and fp32 copies
then living in ``o``); it is held and sharded as the weights are, and counted for every
parameter, the embedding and head too, which FP8 recipes keep in 16-bit (so the count is
high by their parameters' byte, never low).

**Activations of one block, one microbatch** (bytes; ``T = s b / cp`` tokens on the rank,
``t`` the TP degree). Korthikanti et al. 2022 count a GPT block as ``34 s b h + 5 a s^2 b``:
the two norm inputs ``4 T h``, attention input ``2 T h``, Q, K, V ``6 T h``, the projection's
input ``2 T h``, MLP input ``2 T h``, the GELU's input and output ``16 T h`` (``4 T f`` with
``f = 4h``), two dropout masks ``2 T h`` and the scores, softmax and its dropout ``5 a s^2 b``.
Generalised here to grouped-query attention (K, V ``4 T k d``), SwiGLU (``6 T f``: gate, up and
their product) and models without dropout (LLaMA):

- replicated across TP ranks unless sequence parallel: norms, attention and MLP inputs and
  the dropout masks (``8 T h + masks``, Korthikanti's ``10 s b h`` for GPT);
- split over TP: Q, K, V, the attention output and the MLP's inner activations;
- the attention core ``5 a s^2 b / cp`` only without FlashAttention (which keeps none of it);
- ``selective`` recomputation drops the core (so equals ``none`` with FlashAttention);
  ``full`` keeps the block input only, ``2 T h`` (``/ t`` with SP);
- ``op``: torchtitan's op-level selective checkpointing (``activation_checkpoint.mode =
  "selective"``, ``selective_ac_option = "op"``; its ``_op_sac_save_list`` and policy in
  ``torchtitan/distributed/activation_checkpoint.py``): of the ops of a block it keeps the
  outputs of every matrix multiply (``aten.mm``) except every second one of the block, of
  SDPA (FlashAttention's output and its fp32 log-sum-exp) and of the reduce-scatters, and
  recomputes everything else from the block's input (:func:`op_sac_matmuls` says which).

What the count assumes: each tensor a backward reads is kept once, and nothing else (no
stage outputs: Megatron-LM frees an output's data once sent; no allocator or NCCL memory:
``plan --reserve``; no transients of the backward that runs at the peak). Two published
options keep less without recomputing a GEMM, and neither is assumed: norms that keep their
output instead of their input (Apex's ``memory_efficient`` norms, Megatron-LM
``--memory-efficient-layer-norm``: the output is kept anyway as the next GEMM's input, so
``4 T h`` less, ``/ t`` with SP), and re-running SwiGLU's product in the backward
(``2 T f / t`` less). For LLaMA-3 405B at TP 8 with SP this count is ``31.75 T h / t`` (65,024
bytes a token), checked term by term in ``tests/test_plan_price_memory.py``; Megatron-LM's
estimate (``theoretical_memory_usage.py``, ``(18 + 4 f / h) T h / t`` = 31) counts neither GQA
nor SwiGLU's third matrix.

>>> from pipebubble.plan.analytic import TransformerShape
>>> gpt = TransformerShape(layers=1, hidden=1024, ffn=4096, heads=16, vocab=1000,
...                        swiglu=False, dropout=True)
>>> s, b, h, a = 2048, 1, 1024, 16
>>> block_activation_bytes(gpt, s, b, flash=False) == s * b * h * (34 + 5 * a * s / h)
True
>>> block_activation_bytes(gpt, s, b, tp=8, flash=False) == s*b*h * (10 + 24/8 + 5*a*s/(h*8))
True
>>> block_activation_bytes(gpt, s, b) == 34 * s * b * h  # FlashAttention keeps no scores
True
>>> block_activation_bytes(gpt, s, b, tp=8, sp=True, recompute="selective") == s*b*h*34/8
True
>>> model_state_bytes("zero1", 8)  # 2 + 2 + 12 / 8
5.5
>>> model_state_bytes("zero1", 8, *model_states(optimizer=6))  # bf16 master and moments
4.75
>>> model_states(precision="fp8")  # the FP8 copy beside the bf16 weights
(3.0, 2.0, 12.0)
"""

from __future__ import annotations

import math

from ..errors import ParamError
from ..errors import param as mark
from .shardings import SHARDINGS, Sharding

__all__ = ["SHARDINGS"]
FP8_COPY_BYTES = 1.0  # an FP8 copy of each weight (--precision fp8)
STATE_PARAMS = ("param_bytes", "gradient_bytes", "optimizer_bytes")
"""The names errors give ``model_states``' three byte counts (``Request.state_bytes``)."""


def model_states(param: float = 2.0, grad: float = 2.0, optimizer: float = 12.0,
                 precision: str = "bf16") -> tuple[float, float, float]:
    """``(w, g, o)``, the bytes per parameter the count above uses: ``param`` (the weights),
    ``grad`` and ``optimizer`` (master copy + Adam moments), each a finite number > 0, and
    the FP8 copy in ``w`` under ``precision`` ``fp8``. Raises one line naming the parameter
    (:data:`STATE_PARAMS`)."""
    from .compute import check_precision

    for name, v in zip(STATE_PARAMS, (param, grad, optimizer), strict=True):
        if isinstance(v, bool) or not isinstance(v, int | float) or not (
                v > 0 and math.isfinite(v)):
            raise ParamError(f"{mark(name)} must be a finite number of bytes > 0, got {v!r}")
    copy = FP8_COPY_BYTES if check_precision(precision) == "fp8" else 0.0
    return float(param) + copy, float(grad), float(optimizer)


def model_state_bytes(sharding: str, n: int, weight: float = 2.0, grad: float = 2.0,
                      optimizer: float = 12.0, keep: bool = False) -> float:
    """Bytes per (local) parameter under ``sharding`` over ``n`` ranks (table above; for
    ``hsdp`` pass the shard group's size; ``keep``: fsdp / hsdp with the weights and
    gradients kept unsharded across microbatches)."""
    return Sharding.of(sharding).state_bytes(n, weight, grad, optimizer, keep)


def block_activation_bytes(shape, s: int, b: int, tp: int = 1, sp: bool = False, cp: int = 1,
                           recompute: str = "none", flash: bool = True) -> float:
    """What F of one block keeps for its backward (module doc), in bytes."""
    T = s * b / cp
    h, f = shape.hidden, shape.ffn
    kvd = shape.kv * shape.head_dim
    qd = shape.heads * shape.head_dim
    if recompute == "full":
        return 2 * T * h / (tp if sp else 1)
    if recompute == "op":
        kept = sum(width for _, width, saved in op_sac_matmuls(shape, tp) if saved)
        sdpa = 2 * qd / tp + 4 * shape.heads / tp  # the output, the fp32 log-sum-exp
        scatters = 2 * 2 * h / tp if sp and tp > 1 else 0.0  # after wo and w2
        return T * (2 * h / (tp if sp else 1) + 2 * kept + sdpa + scatters)
    replicated = 8 * T * h + (2 * T * h if shape.dropout else 0)  # two 1-byte masks
    split = 2 * T * qd + 4 * T * kvd + 2 * T * qd + (6 if shape.swiglu else 4) * T * f
    core = 0.0
    if not flash and recompute == "none":
        core = 5 * shape.heads * s * s * b / (cp * tp)  # local queries x every key, a/t heads
    return replicated / (tp if sp else 1) + split / tp + core


def op_sac_matmuls(shape, tp: int = 1) -> list[tuple[str, float, bool]]:
    """The matrix multiplies of one block in the order torchtitan's decoder runs them
    (``wq``, ``wk``, ``wv``, SDPA, ``wo``; ``w1``, ``w3``, ``w2`` for SwiGLU, ``w1``, ``w2``
    otherwise), each ``(name, output width a token on a TP rank, kept)`` under its op-level
    policy: the count restarts in each block and every even-numbered ``mm`` is recomputed
    ("saves output of all compute ops, except every second mm"). ``wo`` and ``w2`` give their
    full ``h`` on each TP rank (partial sums before the reduction).

    >>> from pipebubble.plan.analytic import TransformerShape
    >>> sh = TransformerShape(layers=1, hidden=8, ffn=16, heads=2, vocab=10, kv_heads=1)
    >>> [(n, w) for n, w, kept in op_sac_matmuls(sh) if kept]
    [('wq', 8), ('wv', 4), ('w1', 16), ('w2', 8)]
    """
    h, f = shape.hidden, shape.ffn
    qd, kvd = shape.heads * shape.head_dim, shape.kv * shape.head_dim
    mms = [("wq", qd / tp), ("wk", kvd / tp), ("wv", kvd / tp), ("wo", h), ("w1", f / tp)]
    mms += [("w3", f / tp), ("w2", h)] if shape.swiglu else [("w2", h)]
    return [(n, w if w != int(w) else int(w), i % 2 == 1) for i, (n, w) in enumerate(mms, 1)]


def block_weight_grad_bytes(shape, s: int, b: int, tp: int = 1, sp: bool = False,
                            cp: int = 1) -> float:
    """Of those, what W alone needs (Zero Bubble's M_W): the inputs of the matrix
    multiplies, ``2 T (3 h [/t with SP] + q/t + f/t)`` (QKV, MLP and down-projection inputs
    and the attention output)."""
    T = s * b / cp
    h, f = shape.hidden, shape.ffn
    qd = shape.heads * shape.head_dim
    return 2 * T * (2 * h / (tp if sp else 1) + qd / tp + f / tp)


def head_activation_bytes(shape, s: int, b: int, tp: int = 1, sp: bool = False,
                          cp: int = 1) -> float:
    """Final norm and head: the norm's and projection's inputs ``4 T h`` (``/ t`` with SP)
    and the fp32 logits for the cross-entropy ``4 T V / t`` (vocabulary-parallel)."""
    T = s * b / cp
    return 4 * T * shape.hidden / (tp if sp else 1) + 4 * T * shape.vocab / tp


def embedding_activation_bytes(s: int, b: int, cp: int = 1) -> float:
    """The int64 token ids."""
    return 8 * s * b / cp
