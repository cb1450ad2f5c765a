"""The backward's TP collectives hide behind the weight-gradient GEMMs only when W runs in
the same pass (plan/tensor.py): a fused B hides them, an I whose W is deferred (the
zero-bubble family, DualPipe's split actions) carries them whole.

Checked by hand on one block, on the cost model the simulator reads, and on whole plans:
with every backward split (ZB-H1), ``tp_overlap`` can change nothing, since no I has its W
beside it; with every backward fused (1F1B), it must make the step shorter.
"""

from dataclasses import replace

import pytest

from pipebubble.costs import CostModel
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.compute import Rates
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.network import Network
from pipebubble.plan.parallel_costs import ParallelCosts
from pipebubble.plan.planner import search
from pipebubble.plan.plans import Request
from pipebubble.plan.tensor import tp_collective
from pipebubble.schedules.registry import get_schedule

SHAPE = TransformerShape(layers=8, hidden=4096, ffn=14336, heads=32, vocab=32000, kv_heads=8)
SEQ = 4096


def _costs(overlap: bool) -> ParallelCosts:
    hw = replace(get_hardware("h100-sxm"), tp_overlap=overlap)
    return ParallelCosts(SHAPE, SEQ, Rates.of(hw), Network.of(hw), tp=8, sp=True)


def test_hidden_is_what_the_fused_backward_hides():
    on, off = _costs(True).at(1), _costs(False).at(1)
    hw = get_hardware("h100-sxm")
    one = tp_collective(SEQ, SHAPE.hidden, 8, Network.of(hw), sp=True)
    assert one > 0
    # B with the overlap = B without it, less what the W GEMMs hide; I alone gets it back.
    assert on.hidden[1] > 0
    assert on.i[1] + on.hidden[1] == pytest.approx(off.i[1], rel=1e-12)
    assert on.hidden[1] <= 2 * one * (1 + 1e-12)  # at most both collectives
    assert on.w[1] == off.w[1] and on.f[1] == off.f[1]
    assert off.hidden[1] == 0.0  # nothing hidden, nothing to give back
    assert on.hidden[0] == on.hidden[-1] == 0.0  # embedding and head hide nothing


def test_cost_model_prices_i_alone_and_b_fused():
    sched = get_schedule("dualpipe", 4, 8)  # mixes B with split I / W
    sc = CostModel(f=1.0, b=2.0, w=0.8, i_extra=0.3).resolve(sched.num_stages)
    assert sc.duration(0, "B") == 2.0
    assert sc.duration(0, "I") == pytest.approx(2.0 - 0.8 + 0.3)
    assert sc.duration(0, "W") == 0.8
    assert CostModel(f=1.0, b=2.0, w=0.8).resolve(2).duration(1, "I") == pytest.approx(1.2)


def _step(schedule: str, overlap: bool) -> float:
    hw = replace(get_hardware("h100-sxm"), tp_overlap=overlap)
    prof = ProfileSet([shape_profile(SHAPE, SEQ, 1)])
    req = Request(gpus=32, gpu_memory=1e12, global_batch=16, microbatch_sizes=(1,),
                  schedules=(schedule,), max_chunks=1, recompute=("none",), tp=(8,),
                  sp=(True,), cp=(1,), pp=(4,), shardings=("ddp",), top=1)
    return search(prof, req, hw).plans[0].step_time


def test_deferred_w_gets_nothing_from_the_overlap_fused_does():
    assert _step("zb-h1", True) == pytest.approx(_step("zb-h1", False), rel=1e-12)
    fused_on, fused_off = _step("1f1b", True), _step("1f1b", False)
    assert fused_on < fused_off * (1 - 1e-3)
