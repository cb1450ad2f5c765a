"""The bounds the planner prunes with at scale: true for every cut and order (checked by
simulating every cut of small instances, optimizer step and tied copies priced), the facts
about families they assume, and cut (b) counting a tied embedding's copy."""

import math
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.costs import fits_limit
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.configs import chains_of
from pipebubble.plan.families import chunk_options, placement_of
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.partition import min_max_partition, ranges_from_ends
from pipebubble.plan.planner import Request, build_points, schedule_list
from pipebubble.plan.scoring import SearchCache, Searcher
from pipebubble.schedules import get_schedule, lookup
from pipebubble.sim.program import schedule_peaks

FAMILIES = tuple(n for n in schedule_list(None) if n != "auto")


@pytest.mark.parametrize("name", FAMILIES)
def test_placement_and_chains_known_before_generating_match_the_family(name):
    """configs.chains_of and families.placement_of say, without generating, what every
    generated schedule of the family has (the bounds rely on it)."""
    seen = 0
    for pp in (2, 3, 4):
        for m in (pp, 2 * pp, 3 * pp + 1):
            for v in chunk_options(name, 3):
                try:
                    s = get_schedule(name, pp, m, v)
                except Exception:
                    continue
                seen += 1
                assert s.chains == chains_of(name)
                if placement_of(name) is not None:
                    assert s.num_microbatches == m
                assert set(s.stage_to_rank) == set(range(pp))  # every rank holds a stage
                kind = placement_of(name)
                if kind == "loop":
                    assert s.stage_to_rank == tuple(x % pp for x in range(pp * v))
                elif kind == "v":
                    assert s.stage_to_rank == (*range(pp), *reversed(range(pp)))
    assert seen


def _searchers(shape, gpus, batch, sharding, budget=1e15):
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=gpus, gpu_memory=budget, global_batch=batch, microbatch_sizes=(1,),
                  recompute=("none",), tp=(1,), cp=(1,), shardings=(sharding,), max_chunks=2,
                  exhaustive_cuts=10**6)
    shared = SearchCache()
    return prof, req, [Searcher(costs, req, axes, shared)
                       for _, costs, axes in build_points(prof, req, get_hardware("a100-80gb"))]


@settings(max_examples=6, deadline=None)
@given(hidden=st.sampled_from([256, 512]), tied=st.booleans(), gpus=st.sampled_from([2, 4]),
       batch=st.sampled_from([4, 8]), sharding=st.sampled_from(["ddp", "zero1", "fsdp"]))
def test_bounds_never_exceed_the_scored_step(hidden, tied, gpus, batch, sharding):
    """On a GPU preset (optimizer step priced, hops, tied copies): the configuration's bound,
    each cut's bound, that cut's bound on the placement alone (W taken as split) and the
    min-max cut's slowest stage are at most the step the planner scores for that cut, for
    every configuration and every cut."""
    shape = TransformerShape(layers=3, hidden=hidden, ffn=4 * hidden, heads=8, vocab=4000,
                             tied_embeddings=tied, swiglu=False)
    prof, req, searchers = _searchers(shape, gpus, batch, sharding)
    checked = 0
    for s in searchers:
        L = s.L
        for c in s.configs():
            if c.schedule == "auto":
                continue
            sched = s.schedule(c)
            if sched is None or sched.num_stages // sched.chains > L:
                continue
            lc = s.p.at(1, "none")
            S_c = sched.num_stages // sched.chains
            kind = placement_of(c.schedule)
            for ends in combinations(range(1, L), S_c - 1):
                ranges = ranges_from_ends([*ends, L])
                pr = s.pricing.price(c, sched, lc, ranges)
                plan = s.scorer.simulate(c, sched, pr, math.inf, math.inf)
                step = plan.step_time
                assert c.bound <= step, (c, ranges)
                assert pr.bound <= step, (c, ranges)
                if kind is not None and sched.chains == 1:
                    shape_only = s.pricing.price(c, s.facts.shape(c, kind), lc, ranges, split=True)
                    assert shape_only.bound <= step, (c, ranges)
                    slowest = max(float(lc.work[a:b + 1].sum())
                                  for a, b in min_max_partition(lc.work, S_c))
                    assert c.microbatches * slowest * (1 - 1e-9) <= step, (c, ranges)
                checked += 1
    assert checked > 0


def test_the_bound_counts_the_optimizer_step():
    """pp = 1, dp = 1, ddp: nothing overlaps the Adam step, so the bound is the pipeline's
    work plus exactly that step (to rounding), and the planner's step equals it."""
    shape = TransformerShape(layers=2, hidden=256, ffn=1024, heads=8, vocab=4000)
    prof, req, searchers = _searchers(shape, 1, 4, "ddp")
    s = searchers[0]
    c = next(c for c in s.configs() if c.schedule == "1f1b")
    lc = s.p.at(1, "none")
    opt = s.axes.optimizer_time(1, float(lc.params.sum()))
    assert opt > 0
    work = c.microbatches * float(lc.work.sum())
    assert c.bound == pytest.approx(work + opt, rel=1e-9)
    sched = s.schedule(c)
    pr = s.pricing.price(c, sched, lc, [(0, len(lc.f) - 1)])
    assert pr.bound == pytest.approx(work + opt, rel=1e-9)
    assert s.scorer.simulate(c, sched, pr, math.inf, math.inf).step_time == pytest.approx(
        work + opt, rel=1e-9)


def test_the_capped_cut_counts_the_tied_copy_and_fits():
    """Cut (b) fits by construction: at every budget where it exists, each rank's static
    bytes (a tied embedding's copy on the head's rank included) plus its order's activation
    peak are within the budget. A large vocabulary makes the copy matter."""
    shape = TransformerShape(layers=4, hidden=256, ffn=1024, heads=8, vocab=60000,
                             tied_embeddings=True, swiglu=False)
    prof, req, searchers = _searchers(shape, 2, 8, "ddp")
    s = searchers[0]
    lc = s.p.at(1, "none")
    assert lc.tied > 0
    found = 0
    for c in s.configs():
        if c.pp != 2 or c.schedule not in ("1f1b", "interleaved-1f1b", "zbv"):
            continue
        sched = s.schedule(c)
        held = s.held(sched)
        peaks_of = {}
        total = (s.axes.bytes_per_param(c.dp) * float(lc.params.sum() + lc.tied)
                 + max(held) * float(lc.act.sum()))
        for k in range(60):
            budget = total * (0.1 + 0.02 * k)
            cut = s.cuts.capped_cut(lc, c, sched, held, budget)
            if cut is None:
                continue
            pr = s.pricing.price(c, sched, lc, cut)
            key = tuple(cut)
            if key not in peaks_of:
                peaks_of[key] = schedule_peaks(sched, pr.costs)
            peaks = [x + a for x, a in zip(pr.static, peaks_of[key], strict=True)]
            assert all(fits_limit(p, budget) for p in peaks), (c.schedule, budget, cut)
            found += 1
    assert found


@pytest.mark.parametrize("top", [3, 4, 5])  # 2: FSDP at pp 1 alone leads
def test_pruning_keeps_the_very_plans_of_no_pruning_ties_included(top):
    """Shardings often tie on the step (the same pipeline, traffic all hidden): the K plans
    of the pruned search are those of scoring everything, the ties at the K-th step sorted
    by plan_order (lighter first), whatever order the search visits them in."""
    from pipebubble.plan.planner import search

    shape = TransformerShape(layers=4, hidden=512, ffn=2048, heads=8, vocab=8000)
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=8, gpu_memory=80 * 2**30, global_batch=16, microbatch_sizes=(1, 2),
                  recompute=("none",), tp=(1,), cp=(1,), top=top,
                  schedules=("1f1b", "zb-h1", "interleaved-1f1b", "zbv"))
    hw = get_hardware("a100-80gb")
    fast = search(prof, req, hw).plans
    slow = search(prof, Request(**{**req.__dict__, "prune": False}), hw).plans

    def ident(p):
        return (p.config, tuple(p.ranges), p.step_time, max(p.peak_memory))

    assert [ident(p) for p in fast] == [ident(p) for p in slow]
    steps = [p.step_time for p in slow]
    assert len(set(steps)) < len(steps)  # the instance has ties to get right


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.floats(0.01, 10.0), min_size=3, max_size=9),
       stages=st.integers(2, 3), mem=st.lists(st.floats(0.0, 5.0), min_size=9, max_size=9),
       cap=st.floats(2.0, 20.0), scale=st.sampled_from([1e-7, 1.0, 1e6]))
def test_capped_within_never_rules_out_a_cut_that_is_within(costs, stages, mem, cap, scale):
    """partition.capped_within says False only when the best capped cut (brute force over
    every cut) has a stage above the bottleneck."""
    from pipebubble.plan.partition import capped_within

    L = len(costs)
    costs = [x * scale for x in costs]
    rows = [mem[:L]] * stages
    best = math.inf
    for ends in combinations(range(1, L), stages - 1):
        ranges = ranges_from_ends([*ends, L])
        if all(sum(rows[k][a:b + 1]) <= cap for k, (a, b) in enumerate(ranges)):
            best = min(best, max(sum(costs[a:b + 1]) for a, b in ranges))
    if best < math.inf:
        assert capped_within(costs, stages, rows, cap, best)
        assert capped_within(costs, stages, rows, cap, best * 1.5)
    for b in (best * 0.5, best * 0.999) if best < math.inf else (sum(costs),):
        if not capped_within(costs, stages, rows, cap, b):
            assert b < best


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_fits_from_the_order_is_the_simulated_plans_fit(sharding):
    """The search simulates a cut only once :meth:`MemoryBounds.fits` (static bytes + the
    order's peaks, no timing) says it fits, and weeds out configurations whose weights
    alone exceed the budget before generating their schedule: both must say exactly what
    the simulated plan says. For every family (DualPipe's pairs, ZB-V's V, FSDP's gathered
    layers) and each (a) cut, at budgets just below, at and above the simulated peak."""
    shape = TransformerShape(layers=6, hidden=256, ffn=1024, heads=8, vocab=8000)
    prof, req, searchers = _searchers(shape, 4, 8, sharding)
    s = searchers[0]
    seen = set()
    for c in s.configs():
        if lookup(c.schedule).searched:
            continue
        sched = s.schedule(c)
        if sched is None:
            continue
        lc = s.p.at(c.microbatch_size, c.recompute)
        S_c = sched.num_stages // sched.chains
        for cut in s.cuts.time_cuts(lc, c, S_c, sched.num_microbatches, sched.stage_to_rank):
            pr = s.pricing.price(c, sched, lc, cut)
            plan = s.scorer.simulate(c, sched, pr, math.inf, math.inf)
            peak = max(plan.peak_memory)
            assert s.memory.weight_bound(c) <= peak  # never rules out a plan that fits
            for budget in (math.nextafter(peak, 0.0), peak, peak * (1 + 1e-12), peak * 0.9):
                simulated = s.scorer.simulate(c, sched, pr, budget, math.inf) is not None
                assert s.memory.fits(pr, sched, budget) == simulated, (c.schedule, budget)
            seen.add(c.schedule)
    assert {"1f1b", "zbv", "dualpipe", "interleaved-1f1b"} <= seen
