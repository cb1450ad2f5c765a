"""The planner's rule for skipping ``auto`` (plan/auto_plans.py, ``AutoPlans.ruled_out``) and the
facts it rests on: the families it takes as split-only have no fused backward at any size
tried; an order auto returns with a fused backward (B) is a registered schedule's, unchanged;
and on small instances the rule never rules out a plan auto does give."""

import math

import pytest

from pipebubble import CostModel, auto_schedule
from pipebubble.ir.schedule import Overlap, step_actions
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, build_points
from pipebubble.plan.scoring import SearchCache, Searcher
from pipebubble.schedules import get_schedule
from pipebubble.schedules.registry import lookup, schedule_names

SPLIT_ONLY = [n for n in schedule_names() if lookup(n).split_only]  # the specs say


def _kinds(sched) -> set[str]:
    return {str(getattr(a.kind, "value", a.kind)) for o in sched.orders for st in o
            for a in step_actions(st)}


@pytest.mark.parametrize("name", SPLIT_ONLY)
def test_split_only_families_never_fuse_a_backward(name):
    """Every backward of these families is an I and a W (no B): the split-only bound holds
    for them, so the rule does not generate them to look."""
    seen = 0
    for pp in (2, 3, 4, 5, 8):
        for m in (pp, 2 * pp, 3 * pp + 1):
            try:
                s = get_schedule(name, pp, m)
            except Exception:
                continue
            seen += 1
            assert "B" not in _kinds(s) and {"I", "W"} <= _kinds(s), (name, pp, m)
    assert seen


def _registered_orders(p: int, m: int, chunks: int) -> list:
    out = []
    for name in schedule_names():
        spec = lookup(name)
        if spec.searched or spec.chunks != chunks:
            continue
        try:
            out.append(get_schedule(name, p, m).orders)
        except Exception:
            continue
    return out


@pytest.mark.parametrize("p,m,placement,limit", [
    (2, 4, "loop", None), (3, 6, "loop", 4.0), (4, 8, "loop", 3.0),
    (2, 4, "v", None), (3, 6, "v", 6.0), (4, 8, "v", None)])
def test_an_order_auto_returns_with_a_fused_backward_is_a_registered_one(p, m, placement,
                                                                          limit):
    """With I costing more than B - W (``i_extra``: a fused backward hides work), fused
    backwards are cheaper; still, every order of auto's own search splits them, so an order
    with a B (or an overlapped F&B) is one of the registered schedules, unchanged."""
    rng = [0.8, 1.2, 1.0, 0.9, 1.1, 1.3, 0.7, 1.0]
    n = p if placement == "loop" else 2 * p  # stages
    costs = CostModel(f=[rng[s % 8] for s in range(n)],
                      b=[2 * rng[(s + 3) % 8] for s in range(n)],
                      w=[0.8 * rng[(s + 3) % 8] for s in range(n)],
                      i_extra=[0.4 * rng[(s + 5) % 8] for s in range(n)], comm=0.05)
    for seconds in (0.0, 0.05):
        s = auto_schedule(p, m, costs, memory_limit=limit, placement=placement,
                          search_seconds=seconds)
        fused = "B" in _kinds(s) or any(isinstance(st, Overlap) for o in s.orders for st in o)
        if fused:
            chunks = 1 if placement == "loop" else 2
            assert s.orders in _registered_orders(p, m, chunks), (p, m, placement, seconds)


def _searchers(gpus: int, batch: int, budget: float):
    shape = TransformerShape(layers=4, hidden=512, ffn=2048, heads=8, vocab=4000, swiglu=False)
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=gpus, gpu_memory=budget, global_batch=batch, microbatch_sizes=(1,),
                  recompute=("none",), tp=(2,), cp=(1,), shardings=("ddp", "fsdp"),
                  max_chunks=2)
    shared = SearchCache()
    return [Searcher(costs, req, axes, shared)
            for _, costs, axes in build_points(prof, req, get_hardware("a100-80gb"))]


@pytest.mark.parametrize("gpus,batch,budget", [(4, 4, 1e15), (8, 8, 1e15), (8, 8, 2.5e8)])
def test_the_rule_never_rules_out_a_plan_auto_gives(gpus, batch, budget):
    """For every auto configuration: the plan auto gives (no threshold) is below any
    threshold above its step, and the rule agrees; the split-only bound is never looser
    than the price's own bound, and is tighter somewhere (the part of a backward that TP's
    collectives hide when it is fused)."""
    checked, tighter = 0, 0
    for s in _searchers(gpus, batch, budget):
        for c in s.configs():
            if c.schedule != "auto":
                continue
            lc = s.p.at(c.microbatch_size, c.recompute)
            pr = s.autos.cut(c, lc)
            if pr is None:
                continue
            split = s.pricing.price(c, s.facts.auto_shape(c), lc, pr.ranges, split=True,
                             split_only=True).bound
            assert split >= pr.bound
            tighter += split > pr.bound * (1 + 1e-9)
            plan = s.autos.evaluate(c, lc, math.inf, budget)
            if plan is None:
                continue
            checked += 1
            assert not s.autos.ruled_out(c, lc, pr, math.nextafter(plan.step_time, math.inf))
            if "B" not in _kinds(plan.schedule_obj):
                assert split <= plan.step_time * (1 + 1e-12), c
    assert checked and tighter


@pytest.mark.parametrize("gpus,batch,budget", [(4, 8, 1e15), (8, 8, 2.5e8), (4, 8, 1.6e8)])
def test_the_memory_floor_never_passes_over_a_plan_auto_gives(gpus, batch, budget):
    """The floors that skip auto under the memory left hold for what auto returns: a plan
    whose order splits every backward is no faster than the scheduler's own bound plus the
    least a rank adds after the pipeline, one with a fused backward no faster than the
    fused registered schedules that fit; and the memory kind binds somewhere (the floor
    above the price's bound), so the rule is tested where it prunes."""
    checked, binding = 0, 0
    for s in _searchers(gpus, batch, budget):
        for c in s.configs():
            if c.schedule != "auto":
                continue
            lc = s.p.at(c.microbatch_size, c.recompute)
            pr = s.autos.cut(c, lc)
            if pr is None or max(pr.static) > budget:
                continue
            left = [budget - x for x in pr.static]
            floor = s.autos.split_order_floor(c, pr, left)
            binding += floor > pr.bound * (1 + 1e-6)
            plan = s.autos.evaluate(c, lc, math.inf, budget)
            if plan is None:
                continue
            checked += 1
            if "B" in _kinds(plan.schedule_obj):
                assert s.autos.fused_floor(c, pr, left) <= plan.step_time * (1 + 1e-12), c
            else:
                assert floor <= plan.step_time, c
    assert checked and binding
