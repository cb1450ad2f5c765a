"""A side answer of the planner's search (plan/visits.py ``Side``): the fastest plan a
framework runs, found on the way, is the plan a search of its own finds (the narrowed
request, ``keep`` on), in one process and over worker processes, and the side never
changes the search's own plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipebubble.plan import search_pool
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, search
from pipebubble.plan.settings import MEGATRON_SHARDINGS, megatron_blocker, megatron_side
from pipebubble.plan.visits import plan_order

PROFILE = dict(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000, seq=1024, batch=1,
               tflops=100, mfu=0.5)
CASES = {
    # a tight budget: the V families and auto lead, Megatron-LM runs none of the top plans
    "tight": dict(gpus=8, gpu_memory=6 * 2**30, global_batch=16, microbatch_sizes=(1, 2),
                  recompute=("none", "full"), top=3, pp=(2, 4)),
    # roomy, auto in: ZeRO-2 and FSDP pipelines lead, which Megatron-LM does not pipeline
    "roomy": dict(gpus=8, gpu_memory=40 * 2**30, global_batch=32, microbatch_sizes=(1,),
                  recompute=("none",), top=2, pp=(2, 4, 8)),
}


def _own_search(prof, req, hw):
    """Megatron-LM's fastest plan by a search of its own: its shardings, its families."""
    from pipebubble.plan.settings import megatron_families

    narrowed = replace(req, top=1, shardings=tuple(s.value for s in MEGATRON_SHARDINGS),
                       schedules=tuple(megatron_families()))
    return search(prof, narrowed, hw, keep=lambda p: megatron_blocker(p) is None).plans[0]


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_side_is_the_narrowed_search_and_changes_nothing(case, jobs, monkeypatch):
    monkeypatch.setattr(search_pool, "PARALLEL_AT", 0)  # small: fork anyway
    prof = ProfileSet([analytic_profile(**PROFILE)])
    hw = get_hardware("a100-80gb")
    req = Request(**CASES[case], jobs=jobs)
    plain = search(prof, req, hw)
    got = search(prof, req, hw, sides=(megatron_side(),))
    assert [p.as_json() for p in got.plans] == [p.as_json() for p in plain.plans]
    side = got.sides["megatron"]
    own = _own_search(prof, replace(req, jobs=1), hw)
    assert side is not None and megatron_blocker(side) is None
    assert plan_order(side) == plan_order(own) and side.as_json() == own.as_json()
    if case == "tight":  # it is not among the plans found: the side found it on its own
        assert all(megatron_blocker(p) is not None for p in got.plans)
