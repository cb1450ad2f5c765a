"""torchtitan's op-level selective activation checkpointing as the recompute mode ``op``
(plan/memory.py ``op_sac_matmuls``): what a block keeps and what its backward re-runs, by hand.

torchtitan's policy (``activation_checkpoint.mode = "selective"``, ``selective_ac_option =
"op"``): keep the outputs of every ``aten.mm`` except every second one of the block, of SDPA
and of the reduce-scatters; recompute the rest from the block's input."""

from __future__ import annotations

import pytest

from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.compute import Rates, gemm_time, memory_time
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.memory import block_activation_bytes, op_sac_matmuls
from pipebubble.plan.network import Network
from pipebubble.plan.parallel_costs import ParallelCosts

# h 8, 2 heads of 4, one K/V head (kv dim 4), SwiGLU inner 16
TINY = TransformerShape(layers=1, hidden=8, ffn=16, heads=2, vocab=10, kv_heads=1)
LLAMA8B = TransformerShape(layers=32, hidden=4096, ffn=14336, heads=32, vocab=128256,
                           kv_heads=8)


def test_the_matmul_order_keeps_the_odd_ones():
    """wq 1 kept, wk 2 re-run, wv 3 kept, wo 4 re-run, w1 5 kept, w3 6 re-run, w2 7 kept."""
    got = [(n, kept) for n, _, kept in op_sac_matmuls(TINY)]
    assert got == [("wq", True), ("wk", False), ("wv", True), ("wo", False), ("w1", True),
                   ("w3", False), ("w2", True)]


def test_kept_bytes_of_a_tiny_block_by_hand():
    """s = 4, b = 1 (T = 4 tokens), bf16. A token keeps: the block input 2 x 8, wq's output
    2 x 8, wv's 2 x 4, SDPA's output 2 x 8 and its fp32 log-sum-exp 4 x 2 heads, w1's 2 x 16,
    w2's 2 x 8: 112 bytes, 448 for the block. TP 2 with SP: input 2 x 8 / 2, wq 2 x 4, wv
    2 x 2, SDPA 2 x 4 + 4 x 1, w1 2 x 8, w2 (partial sums, full h) 2 x 8, the two
    reduce-scatters' outputs 2 x 2 x 8 / 2: 80 bytes a token."""
    assert block_activation_bytes(TINY, 4, 1, recompute="op") == 448
    assert block_activation_bytes(TINY, 4, 1, tp=2, sp=True, recompute="op") == 4 * 80
    # between full (the input only) and none (every tensor the backward reads)
    assert (block_activation_bytes(TINY, 4, 1, recompute="full") < 448
            < block_activation_bytes(TINY, 4, 1, recompute="none"))


def test_llama_8b_keeps_less_than_half():
    """Llama 3.1 8B a token: 2 (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4 x 32 =
    63,616 bytes kept, against 139,264 without recomputation (8 h + 2 q + 4 kv + 2 q + 6 f)."""
    assert block_activation_bytes(LLAMA8B, 8192, 1, recompute="op") == 63616 * 8192
    assert block_activation_bytes(LLAMA8B, 8192, 1) == 139264 * 8192


def test_recompute_time_is_the_rerun_matmuls_and_elementwise_ops():
    """On the H100 preset at TP 1, mbs 1, s 8192: the backward re-runs wk (T x 1024 x 4096),
    wo (T x 4096 x 4096) and w3 (T x 14336 x 4096) and the element-wise ops (two norms read
    and written 2 x 4 T h, two residual adds 2 x 6 T h, rotary 4 T (q + kv), SwiGLU's 6 T f
    bytes); the attention is kept, so it is not re-run. I grows by exactly that, F and W do
    not, and the block keeps what memory.py counts."""
    hw = get_hardware("h100-sxm")
    r = Rates.of(hw)
    pc = ParallelCosts(LLAMA8B, 8192, r, Network.of(hw))
    T, h, f = 8192, 4096, 14336
    by_hand = (gemm_time(T, 1024, h, r, fp8=True) + gemm_time(T, h, 4096, r, fp8=True)
               + gemm_time(T, f, h, r, fp8=True)
               + memory_time((2 * 4 + 2 * 6) * T * h + 4 * T * (4096 + 1024) + 6 * T * f, r))
    none, op = pc.at(1, "none"), pc.at(1, "op")
    assert op.i[1] - none.i[1] == pytest.approx(by_hand, rel=1e-12)
    assert op.f[1] == none.f[1] and op.w[1] == none.w[1]
    assert op.act[1] == 63616 * T
    assert op.transient[1] == (139264 - 63616) * T  # rebuilt in the backward, one block
    # less recomputed than a full block forward, more than nothing
    assert 0 < op.i[1] - none.i[1] < pc.at(1, "full").i[1] - none.i[1]


def test_the_analytic_profile_carries_the_mode():
    """A hardware-priced analytic profile: recompute_time_op is the re-run matmuls' FLOPs
    2 T (h kv + q h + h f) at the profile's rate, and its bytes are memory.py's."""
    prof = shape_profile(LLAMA8B, 1024, 1, tflops=100.0, mfu=1.0)
    block = prof.layers[1].extra
    flops = 2 * 1024 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    assert block["recompute_time_op"] == pytest.approx(flops / 100e12, rel=1e-12)
    assert block["activation_bytes_op"] == block_activation_bytes(LLAMA8B, 1024, 1,
                                                                  recompute="op")
    lc = ProfileSet([prof]).at(1, "op")
    assert lc.act[1] == block["activation_bytes_op"]
