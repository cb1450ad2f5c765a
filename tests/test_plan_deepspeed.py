"""DeepSpeed's pipeline engine as priced for the published runs (plan/deepspeed.py) and the
FLOP counts the DeepSpeed-era sources used (plan/published.py), on cases small enough to
check by hand."""

from dataclasses import replace
from types import SimpleNamespace as NS

import pytest

from pipebubble.costs import CostModel
from pipebubble.plan.analytic import TransformerShape
from pipebubble.plan.deepspeed import deepspeed_step, partition_gathers
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.published import neox_flops, published_runs
from pipebubble.schedules import get_schedule

# A link of 100 GB/s inside the node, no latency: an all-gather of A bytes over t ranks
# takes (t - 1) / t x A / 100 GB/s.
HW = replace(get_hardware("a100-80gb"), nvlink_bandwidth=100e9, nvlink_latency=0.0,
             inter_node_bandwidth=100e9, inter_node_latency=0.0, bus_fraction=1.0)


def _plan(p: int, m: int, tp: int):
    """Just what deepspeed_step reads: 1F1B on p ranks, F = 1 s, B = 2 s, no P2P time,
    one replica (no data-parallel traffic), no optimizer time."""
    dims = NS(data_context=1, stage_distance=lambda s: tp * s)
    return NS(config=NS(dims=dims, tp=tp), tp=tp, pp=p, stage_to_rank=tuple(range(p)),
              schedule_obj=get_schedule("1f1b", ranks=p, microbatches=m),
              costs=CostModel(f=[1.0] * p, b=[2.0] * p, comm=0.0), optimizer_time=0.0)


def test_partition_gathers_by_hand():
    # TP 4, a 1 GB activation: each gather 3/4 GB at 100 GB/s = 7.5 ms; F gathers its input
    # on every stage but the first, B its output and the gradient on every stage but the
    # last.
    f, b = partition_gathers(_plan(3, 1, 4), HW, 1e9)
    assert f == pytest.approx([0.0, 0.0075, 0.0075])
    assert b == pytest.approx([0.015, 0.015, 0.0])
    assert partition_gathers(_plan(3, 1, 1), HW, 1e9) == ([0.0] * 3, [0.0] * 3)


def test_deepspeed_step_adds_the_gathers_on_the_critical_path():
    # p = 2, one microbatch: F0 (1) -> F1 (1 + g) -> B1 (2) -> B0 (2 + 2g): 6 + 3g, with
    # g = 1/2 x 1 GB / 100 GB/s = 5 ms at TP 2.
    plan = _plan(2, 1, 2)
    assert deepspeed_step(plan, HW) == pytest.approx(6.0)
    assert deepspeed_step(plan, HW, activation_bytes=1e9) == pytest.approx(6.0 + 3 * 0.005)
    # TP 1: nothing is split, nothing gathered.
    assert deepspeed_step(_plan(2, 1, 1), HW, activation_bytes=1e9) == pytest.approx(6.0)


def test_neox_flops_is_gpt_neox_get_flops_of_2022():
    # B s (6 N + 60 s h L): 1 x 4 x (6 x 100 + 60 x 4 x 8 x 2) = 17,760.
    sh = TransformerShape(layers=2, hidden=8, ffn=32, heads=2, vocab=16)
    assert neox_flops(sh, seq=4, batch=1, params=100) == 17760
    # GPT-NeoX-20B at 117 TFLOP/s on 96 GPUs: 1536 x 2048 tokens x (6 x 20,556,201,984 +
    # 60 x 2048 x 6144 x 44) = 4.925e17 FLOPs, 43.85 s; eq. 3 with its recomputation factor
    # (what this row used before) would be 47.66 s.
    neox = next(r for r in published_runs() if r.name == "20B")
    per_token = 6 * 20_556_201_984 + 60 * 2048 * 6144 * 44
    assert neox.step == pytest.approx(1536 * 2048 * per_token / (96 * 117e12))
    assert neox.step == pytest.approx(43.85, abs=0.01)
    eq3 = 96 * 1536 * 2048 * 44 * 6144**2 * (1 + 2048 / (6 * 6144) + 50432 / (16 * 44 * 6144))
    assert eq3 / (96 * 117e12) == pytest.approx(47.66, abs=0.01)


def test_deepspeed_runs_carry_their_precisions_costs():
    """fp16 runs (MT-NLG, GPT-NeoX-20B): autograd adds each microbatch's gradient into the
    fp16 .grad (6 bytes a parameter) and the reduction moves 2-byte gradients; BLOOM's BF16
    optimizer: 18 bytes into fp32, 4-byte gradients on the wire."""
    runs = {r.name: r for r in published_runs()}
    for name in ("530B 2240", "530B 2800", "530B 3360", "20B"):
        r = runs[name]
        assert (r.framework, r.grad_wire, dict(r.hardware)["grad_accumulation_bytes"]) == (
            "deepspeed", 2.0, 6.0)
    bloom = runs["176B"]
    assert (bloom.framework, bloom.grad_wire,
            dict(bloom.hardware)["grad_accumulation_bytes"]) == ("deepspeed", 4.0, 18.0)
    assert {r.framework for r in runs.values()} == {"megatron", "deepspeed", "torchtitan"}
