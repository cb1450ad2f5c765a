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

Defaults ``w = 2, g = 2, o = 12`` are the ZeRO paper's 16 bytes for DDP (``plan
--bytes-per-param`` scales the three together, 1/8 : 1/8 : 3/4). Frameworks that keep fp32
gradients (Megatron-LM's main gradients, Llama 3's fp32 accumulation over microbatches,
torchtitan's FSDP) hold ``g = 4``: 2 bytes a parameter more than counted here (``2 / N``
sharded), so the count is low for them, never high.

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
  ``full`` keeps the block input only, ``2 T h`` (``/ t`` with SP).

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
"""

from __future__ import annotations

from .shardings import SHARDINGS, Sharding

__all__ = ["SHARDINGS"]


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
    replicated = 8 * T * h + (2 * T * h if shape.dropout else 0)  # two 1-byte masks
    split = 2 * T * qd + 4 * T * kvd + 2 * T * qd + (6 if shape.swiglu else 4) * T * f
    core = 0.0
    if not flash and recompute == "none":
        core = 5 * shape.heads * s * s * b / (cp * tp)  # local queries x every key, a/t heads
    return replicated / (tp if sp else 1) + split / tp + core


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
