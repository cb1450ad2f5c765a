"""The loss's logits beyond what the head keeps (``Hardware.loss_bytes``, set by the
framework profile, plan/frameworks.py): torchtitan's eager fp32 cross-entropy holds two more
fp32 ``[T, V]`` tensors in its backward (8 bytes a logit), Megatron-LM's in-place
vocabulary-parallel one only the 16-bit logits or gradient beside its fp32 copy (2). Priced
as the head's transient; checked by hand."""

from __future__ import annotations

from dataclasses import replace

from pipebubble.plan import frameworks as F
from pipebubble.plan.analytic import TransformerShape
from pipebubble.plan.compute import Rates
from pipebubble.plan.config import parse_config, restrict
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.memory import block_activation_bytes
from pipebubble.plan.network import Network
from pipebubble.plan.parallel_costs import ParallelCosts
from pipebubble.plan.planner import search
from pipebubble.plan.plans import Request
from pipebubble.plan.published import _setup, published_runs

TINY = TransformerShape(layers=2, hidden=8, ffn=16, heads=2, vocab=10, kv_heads=1)


def test_the_profiles_loss_bytes():
    hw, req = get_hardware("h100-sxm"), Request(gpus=8, gpu_memory=1e10, global_batch=8)
    got = {n: F.apply(F.settings(n), req, hw)[1].loss_bytes
           for n in ("megatron", "torchtitan", "deepspeed", "nemo", "none")}
    assert got == {"megatron": 2.0, "torchtitan": 8.0, "deepspeed": 2.0, "nemo": 2.0,
                   "none": 0.0}


def test_the_heads_transient_by_hand():
    """Sequence 4, microbatch 3 (T = 12 tokens), vocabulary 10 split over TP 2: 60 logits a
    rank; at 8 bytes each, 480 bytes; the blocks' transients are not touched."""
    hw = replace(get_hardware("h100-sxm"), loss_bytes=8.0)
    base = ParallelCosts(TINY, 4, Rates.of(hw, 0.5), Network.of(hw), tp=2, sp=True)
    lc = base.at(3, "full")
    assert lc.transient[-1] == 8.0 * 12 * 10 / 2 == 480.0
    none = ParallelCosts(TINY, 4, Rates.of(get_hardware("h100-sxm"), 0.5),
                         Network.of(hw), tp=2, sp=True).at(3, "full")
    assert none.transient[-1] == 0.0
    assert list(lc.transient[:-1]) == list(none.transient[:-1]) and list(lc.act) == list(
        none.act)


def test_torchtitan_8b_peak_grows_by_the_loss_less_a_blocks_recompute():
    """torchtitan's 8-GPU Llama 3.1 8B row (FSDP, microbatch 2 of 8,192 tokens, op-level
    SAC): one stage, so its transient is the largest of any layer's: before, a block's
    re-run tensors (what ``none`` keeps less what ``op`` keeps); now the loss's 8 bytes a
    logit, T V = 16,384 x 128,256. The peak grows by the difference, 14.5 GiB."""
    run = next(r for r in published_runs() if r.name == "8B FSDP 8")
    prof, req, hw = _setup(run, 0.391, framework="torchtitan")
    assert hw.loss_bytes == 8.0
    one = replace(restrict(req, parse_config(run.config, run.gpus)), top=1)
    with_loss = search(prof, one, hw, 0.391).plans[0]
    without = search(prof, one, replace(hw, loss_bytes=0.0), 0.391).plans[0]
    T, V = 2 * 8192, 128256
    block = (block_activation_bytes(run.shape, 8192, 2, recompute="none")
             - block_activation_bytes(run.shape, 8192, 2, recompute="op"))
    assert 8 * T * V > block
    grow = max(with_loss.peak_memory) - max(without.peak_memory)
    assert abs(grow - (8 * T * V - block)) < 1e-6 * grow
    assert round(grow / 2**30, 1) == 14.5
