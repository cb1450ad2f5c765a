"""The parts of the planner's Searcher, each built alone from its explicit inputs on toy
layers whose numbers can be checked by hand (plan/scoring.py's module doc lists the parts)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipebubble.errors import UserError
from pipebubble.plan.auto_plans import AutoPlans
from pipebubble.plan.axes import Point
from pipebubble.plan.configs import Configs
from pipebubble.plan.cut_price import Pricing
from pipebubble.plan.cut_score import CutScorer
from pipebubble.plan.cuts import Cuts
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.memory_bounds import MemoryBounds
from pipebubble.plan.plans import Config, Request
from pipebubble.plan.profile import Profile
from pipebubble.plan.schedule_facts import ScheduleFacts
from pipebubble.plan.scoring import Searcher, legacy_axes
from pipebubble.plan.search_cache import PointCache, SearchCache


def toy(layers) -> ProfileSet:
    """layers: (forward, backward, params, activation bytes) per layer."""
    return ProfileSet([Profile.from_dict({"batch": 1, "layers": [
        {"name": f"l{i}", "forward": f, "backward": b, "params": n, "activation_bytes": a,
         "flops": 0} for i, (f, b, n, a) in enumerate(layers)]})])


def request(gpus: int, batch: int) -> Request:
    return Request(gpus=gpus, gpu_memory=1e12, global_batch=batch, microbatch_sizes=(1,),
                   schedules=("1f1b",), recompute=("none",), latency=0)


def config(pp: int, m: int, schedule: str = "1f1b") -> Config:
    return Config(ParallelDims(pp=pp), 1, m, schedule, 1, "none", 0.0)


def test_cuts_alone_cut_at_the_heaviest_layer_and_bound_the_slowest_stage():
    # per layer F + B = 3, 3, 3, 9: into 2 stages the min-max cut is (0..2)(3), both 9
    prof = toy([(1, 2, 0, 0)] * 3 + [(3, 6, 0, 0)])
    cuts = Cuts(prof, legacy_axes(request(2, 4), Point()))
    c = config(2, 4)
    lc = prof.at(1, "none")
    assert cuts.cut_costs(lc, c, 4).tolist() == [12, 12, 12, 36]  # m x (F + I + W)
    assert cuts.time_cuts(lc, c, 2, 4, (0, 1)) == [[(0, 2), (3, 3)]]
    # no cut of m = 4 microbatches beats 4 x the slowest stage, 9 s
    assert math.isclose(cuts.stage_bound(c, lc), 36, rel_tol=1e-8) and cuts.stage_bound(c) < 36


def test_cuts_of_one_profile_set_are_shared_through_the_search_cache():
    prof = toy([(1, 2, 0, 0)] * 4)
    shared = SearchCache()
    axes = legacy_axes(request(2, 4), Point())
    first, second = Cuts(prof, axes, shared), Cuts(prof, axes, shared)
    lc = prof.at(1, "none")
    got = first.time_cuts(lc, config(2, 4), 2, 4, (0, 1))
    assert second.time_cuts(lc, config(2, 4), 2, 4, (0, 1)) is got  # cut once, not twice
    assert Cuts(prof, axes).time_cuts(lc, config(2, 4), 2, 4, (0, 1)) is not got


def test_capped_cut_exists_exactly_when_the_stages_can_hold_every_layer():
    # 1F1B, pp = 2, m = 4: stage 0 holds 2 microbatches, stage 1 one; 10 bytes per layer
    # and microbatch, no weights: a layer weighs 20 in stage 0 and 10 in stage 1.
    prof = toy([(1, 2, 0, 10)] * 4)
    facts = ScheduleFacts()
    c = config(2, 4)
    sched = facts.schedule(c)
    held = facts.held(sched)
    assert held == [2, 1]
    cuts = Cuts(prof, legacy_axes(request(2, 4), Point()))
    lc = prof.at(1, "none")
    assert cuts.memory_rows(lc, c, sched, held) == [[20.0] * 4, [10.0] * 4]
    # budget 30: stage 0 takes one layer (20), stage 1 the other three (30)
    assert cuts.capped_possible(lc, c, sched, held, 30)
    assert cuts.capped_cut(lc, c, sched, held, 30) == [(0, 0), (1, 3)]
    # budget 25: stage 0 one layer, stage 1 two (a third makes 30): 3 of the 4 layers
    assert not cuts.capped_possible(lc, c, sched, held, 25)
    assert cuts.capped_cut(lc, c, sched, held, 25) is None


def test_pricing_alone_bounds_one_cut_by_hand_and_the_simulation_meets_it():
    # Stage 0: F 1, B 2; stage 1: F 2, B 4; 1F1B on 2 ranks, m = 3, no traffic, no weights.
    # Rank 1 starts after stage 0's first forward (1) and works 3 x 6 = 18; its last
    # backward's gradient still crosses stage 0's B (2): bound 1 + 18 + 2 = 21. Rank 0:
    # 3 x 3 = 9. By hand the 1F1B timeline ends at 21 too (rank 0's last B: 19 .. 21).
    prof = toy([(1, 2, 0, 0), (2, 4, 0, 0)])
    req = request(2, 3)
    axes = legacy_axes(req, Point())
    c = config(2, 3)
    facts = ScheduleFacts()
    sched = facts.schedule(c)
    lc = prof.at(1, "none")
    pricing = Pricing(axes, facts=facts)
    costs, params, _ = pricing.stage_costs(c, sched, lc, [(0, 0), (1, 1)])
    assert (costs.f, costs.b, costs.comm) == ([1.0, 2.0], [2.0, 4.0], 0.0)
    pr = pricing.price(c, sched, lc, [(0, 0), (1, 1)])
    assert pr.bound == 21
    scorer = CutScorer(prof, req, axes, pricing, MemoryBounds(prof, axes, facts=facts))
    plan = scorer.simulate(c, sched, pr, math.inf, math.inf)
    assert plan.step_time == 21 and scorer.simulated == 1
    assert scorer.simulate(c, sched, pr, math.inf, 21) is None  # must beat the threshold


def test_two_points_share_their_pipeline_runs_through_the_search_cache():
    prof = toy([(1, 2, 0, 0), (2, 4, 0, 0)])
    req = request(2, 3)
    axes = legacy_axes(req, Point())
    shared = SearchCache()
    facts = ScheduleFacts(shared)
    c = config(2, 3)
    sched, lc = facts.schedule(c), prof.at(1, "none")
    scorers = []
    for _ in range(2):  # two points: each its own PointCache, one SearchCache
        here = PointCache()
        pricing = Pricing(axes, shared, here, facts)
        scorer = CutScorer(prof, req, axes, pricing,
                           MemoryBounds(prof, axes, shared, here, facts), shared)
        scorer.score(c, sched, lc, [(0, 0), (1, 1)], math.inf, math.inf)
        scorers.append(scorer)
    assert [s.simulated for s in scorers] == [1, 0]  # the second point reuses the run
    assert ScheduleFacts(shared).schedule(c) is sched  # generated once per search


def test_memory_bounds_alone_fit_exactly_at_the_orders_peak():
    # 1F1B, pp = 2, m = 3, one layer per stage of 10 activation bytes: rank 0 holds 2
    # microbatches at its peak (20 bytes), rank 1 one (10). No weights.
    prof = toy([(1, 2, 0, 10), (1, 2, 0, 10)])
    axes = legacy_axes(request(2, 3), Point())
    facts = ScheduleFacts()
    c = config(2, 3)
    sched, lc = facts.schedule(c), prof.at(1, "none")
    pr = Pricing(axes, facts=facts).price(c, sched, lc, [(0, 0), (1, 1)])
    memory = MemoryBounds(prof, axes, facts=facts)
    assert memory.fits(pr, sched, 20) and not memory.fits(pr, sched, 19)
    assert memory.fits_surely(pr, sched, lc, 20) and not memory.fits_surely(pr, sched, lc, 19)
    # no cut holds less than the least held count x the model's activations / pp: 1 x 20 / 2
    assert memory.memory_bound(c, sched) == 10 == memory.memory_floor(c)
    assert memory.weight_bound(c) == 0  # no parameters


def test_memory_bounds_count_the_weights_spread_over_the_ranks():
    prof = toy([(1, 2, 100, 0)] * 4)
    axes = legacy_axes(request(2, 4), Point())
    bpp = axes.bytes_per_param(1, 2)
    assert bpp > 0
    memory = MemoryBounds(prof, axes)
    assert memory.weight_bound(config(2, 4)) == bpp * 400 / 2
    # DualPipe holds two copies of the model
    assert memory.weight_bound(config(2, 4, "dualpipe")) == 2 * bpp * 400 / 2


def test_configs_alone_list_every_split_with_a_bound_below_the_step():
    # 4 equal layers (F 1, B 2), 4 GPUs, batch 8: pp 1, 2, 4 with m = 2, 4, 8
    prof = toy([(1, 2, 0, 0)] * 4)
    req = request(4, 8)
    got = Configs(prof, req, legacy_axes(req, Point())).configs()
    by_pp = {c.pp: c for c in got}
    assert {pp: (c.dp, c.microbatches) for pp, c in by_pp.items()} == {
        1: (4, 2), 2: (2, 4), 4: (1, 8)}
    # pp = 4: the mean rank works 8 x 12 / 4 = 24 after a mean head of (0+1+2+3) / 4; the
    # 1F1B step of 4 equal stages is (8 + 4 - 1) x 3 = 33 (test_plan.py)
    assert by_pp[4].bound == 24 + 1.5


def test_the_searcher_composes_its_parts_over_one_cache():
    prof = toy([(1, 2, 0, 0)] * 4)
    shared = SearchCache()
    s = Searcher(prof, request(2, 4), shared=shared)
    assert s.cache is shared and s.facts.cache is shared
    assert s.pricing.facts is s.facts is s.memory.facts is s.autos.facts is s.least.facts
    assert s.scorer.pricing is s.pricing and s.autos.scorer is s.scorer
    other = Searcher(prof, request(2, 4), shared=shared)
    c = next(c for c in s.configs() if c.pp == 2)
    assert other.schedule(c) is s.schedule(c)
    assert other.point_cache is not s.point_cache


def test_configs_settle_the_recomputation_modes_of_the_profile():
    prof = toy([(1, 2, 0, 0)] * 2)  # measured without recomputation fields: none only
    req = replace(request(2, 4), recompute=None)
    assert Configs(prof, req, legacy_axes(req, Point())).req.recompute == ("none",)
    bad = replace(req, recompute=("sometimes",))
    with pytest.raises(UserError, match="unknown recompute 'sometimes'; valid are none"):
        Configs(prof, bad, legacy_axes(bad, Point()))


def test_least_memory_names_the_orders_peak_when_nothing_fits():
    # pp = 2 only (batch 3 does not split over dp = 2), 1F1B, m = 3, one layer of 10
    # activation bytes per stage: rank 0 holds 2 microbatches at its peak, so 20 bytes
    prof = toy([(1, 2, 0, 10), (1, 2, 0, 10)])
    s = Searcher(prof, replace(request(2, 3), gpu_memory=5))
    c = next(iter(s.configs()))
    assert (c.pp, c.microbatches) == (2, 3)
    assert s.evaluate(c, math.inf, 5) is None
    assert s.least.least_plan(c).needs == 20 == s.no_fit([c]).smallest


def test_auto_plans_alone_search_the_min_max_cut_under_the_memory_left():
    # Two layers of F 1, B 2 (I 1 + W 1), 10 activation bytes each, no weights; auto on
    # pp = 2 (loop placement), m = 3. Its cut is one layer per stage.
    prof = toy([(1, 2, 0, 10), (1, 2, 0, 10)])
    req = replace(request(2, 3), schedules=("auto",))
    axes = legacy_axes(req, Point())
    facts, here = ScheduleFacts(), PointCache()
    pricing = Pricing(axes, None, here, facts)
    memory = MemoryBounds(prof, axes, None, here, facts)
    autos = AutoPlans(prof, axes, here, facts, Cuts(prof, axes), pricing,
                      CutScorer(prof, req, axes, pricing, memory))
    c, lc = Config(ParallelDims(pp=2), 1, 3, "auto", 1, "none", 0.0), prof.at(1, "none")
    pr = autos.cut(c, lc)
    assert pr.ranges == [(0, 0), (1, 1)] and autos.cut(c, lc) is pr  # priced once
    assert pr.static == [0.0, 0.0]
    # V placement (chunks 2) needs 4 stages of 2 layers: no cut, no bound
    assert autos.cut(replace(c, chunks=2), lc) is None
    assert autos.bound(replace(c, chunks=2)) == math.inf
    # Plenty of memory: rank 1 starts after one forward (1) and works 3 x (1 + 1 + 1) = 9,
    # so no order beats 10, and ZB-H1's order reaches it (3m + p - 1).
    assert autos.evaluate(c, lc, math.inf, 1e12).step_time == 10
    assert autos.evaluate(c, lc, math.inf, 20).step_time == 10  # two in flight suffice
    # 10 bytes: a rank holds one microbatch from its F to its W (its I leaves the W's 10),
    # so the microbatches go one after another, F0 F1 I1 I0 W0 = 5 each: 3 x 5 = 15.
    plan = autos.evaluate(c, lc, math.inf, 10)
    assert plan.step_time == 15 and max(plan.peak_memory) == 10
    assert plan.cut_search == "min-max"
    assert autos.evaluate(c, lc, 15, 10) is None  # it must beat the threshold
    # below one microbatch per stage no order exists: the least budget is 10
    assert autos.least_budget(c) == 10 and autos.evaluate(c, lc, math.inf, 9.99) is None
    assert autos.plan_at(c, 10).budget == 10
    # the fused registered schedules on the cut: 1F1B's (m + p - 1)(F + B) = 12 is the best
    assert {s.name for s in autos._fused_registered(c)} == {"1f1b", "gpipe"}
    assert autos.fused_floor(c, pr, [1e12, 1e12]) == 12
    assert not autos.ruled_out(c, lc, pr, 11) and autos.ruled_out(c, lc, pr, 10)
    # with one microbatch in flight the split orders' floor is the memory kind's area: each
    # microbatch holds rank 0's 10 bytes from its F0 to its W0 (F0 F1 I1 I0 W0, 5 at
    # least), one at a time: 3 x 5 = 15, the plan above (the round trips alone: F0's
    # microbatches 4 apart, the last one's path 5, 2 x 4 + 5 = 13)
    assert math.isclose(autos.split_order_floor(c, pr, [10, 10]), 15, rel_tol=1e-8)
