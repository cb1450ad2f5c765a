"""Llama 3 405B on 8,192 H100s (TP 8 with SP, PP 16, DP 64, ZeRO-2 as the paper's FSDP
keeps it, 8K sequences, microbatch 1, 32 microbatches per pipeline, interleaved v = 8 at the
paper's layout of one unit a chunk): every term of the planner's per-rank memory checked
against numbers worked out by hand (``bench/bench_published.py --memory`` prints them).

By hand, s = 8192, h = 16384, f = 53248, a = 128 heads of d = 128, k = 8 K/V heads, t = 8:

- one block's activations, bytes per token (Korthikanti et al. 2022 Table 2, counted for
  LLaMA: no dropout, so no masks; GQA; SwiGLU): the two norms' inputs and outputs (the
  outputs are the QKV and MLP inputs) ``8 h / t`` (split by SP), Q ``2 a d / t``, K and V
  ``4 k d / t``, the attention output ``2 a d / t`` (FlashAttention: no scores), SwiGLU's
  gate, up and product ``6 f / t``: 16384 + 4096 + 512 + 4096 + 39936 =
  65,024 bytes, 532,676,608 per 8K microbatch (508 MiB);
- a block's local parameters: ``(2 h a d + 2 h k d + 3 h f) / t + 2 h`` = 398,491,648;
- in flight at the peak: Megatron-LM's warm-up ``2 (p - r - 1) + (v - 1) p`` plus the
  first steady forward: 141 one-block chunks on rank 1; on rank 0, 143 chunks of which the
  31 of chunk 0 are the embedding alone (token ids, 8 bytes a token); on rank 15, 113 of
  which one is the head (its input ``4 s h / t`` with SP, and fp32 logits ``4 s V / t``).
"""

import pytest

from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.published import (
    LLAMA3_405B,
    interleaved_in_flight,
    memory_breakdown,
    published_runs,
)

BLOCK_ACT = 65_024 * 8192
BLOCK_PARAMS = 398_491_648
EMB_PARAMS = 128256 * 16384 // 8
HEAD_ACT = 4 * 8192 * 16384 // 8 + 4 * 8192 * 128256 // 8


@pytest.fixture(scope="module")
def ranks():
    run = next(r for r in published_runs() if r.name == "405B 8K 8k")
    plan, rows = memory_breakdown(run, 0.551, ",sp=1,mbs=1,schedule=interleaved-1f1b,v=8")
    assert (plan.pp, plan.chunks, plan.microbatches, plan.tp, plan.dp) == (16, 8, 32, 8, 64)
    return rows


def test_block_terms_by_hand(ranks):
    assert ranks[1]["block_activation"] == BLOCK_ACT
    assert BLOCK_ACT == 532_676_608
    assert LLAMA3_405B.block_matmul_params() / 8 + 2 * 16384 == BLOCK_PARAMS


def test_model_states_by_hand(ranks):
    for r in (1, 7, 14):
        P = 8 * BLOCK_PARAMS
        assert ranks[r]["blocks"] == 8
        assert ranks[r]["weights"] == pytest.approx(2 * P, rel=1e-12)  # kept gathered
        assert ranks[r]["gradients"] == pytest.approx(2 * P / 64, rel=1e-12)
        assert ranks[r]["optimizer"] == pytest.approx(12 * P / 64, rel=1e-12)
    P0 = 7 * BLOCK_PARAMS + EMB_PARAMS  # one block fewer, and the embedding (not tied)
    assert ranks[0]["weights"] == pytest.approx(2 * P0, rel=1e-12)


def test_activations_by_hand(ranks):
    for r in range(1, 15):
        n = interleaved_in_flight(16, 8, 32, r)
        assert n == 2 * (16 - r - 1) + 7 * 16 + 1
        assert ranks[r]["activations"] == pytest.approx(n * BLOCK_ACT, rel=1e-12)
    assert ranks[1]["activations"] == pytest.approx(141 * BLOCK_ACT, rel=1e-12)
    assert ranks[0]["activations"] == pytest.approx(112 * BLOCK_ACT + 31 * 8 * 8192,
                                                    rel=1e-12)
    assert ranks[15]["activations"] == pytest.approx(112 * BLOCK_ACT + HEAD_ACT, rel=1e-12)


def test_the_peak_rank_is_over_the_budget_and_under_the_gpu(ranks):
    gpu = get_hardware("h100-sxm").memory
    peak = max(ranks, key=lambda x: x["peak"])
    assert peak["rank"] == 1
    assert peak["budget"] == pytest.approx(0.95 * gpu)  # the planner's default reserve
    assert peak["physical"] == gpu  # what the published configuration is priced against
    assert 0.95 * gpu < peak["peak"] < gpu
    # what the rank holds beyond the budget is less than a quarter of the 5 % reserve
    assert peak["peak"] - 0.95 * gpu < 0.25 * 0.05 * gpu
