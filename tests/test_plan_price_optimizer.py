"""The optimizer step is reported with the plan: ``optimizer_time`` in its JSON (the rank
whose step is longest) and on the "best:" line. Checked against the closed form of
plan/optimizer.py: under DDP every rank updates all its local parameters, 30 bytes each
(2 g + 2 o + w at 2 : 2 : 12) through HBM; under ZeRO-1 its 1 / dp shard.
"""

import pytest

from pipebubble.commands.plan import why_best
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import search
from pipebubble.plan.plans import Request

SHAPE = TransformerShape(layers=8, hidden=2048, ffn=5632, heads=16, vocab=32000)


def _result(sharding: str):
    hw = get_hardware("a100-80gb")
    req = Request(gpus=8, gpu_memory=1e12, global_batch=16, microbatch_sizes=(1,),
                  schedules=("1f1b",), max_chunks=1, recompute=("none",), tp=(1,),
                  sp=(False,), cp=(1,), pp=(2,), shardings=(sharding,), top=1)
    return search(ProfileSet([shape_profile(SHAPE, 2048, 1)]), req, hw), hw


@pytest.mark.parametrize("sharding, share", [("ddp", 1.0), ("zero1", 1 / 4)])
def test_optimizer_time_is_the_closed_form(sharding, share):
    res, hw = _result(sharding)
    plan = res.plans[0]
    params = [m["weights"] / 2 for m in plan.memory]  # 2-byte weights, not sharded
    expect = max(params) * share * 30 / hw.hbm_bandwidth
    assert plan.optimizer_time == pytest.approx(expect, rel=1e-12)
    assert plan.as_json()["optimizer_time"] == plan.optimizer_time
    assert plan.step_time > plan.pipeline_time  # the step includes it


def test_best_line_names_it():
    res, _ = _result("ddp")
    line = why_best(res, {})[0]
    assert "optimizer step" in line
