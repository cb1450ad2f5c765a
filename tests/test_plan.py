"""The planner: exact against brute force over every configuration and every cut, pruning
changes nothing, memory errors name a budget that works, and the numbers it reports are
what the simulator says for the plan it returns."""

import math
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.commands._flags import render
from pipebubble.ir.schedule import ScheduleError
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.axes import Point
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.partition import ranges_from_ends
from pipebubble.plan.planner import (
    Config,
    NoPlanFits,
    Request,
    Searcher,
    chunk_options,
    schedule_list,
    search,
)
from pipebubble.plan.plans import one_rank_order
from pipebubble.plan.profile import Profile
from pipebubble.plan.scoring import legacy_axes
from pipebubble.plan.sharding import Sync
from pipebubble.schedules import get_schedule
from pipebubble.sim.kernel import simulate

SHARDINGS = ("ddp", "zero1", "zero2", "fsdp")

# The registered families: brute force enumerates their orders' cuts; auto's orders it cannot.
FAMILIES = tuple(n for n in schedule_list(None) if n != "auto")


def profile_of(layers, batch=1) -> ProfileSet:
    """layers: (forward, backward, params, activation_bytes) per layer."""
    return ProfileSet([Profile.from_dict({"batch": batch, "layers": [
        {"name": f"l{i}", "forward": f, "backward": b, "params": n, "activation_bytes": a,
         "flops": 0} for i, (f, b, n, a) in enumerate(layers)]})])


def every_configuration(profiles: ProfileSet, req: Request):
    """(config, schedule, layer costs) for every sharding, pp, microbatch size,
    recomputation, family and chunks the request allows, stated directly from the planner's
    documented rules (at pp = 1 families of equal one-rank orders are one plan, the first
    of 1F1B then the request's order, an I followed by its W counting as B where nothing
    hides behind W; a sharding over one replica is ddp's)."""
    for sharding in req.shardings or SHARDINGS:
        for pp in [d for d in range(1, req.gpus + 1) if req.gpus % d == 0]:
            dp = req.gpus // pp
            if sharding != "ddp" and dp == 1:
                continue
            for size in req.microbatch_sizes:
                if req.global_batch % (dp * size):
                    continue
                m = req.global_batch // (dp * size)
                for rec in req.recompute:
                    lc = profiles.at(size, rec)
                    names = schedule_list(req.schedules)
                    seen = set()
                    for name in sorted(names, key=lambda n: n != "1f1b"):
                        if pp == 1:  # I then W is B where nothing hides behind W
                            apart = lc.hidden is not None and bool((lc.hidden > 0).any())
                            key = one_rank_order(name, m, apart)
                            if key is None or key in seen:
                                continue
                            seen.add(key)
                        for v in chunk_options(name, req.max_chunks):
                            try:
                                sched = get_schedule(name, pp, m, v)
                            except ScheduleError:
                                continue
                            if sched.num_stages // sched.chains <= len(profiles):
                                dims = (ParallelDims(pp=pp, dp_replicate=dp)
                                        if sharding == "ddp" else
                                        ParallelDims(pp=pp, dp_shard=dp))  # dims.py
                                yield (Config(dims, size, m, name, v, rec, 0.0,
                                              sharding=sharding), sched, lc)


def rank_steps(tl, costs, params, sched, c: Config, req: Request) -> list[float]:
    """Each rank's end plus the data-parallel traffic of its stages that does not hide
    behind one microbatch's F and B on it (stated from plan/sharding.py's rule)."""
    axes = legacy_axes(req, Point(sharding=c.sharding))
    sync: Sync = axes.sync(c.dp, c.pp)
    out = []
    for r in range(c.pp):
        mine = [s for s in range(sched.num_stages) if sched.stage_to_rank[s] == r]
        n = sum(params[s] for s in mine)
        before, after = sync.times(n, c.pp)
        share = min(1.0, 40e6 / n) if n > 0 else 1.0
        hidden = max(after * share, after - sum(costs.b[s] for s in mine)) + max(
            before * share, before - sum(costs.f[s] for s in mine))
        end = max(tl.end[tl.offsets[r]:tl.offsets[r + 1]]) - min(tl.start)
        out.append(end + (hidden if c.dp > 1 else 0.0) + copy_sum(sched, params, r, c, req))
    return out


def copy_sum(sched, params, r: int, c: Config, req: Request) -> float:
    """DualPipe's two copies: rank ``r`` holds stage j of one chain and its partner the
    same stage of the other; after the data-parallel reduction the two all-reduce their
    1/dp shard of the gradient (2 ranks: the bytes once over the link, 2 latencies)."""
    if sched.chains < 2:
        return 0.0
    half = sched.num_stages // 2
    mine = [s for s in range(sched.num_stages) if sched.stage_to_rank[s] == r]
    partner = {sched.stage_to_rank[(s + half) % sched.num_stages] for s in mine} - {r}
    if not partner:
        return 0.0
    grad = req.grad_bytes * sum(params[s] for s in mine) / c.dp
    return grad / req.p2p_bandwidth + 2 * req.latency


def plan_step(p, profiles: ProfileSet, req: Request) -> float:
    """The step of plan ``p`` as its own simulation and the overlap rule say."""
    tl = simulate(p.schedule_obj, p.costs)
    n = len(p.ranges)
    params = [float(profiles.params[p.ranges[s % n][0]:p.ranges[s % n][1] + 1].sum())
              for s in range(len(p.stage_to_rank))]
    return max(rank_steps(tl, p.costs, params, p.schedule_obj, p.config, req))


def _cut_step(searcher: Searcher, req: Request, c: Config, sched, lc, ranges):
    """(step, fits) of one cut, priced by the planner's cost model, timed by simulate."""
    costs, params, transient = searcher.pricing.stage_costs(c, sched, lc, ranges)
    tl = simulate(sched, costs)
    bpp = searcher.axes.bytes_per_param(c.dp, c.pp)
    gathered = searcher.pricing.gathered(c, lc, sched, ranges) or [0.0] * c.pp  # fsdp resharding
    peaks = []
    for r, stats in enumerate(tl.rank_stats()):
        mine = [s for s in range(sched.num_stages) if sched.stage_to_rank[s] == r]
        peaks.append(sum(bpp * params[s] for s in mine)
                     + max(transient[s] for s in mine) + gathered[r] + stats.peak_memory)
    return max(rank_steps(tl, costs, params, sched, c, req)), max(peaks) <= req.gpu_memory


def pricer(profiles: ProfileSet, req: Request, c: Config) -> Searcher:
    return Searcher(profiles, req, legacy_axes(req, Point(sharding=c.sharding)))


def brute_force(profiles: ProfileSet, req: Request) -> float:
    """The fastest step of any configuration and any cut that fits: no bound, no partitioner.
    (Prices each cut with the planner's cost model; times and memory come from simulate.)"""
    L, best = len(profiles), math.inf
    for c, sched, lc in every_configuration(profiles, req):
        searcher = pricer(profiles, req, c)
        for ends in combinations(range(1, L), sched.num_stages // sched.chains - 1):
            step, fits = _cut_step(searcher, req, c, sched, lc, ranges_from_ends([*ends, L]))
            if fits:
                best = min(best, step)
    return best


def test_hand_example_pp1_beats_pp2():
    prof = profile_of([(1, 2, 0, 0)] * 4)
    res = search(prof, Request(gpus=2, gpu_memory=1, global_batch=4, microbatch_sizes=(1,),
                               schedules=("1f1b", "gpipe"), recompute=("none",), latency=0,
                               shardings=("ddp",)))
    # pp=1: 2 microbatches x 4 layers x 3 s = 24; pp=2, 1F1B or GPipe, m=4: (4+1) x 6 = 30.
    # At pp = 1 the orders differ (F0 B0 F1 B1 against F0 F1 B0 B1: GPipe holds both
    # microbatches' activations), so each family is priced: here both 24 (no activations).
    assert [(p.pp, p.step_time) for p in res.plans] == [(1, 24.0)] * 2 + [(2, 30.0)] * 2
    assert {p.schedule for p in res.plans if p.pp == 1} == {"1f1b", "gpipe"}


def test_memory_decides_between_gpipe_and_1f1b():
    # 2 GPUs, pp = 2 only (dp = 2 cannot split batch 3), m = 3, stage = 1 layer of 10 bytes
    # per microbatch: GPipe holds 3 on each rank (30 bytes), 1F1B holds 2 on rank 0.
    prof = profile_of([(1, 2, 0, 10)] * 2)
    req = dict(gpus=2, global_batch=3, microbatch_sizes=(1,), schedules=("gpipe", "1f1b"),
               recompute=("none",), latency=0)
    tight = search(prof, Request(gpu_memory=20, **req))
    assert [(p.schedule, max(p.peak_memory)) for p in tight.plans] == [("1f1b", 20.0)]
    both = search(prof, Request(gpu_memory=30, **req))
    assert sorted(p.schedule for p in both.plans) == ["1f1b", "gpipe"]


layer = st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(0, 50), st.integers(0, 40))


@settings(max_examples=12, deadline=None)
@given(layers=st.lists(layer, min_size=2, max_size=5), gpus=st.sampled_from([1, 2, 4]),
       batch=st.sampled_from([4, 8]), budget=st.integers(1, 900),
       bandwidth=st.sampled_from([10.0, 1e9]))
def test_best_plan_equals_brute_force(layers, gpus, batch, budget, bandwidth):
    layers = [(f, f + b, n, a) for f, b, n, a in layers]
    prof = profile_of(layers)
    req = Request(gpus=gpus, gpu_memory=budget, global_batch=batch, microbatch_sizes=(1, 2),
                  max_chunks=2, recompute=("none",), bytes_per_param=2, grad_bytes=1,
                  allreduce_bandwidth=bandwidth, p2p_bandwidth=1e9, latency=0.01, top=1,
                  schedules=FAMILIES)
    expect = brute_force(prof, req)
    cut_rule = Request(**{**req.__dict__, "exhaustive_cuts": 0})  # min-max cuts (a), (b) only
    if expect == math.inf:
        for r in (req, cut_rule):
            with pytest.raises(NoPlanFits):
                search(prof, r)
        return
    got = search(prof, req).plans[0]
    assert got.step_time == pytest.approx(expect, rel=1e-12)
    assert max(got.peak_memory) <= budget
    # Without enumerating cuts the planner may miss the best cut, never beat it or overrun.
    try:
        other = search(prof, cut_rule).plans[0]
    except NoPlanFits:
        return
    assert other.step_time >= expect * (1 - 1e-12) and max(other.peak_memory) <= budget


def brute_force_candidates(profiles: ProfileSet, req: Request) -> list[float]:
    """The fastest plan over every configuration and every cut the planner claims to
    consider, stated directly (no bounds, no pruning, no Searcher.evaluate): every cut when
    there are at most ``exhaustive_cuts``; else the min-max cut of m x (F + I + W) plus the
    all-reduce share and its rank-balanced refinement (the faster that fits), and only if
    neither fits the min-max cut under per-stage memory caps of budget / stages per rank.
    Returns every configuration's best step that fits, fastest first."""
    from pipebubble.plan.partition import PartitionError, balance_ranks, min_max_partition

    L, found = len(profiles), []
    for c, sched, lc in every_configuration(profiles, req):
        searcher = pricer(profiles, req, c)
        pp, S_c = c.pp, sched.num_stages // sched.chains
        if math.comb(L - 1, S_c - 1) <= req.exhaustive_cuts:
            cuts = [ranges_from_ends([*e, L])
                    for e in combinations(range(1, L), S_c - 1)]
        else:
            work = searcher.cuts.cut_costs(lc, c, sched.num_microbatches)
            cuts = [min_max_partition(work, S_c)]
            where = sched.stage_to_rank
            if len(where) > len(set(where)):
                cuts.append(balance_ranks(work, cuts[0], where))
        fit = [t for t, ok in (_cut_step(searcher, req, c, sched, lc, r)
                               for r in cuts) if ok]
        if not fit and math.comb(L - 1, S_c - 1) > req.exhaustive_cuts:
            rows = searcher.cuts.memory_rows(lc, c, sched, searcher.held(sched))
            try:
                capped = min_max_partition(
                    work, S_c, memory=rows,
                    memory_cap=req.gpu_memory / (sched.num_stages // pp))
            except PartitionError:
                continue
            fit = [t for t, ok in [_cut_step(searcher, req, c, sched, lc,
                                             capped)] if ok]
        if fit:
            found.append(min(fit))
    return sorted(found)


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(layers=st.lists(layer, min_size=9, max_size=10), budget=st.integers(200, 3000),
       batch=st.sampled_from([4, 8]))
def test_beyond_exhaustive_cuts_the_search_is_exact_over_its_candidates(layers, budget,
                                                                        batch):
    """At 9-10 layers on 4 GPUs, pp = 4 has 56-84 > 64 ways to cut (the min-max branch) and
    interleaved pp = 2 x 2 chunks too, while pp = 4 x 2 chunks has fewer (every cut): the
    best plan is the best of every candidate the planner claims, and each plan says which
    kind of cut it has."""
    layers = [(f, f + b, n, a) for f, b, n, a in layers]
    prof = profile_of(layers)
    req = Request(gpus=4, gpu_memory=budget, global_batch=batch, microbatch_sizes=(1, 2),
                  max_chunks=2, recompute=("none",), bytes_per_param=2, grad_bytes=1,
                  allreduce_bandwidth=1e3, p2p_bandwidth=1e9, latency=0.01, top=100,
                  schedules=("1f1b", "interleaved-1f1b", "zb-h1", "zbv", "gpipe"))
    expect = brute_force_candidates(prof, req)
    if not expect:
        with pytest.raises(NoPlanFits):
            search(prof, req)
        return
    best = search(prof, Request(**{**req.__dict__, "top": 1})).plans[0]  # pruning at work
    assert best.step_time == pytest.approx(expect[0], rel=1e-12)
    res = search(prof, req)  # every configuration's plan, the min-max branch's included
    assert [p.step_time for p in res.plans] == pytest.approx(expect, rel=1e-12)
    assert {p.cut_search for p in res.plans} <= {"exhaustive", "min-max", "min-max-capped"}
    for p in res.plans:
        S_c = len(p.ranges)
        assert (p.cut_search == "exhaustive") == (math.comb(len(prof) - 1, S_c - 1) <= 64)


def test_best_plan_equals_brute_force_with_recomputation():
    prof = ProfileSet([analytic_profile(layers=3, hidden=256, ffn=1024, heads=4, vocab=5000,
                                        seq=512, batch=1, tflops=1, mfu=0.5)])
    req = Request(gpus=2, gpu_memory=1, global_batch=4, microbatch_sizes=(1, 2),
                  max_chunks=2, recompute=("none", "full", "selective"), top=1,
                  schedules=FAMILIES)
    with pytest.raises(NoPlanFits) as info:
        search(prof, req)
    for budget in (info.value.smallest, 1.5 * info.value.smallest, 5 * info.value.smallest):
        req = Request(**{**req.__dict__, "gpu_memory": budget})
        got = search(prof, req).plans[0]
        assert got.step_time == pytest.approx(brute_force(prof, req), rel=1e-12)


def test_pruning_changes_nothing():
    # 8 layers on 4 GPUs, up to 2 chunks: 198 plans simulated without pruning, 20 with
    prof = ProfileSet([analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000,
                                        seq=2048, batch=1, tflops=300, mfu=0.4)])
    req = Request(gpus=4, gpu_memory=12 * 2**30, global_batch=32, max_chunks=2, top=6,
                  exhaustive_cuts=0, shardings=("ddp", "fsdp"))  # two kinds keep it cheap
    fast = search(prof, req)
    slow = search(prof, Request(**{**req.__dict__, "prune": False}))
    assert fast.simulated < slow.simulated
    assert [p.step_time for p in fast.plans] == [p.step_time for p in slow.plans]


def test_reported_numbers_are_the_simulators():
    prof = ProfileSet([analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000,
                                        seq=1024, batch=1, tflops=300, mfu=0.4)])
    res = search(prof, Request(gpus=8, gpu_memory=8 * 2**30, global_batch=64, top=5))
    times = [p.step_time for p in res.plans]
    assert times == sorted(times) and len(times) == 5
    for p in res.plans:
        tl = simulate(p.schedule_obj, p.costs)
        assert p.step_time == pytest.approx(plan_step(p, prof, res.request), rel=1e-12)
        assert p.pipeline_time == tl.step_time and p.bubble_fraction == tl.bubble_fraction
        assert p.pp * p.dp == 8 and p.microbatches * p.dp * p.microbatch_size == 64
        assert max(p.peak_memory) <= 8 * 2**30 and len(p.peak_memory) == p.pp
        layers = sorted({(s["first_layer"], s["last_layer"]) for s in p.stages()})
        assert layers[0][0] == 0 and layers[-1][1] == len(prof) - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(layers, layers[1:], strict=False))
        assert p.samples_per_second == pytest.approx(64 / p.step_time)


@pytest.mark.parametrize("exhaustive", [0, 64])
def test_nothing_fits_names_the_budget_that_does(exhaustive):
    prof = ProfileSet([analytic_profile(layers=4, hidden=512, ffn=1408, heads=8, vocab=8000,
                                        seq=512, batch=1, tflops=100, mfu=0.5)])
    req = Request(gpus=4, gpu_memory=2**20, global_batch=8, max_chunks=2, top=1,
                  exhaustive_cuts=exhaustive)
    with pytest.raises(NoPlanFits) as info:
        search(prof, req)
    need = info.value.smallest
    assert "nothing fits in gpu_memory 0.00GiB" in str(info.value)
    assert 2**20 < need < math.inf and "\n" not in str(info.value)
    assert search(prof, Request(**{**req.__dict__, "gpu_memory": need})).plans
    with pytest.raises(NoPlanFits):  # auto's own orders may fit lower: families only here
        search(prof, Request(**{**req.__dict__, "gpu_memory": need * (1 - 1e-3),
                                "schedules": FAMILIES}))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_nothing_fits_names_the_true_least_memory_auto_included(recompute):
    """The named budget is the least over every schedule searched, auto included: with it a
    plan comes out (auto's, when auto needs least), with a little less nothing does."""
    if "auto" not in schedule_list(None):
        pytest.skip("no automatic scheduler")
    prof = ProfileSet([analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, vocab=8000,
                                        seq=512, batch=1, tflops=100, mfu=0.5,
                                        attention="unfused")])
    req = Request(gpus=4, gpu_memory=2**20, global_batch=16, max_chunks=2, top=1,
                  recompute=(recompute,), shardings=("ddp",))  # (FSDP at pp = 1 needs less)
    with pytest.raises(NoPlanFits) as info:
        search(prof, req)
    need, named = info.value.smallest, info.value.plan
    # At pp = 1 every family is one plan (1F1B's, auto is not tried there): it may need least.
    assert (named.schedule == "auto" and "auto v=" in str(info.value)) or named.pp == 1
    if named.schedule == "auto":
        with pytest.raises(NoPlanFits) as fam:  # the families alone need more
            search(prof, Request(**{**req.__dict__, "schedules": FAMILIES}))
        assert fam.value.smallest > need
    got = search(prof, Request(**{**req.__dict__, "gpu_memory": need})).plans
    assert got and max(got[0].peak_memory) <= need * (1 + 1e-12)
    for less in (need * (1 - 1e-9), need * (1 - 1e-3)):
        with pytest.raises(NoPlanFits):
            search(prof, Request(**{**req.__dict__, "gpu_memory": less}))
    if named.schedule != "auto":
        return
    # By hand: auto's least budget is its cut's static bytes plus one microbatch of each of
    # the rank's stages (bounds.min_limits), on the worst rank.
    s = Searcher(prof, req)
    c = named.config
    pr = s.autos.cut(c, prof.at(c.microbatch_size, c.recompute))
    act = pr.costs.activation_memory
    per_rank = [pr.static[r] + sum(act[k] for k, q in enumerate(named.stage_to_rank) if q == r)
                for r in range(c.pp)]
    assert need == pytest.approx(max(per_rank), rel=1e-12)


def test_nothing_fits_bisects_the_memory_capped_cut_from_zero():
    """An 8-block model on 4 GPUs: the least memory is 1F1B's memory-capped cut (84 cuts:
    beyond --exhaustive-cuts). Its bisection used to start at the largest single layer's
    bound in any stage, above the cap the cut needs, so it never ran and the error named the
    min-max cut's 0.96 GiB while 0.88 GiB already gave a plan."""
    prof = ProfileSet([analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000,
                                        seq=1024, batch=1, tflops=300, mfu=0.4)])
    req = Request(gpus=4, gpu_memory=2**29, global_batch=16, top=1, shardings=("ddp",))
    with pytest.raises(NoPlanFits) as info:
        search(prof, req)
    need = info.value.smallest
    assert info.value.plan.cut_search == "min-max-capped" and need < 0.88 * 2**30
    assert search(prof, Request(**{**req.__dict__, "gpu_memory": need})).plans
    with pytest.raises(NoPlanFits):
        search(prof, Request(**{**req.__dict__, "gpu_memory": need * (1 - 1e-3)}))


@settings(max_examples=5, deadline=None)
@given(layers=st.lists(layer, min_size=6, max_size=10), gpus=st.sampled_from([2, 4]),
       batch=st.sampled_from([4, 8]), exhaustive=st.sampled_from([0, 64]))
def test_the_named_least_memory_is_exact(layers, gpus, batch, exhaustive):
    """Random models, every schedule (auto included), every cut or the rule: planning again
    with the named budget gives a plan; 0.1 % less gives none."""
    prof = profile_of([(f, f + b, n, a) for f, b, n, a in layers])
    req = Request(gpus=gpus, gpu_memory=1, global_batch=batch, microbatch_sizes=(1, 2),
                  max_chunks=2, recompute=("none",), bytes_per_param=2, grad_bytes=1,
                  allreduce_bandwidth=1e3, p2p_bandwidth=1e9, latency=0.01, top=1,
                  exhaustive_cuts=exhaustive)
    try:
        search(prof, req)
        return  # 1 byte is enough (no weights, no activations)
    except NoPlanFits as exc:
        need = exc.smallest
    assert search(prof, Request(**{**req.__dict__, "gpu_memory": need})).plans
    with pytest.raises(NoPlanFits):
        search(prof, Request(**{**req.__dict__, "gpu_memory": need * (1 - 1e-3)}))


def test_batch_that_cannot_divide_names_valid_values():
    prof = profile_of([(1, 2, 0, 0)] * 4)
    with pytest.raises(ValueError) as info:
        search(prof, Request(gpus=4, gpu_memory=1, global_batch=7, microbatch_sizes=(2,)))
    msg = render(info.value)  # as the command line writes it
    assert msg.startswith("--global-batch 7 cannot be split")
    assert "one of 2, 4, 8" in msg and "(nearest: 6 or 8)" in msg
    assert str(info.value).startswith("global_batch 7 cannot be split")  # the library's words
    assert info.value.params == ("global_batch", "gpus", "microbatch_sizes")


def test_schedules_that_do_not_exist_are_named():
    prof = profile_of([(1, 2, 0, 0)] * 4)
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'"):
        search(prof, Request(gpus=2, gpu_memory=1, global_batch=4, schedules=("nope",)))


def test_auto_is_searched_when_available():
    from pipebubble.plan.planner import _auto_function

    names = schedule_list(None)
    assert ("auto" in names) == (_auto_function() is not None)
    if "auto" not in names:
        return
    # auto only adds candidates: with it the best plan is at least as fast as the families'
    # brute-force optimum, fits, and an auto plan is scored like any other.
    prof = profile_of([(1, 2, 10, 5), (2, 3, 20, 5), (1, 1, 5, 5), (2, 4, 30, 5)])
    base = dict(gpus=2, gpu_memory=400, global_batch=8, microbatch_sizes=(1, 2), max_chunks=2,
                recompute=("none",), bytes_per_param=2, grad_bytes=1, latency=0.01, top=40)
    families = brute_force(prof, Request(**base, schedules=FAMILIES))
    res = search(prof, Request(**base))
    assert res.plans[0].step_time <= families * (1 + 1e-12)
    autos = [p for p in res.plans if p.schedule == "auto"]
    assert autos
    for p in autos:
        assert p.step_time == pytest.approx(plan_step(p, prof, res.request), rel=1e-12)
        assert max(p.peak_memory) <= 400


def test_a_schedule_that_cannot_be_built_says_why():
    prof = profile_of([(1, 2, 0, 0)] * 4)
    with pytest.raises(NoPlanFits, match=r"no configuration can be built for gpus 3.*"
                                         r"dualpipe pp=3: dualpipe needs an even number"):
        search(prof, Request(gpus=3, gpu_memory=1, global_batch=12, schedules=("dualpipe",)))


def test_validation_command_and_prediction_without_processes():
    from dataclasses import replace

    from pipebubble.plan.validate import Machine, command, scaled_prediction, sleep_times

    prof = ProfileSet([analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, vocab=8000,
                                        seq=512, batch=1, tflops=100, mfu=0.5)])
    plan = search(prof, Request(gpus=4, gpu_memory=2**34, global_batch=8, top=1,
                                schedules=("zb-h1",))).plans[0]
    f, b, w = sleep_times(plan, 10.0)
    n = len(plan.ranges)
    assert f == pytest.approx([10 * x for x in plan.costs.f[:n]])
    assert b == pytest.approx([10 * x for x in plan.costs.b[:n]])
    cmd = command(plan, 10.0)
    assert cmd[cmd.index("--ranks") + 1] == str(plan.pp)
    assert cmd[cmd.index("--layers") + 1] == str(n)
    assert [float(x) for x in cmd[cmd.index("--sleep-w") + 1].split(",")] == \
        pytest.approx(w, rel=1e-5)
    # No overhead, no message delay: the prediction scales with the stage times.
    base = simulate(plan.schedule_obj, replace(plan.costs, comm=0.0)).step_time
    assert scaled_prediction(plan, 10.0) == pytest.approx(10 * base)
    # An overhead o per action on a split backward: F + o, I + o, W + o.
    o = 1e-3
    c = plan.costs
    by_hand = simulate(plan.schedule_obj, replace(
        c, f=[10 * x + o for x in c.f], b=[10 * x + 2 * o for x in c.b],
        w=[10 * x + o for x in c.w], comm=0.002)).step_time
    assert scaled_prediction(plan, 10.0, Machine(o, 0.002)) == pytest.approx(by_hand)


def test_an_auto_plan_is_validated_from_its_csv(tmp_path):
    """An ``auto`` order is run as data: written as torch's CSV, which reads back as the very
    order the planner simulated, and the run command names the file, not the schedule."""
    from pipebubble.interop.torch_csv import read_torch_csv
    from pipebubble.plan.validate import command, fits_here, write_csv

    prof = ProfileSet([analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, vocab=8000,
                                        seq=512, batch=1, tflops=100, mfu=0.5)])
    plans = search(prof, Request(gpus=2, gpu_memory=2**34, global_batch=8, top=8,
                                 microbatch_sizes=(1,), recompute=("none",),
                                 schedules=("1f1b", "auto"))).plans
    auto = [p for p in plans if p.schedule == "auto"]
    other = next(p for p in plans if p.schedule == "1f1b")
    assert auto and all(fits_here(p, 2) for p in plans)
    for k, plan in enumerate(auto):
        path = write_csv(plan, str(tmp_path), k)
        back = read_torch_csv(path)
        assert back.orders == plan.schedule_obj.orders
        assert back.stage_to_rank == plan.schedule_obj.stage_to_rank
        cmd = command(plan, 1.0, csv=path)
        assert cmd[cmd.index("--csv") + 1] == path
        assert "--schedule" not in cmd and "--chunks" not in cmd
        assert cmd[cmd.index("--layers") + 1] == str(len(plan.ranges))
        with pytest.raises(ValueError):
            command(plan, 1.0)  # an auto order is never searched again by name
    assert write_csv(other, str(tmp_path), 9) is None
    assert command(other, 1.0)[6:8] == ["--schedule", "1f1b"]


@settings(max_examples=10, deadline=None)
@given(layers=st.lists(layer, min_size=2, max_size=5), gpus=st.sampled_from([2, 4]),
       batch=st.sampled_from([4, 8]), latency=st.sampled_from([0.0, 0.5]))
def test_the_pruning_bound_never_exceeds_the_simulated_step(layers, gpus, batch, latency):
    prof = profile_of([(f, f + b, n, a) for f, b, n, a in layers])
    req = Request(gpus=gpus, gpu_memory=1e12, global_batch=batch, microbatch_sizes=(1,),
                  max_chunks=2, recompute=("none",), allreduce_bandwidth=100.0,
                  p2p_bandwidth=1e9, latency=latency)
    s, L = Searcher(prof, req), len(prof)
    checked = 0
    for c in s.configs():
        sched = s.schedule(c) if c.schedule != "auto" else None
        if sched is None or sched.num_stages // sched.chains > L:
            continue
        lc = prof.at(c.microbatch_size, c.recompute)
        best = math.inf
        for ends in combinations(range(1, L), sched.num_stages // sched.chains - 1):
            ranges = ranges_from_ends([*ends, L])
            priced = s.pricing.price(c, sched, lc, ranges)
            tl = simulate(sched, priced.costs)
            _, params, _ = s.pricing.stage_costs(c, sched, lc, ranges)
            step = max(rank_steps(tl, priced.costs, params, sched, c, req))
            assert priced.bound <= step * (1 + 1e-12), (c, ranges)
            best = min(best, step)
            checked += 1
        assert c.bound <= best * (1 + 1e-12), c
    assert checked > 0


def test_the_bound_is_the_1f1b_step_for_equal_stages():
    prof = profile_of([(1, 2, 0, 0)] * 4)
    s = Searcher(prof, Request(gpus=4, gpu_memory=1, global_batch=8, microbatch_sizes=(1,),
                               schedules=("1f1b",), recompute=("none",), latency=0))
    c = next(c for c in s.configs() if c.pp == 4)
    priced = s.pricing.price(c, s.schedule(c), prof.at(1, "none"),
                             [(0, 0), (1, 1), (2, 2), (3, 3)])
    assert priced.bound == (8 + 4 - 1) * (1 + 2) == 33


@pytest.mark.parametrize("name, chunks", [(n, v) for n in FAMILIES
                                          for v in chunk_options(n, 3)])
def test_held_microbatches_from_the_core_equal_counting_by_a_walk(name, chunks):
    """held_per_stage counts over the validated flat actions the evaluation core reads
    (each stage's running count of F minus B/W); counting F and B/W of each stage along the
    orders must give the same numbers, for every family."""
    from pipebubble.plan.families import _held, held_per_stage

    for p, m in ((4, 16), (3, 7)):
        try:
            sched = get_schedule(name, p, m, chunks)
        except ScheduleError:
            continue
        for until in (("B", "W"), ("B", "I")):
            assert held_per_stage(sched, until) == _held(sched, until)
    assert held_per_stage(get_schedule("gpipe", 3, 5), ("B", "I")) == [5, 5, 5]


# ---- the sweep's range flags: one tokenizer, the same guards and wording ----------------------
@pytest.mark.parametrize("text, message", [
    ("x", "cannot read 'x'; use N, A..B or A..B:STEP (e.g. {ex}), comma-separated"),
    ("", "cannot read ''"),
    ("1..", "cannot read '1..'"),
    ("4:2", "cannot read '4:2'"),
    ("nan", "cannot read 'nan'"),
    ("inf", "cannot read 'inf'"),
    ("1_000", "cannot read '1_000'"),
    ("\u0661..3", "cannot read"),  # an Arabic-Indic digit: int() would take it
    ("1.." + "9" * 60, "is too long; use N, A..B or A..B:STEP with numbers of at most 18"),
    ("8..2", "empty range '8..2' (end 2 < start 8)"),
    ("1..8:0", "bad step in '1..8:0'; use A..B:STEP with STEP"),
    ("1..8:-1", "bad step in '1..8:-1'"),
    ("-3", "must be {low}>= {lo}, got -3 in '-3'"),
    ("1..1000000", "'1..1000000' has too many values (at most {most})"),
])
@pytest.mark.parametrize("kind", ["int", "real"])
def test_range_flags_share_guards_and_wording(kind, text, message):
    from pipebubble.errors import UserError
    from pipebubble.plan.sweep import MAX_LIMITS, MAX_POINTS, parse_limits, parse_range

    parse, ex, lo, low, most = {
        "int": (parse_range, "1..128", 1, "", MAX_POINTS),
        "real": (parse_limits, "1..8:0.5", 0, "finite and ", MAX_LIMITS)}[kind]
    if kind == "int" and text == "1..1000000":
        text, message = "1..100001", message.replace("1000000", "100001")
    with pytest.raises(UserError) as info:
        parse(text, "--flag")
    msg = str(info.value)
    assert msg.startswith("--flag") and "\n" not in msg
    assert message.format(ex=ex, lo=lo, low=low, most=most) in msg


def test_range_flags_read_the_same_forms():
    from pipebubble.plan.sweep import parse_limits, parse_range

    assert parse_range(" 2 .. 6:2 , 9") == [2, 4, 6, 9]
    assert parse_limits(" 2 .. 6:2 , 9") == [2.0, 4.0, 6.0, 9.0]
    assert parse_limits("0..1:0.25,1e0") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert parse_range("1..100000") == list(range(1, 100001))  # exactly the most allowed
    with pytest.raises(ValueError, match="too many values"):
        parse_limits("0..1:1e-300")  # a tiny step: refused before anything is built
    with pytest.raises(ValueError, match="with finite numbers"):
        parse_limits("1e999")


def test_validation_workload_sleeps_i_in_i_on_the_first_stage_too(monkeypatch):
    """--validate's sleep model: a split backward (runtime/split.py) of a first stage (whose
    input needs no gradient) sleeps b - w in I and w in W, as the plan's costs say. It used to
    sleep both in W (the layer's own input leaf was taken for a weight), which made the first
    stage's deferred Ws of zero-bubble and auto orders run I + W and the runs slower than
    predicted."""
    import torch

    import pipebubble.models.sleep as sleep_mod
    from pipebubble.models import build_model
    from pipebubble.runtime.split import backward_input

    naps: list[float] = []

    class Clock:
        @staticmethod
        def sleep(s):
            naps.append(round(s, 9))

    monkeypatch.setattr(sleep_mod, "time", Clock)
    spec = build_model("sleep", layers=1, width=3, f=0.1, b=0.5, w=0.2)
    x, y = spec.make_batch(4, torch.Generator().manual_seed(0))
    stage_input = x.detach()  # the first stage: no gradient wanted for its input
    loss = spec.loss_fn(spec.layers[0](stage_input), y)
    naps.clear()
    gin, weight_work = backward_input(loss, None, stage_input)
    assert gin is None and naps == [0.3]  # I: b - w
    naps.clear()
    weight_work.run()
    assert naps == [0.2]  # W: w
    g_out = 2 * (spec.layers[0](stage_input) - y) / y.numel()
    torch.testing.assert_close(spec.layers[0].weight.grad, (g_out * stage_input).sum(0))


# ---- the cut search's shortcuts decide exactly what the sweep decides -------------------------
def test_min_max_cut_without_caps_is_the_sweeps_cut():
    """Without memory caps the partitioner finds the optimum by greedy fills and rebuilds
    the cut from interval reachability; the general sweep (which handles caps) must give
    the same cut for every tie-break, zero-cost layers and slack included."""
    import random

    import numpy as np

    from pipebubble.plan import partition as P

    rng = random.Random(7)
    for _ in range(300):
        L = rng.randint(1, 24)
        S = rng.randint(1, L)
        costs = ([rng.choice([0, 0, 1, 2, 3]) for _ in range(L)] if rng.random() < 0.5
                 else [rng.random() for _ in range(L)])
        if not any(costs):
            costs[0] = 1
        slack = rng.choice([0.0, 0.2])
        q, qe = P._integers(np.asarray(costs, dtype=float), [0.0] * S)
        sweep = P._Sweep(q, qe, None)
        best = P._greedy_optimum(sweep.P.tolist(), S, int(q.max()), int(sweep.P[-1]))
        # the optimum is the least bottleneck the sweep finds feasible
        assert sweep.run(best)[0] and (best == 0 or not sweep.run(best - 1)[0])
        if slack:
            best = max(best, int(best * (1 + slack)))
        ok, R, reach, _ = sweep.run(best)
        for tie in P.TIE_BREAKS:
            want = P.ranges_from_ends(P._reconstruct(sweep, R, reach, tie))
            assert P.min_max_partition(costs, S, tie_break=tie, slack=slack) == want


def test_no_capped_cut_is_only_claimed_when_none_exists():
    """Cuts.capped_possible may say False only where the capped partitioner finds no
    cut (it is a necessary condition): random layers, schedules and budgets."""
    import random

    from pipebubble.plan.partition import capped_partition

    rng = random.Random(3)
    said_no = 0
    for _ in range(60):
        layers = [(rng.randint(1, 3), rng.randint(2, 6), rng.randint(0, 30), rng.randint(0, 20))
                  for _ in range(rng.randint(4, 9))]
        prof = profile_of(layers)
        req = Request(gpus=4, gpu_memory=1e9, global_batch=8, microbatch_sizes=(1,),
                      recompute=("none",), bytes_per_param=2, grad_bytes=1, latency=0,
                      shardings=("ddp",))
        s = Searcher(prof, req)
        lc = prof.at(1, "none")
        name, v = rng.choice([("1f1b", 1), ("zbv", 2), ("interleaved-1f1b", 2), ("dualpipe", 1)])
        pp = 2 if v == 2 else rng.choice([2, 4])
        if pp * v > len(layers):
            continue
        c = Config(ParallelDims(pp=pp, dp_replicate=4 // pp), 1, 2 * pp, name, v, "none", 0.0)
        sched = s.schedule(c)
        held = s.held(sched)
        for budget in (rng.uniform(10, 400) for _ in range(5)):
            per_rank = sched.num_stages // pp
            cut = capped_partition(s.cuts.cut_costs(lc, c, sched.num_microbatches),
                                   sched.num_stages // sched.chains,
                                   s.cuts.memory_rows(lc, c, sched, held), budget / per_rank)
            if not s.cuts.capped_possible(lc, c, sched, held, budget):
                said_no += 1
                assert cut is None
    assert said_no > 0  # the check is exercised
