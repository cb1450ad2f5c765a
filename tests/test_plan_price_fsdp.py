"""FSDP / ZeRO-3 priced as the frameworks run it under gradient accumulation (plan/sharding.py):
resharded ``always``, two gathers and a reduce-scatter of every layer each microbatch, with
per-layer prefetch and the gathered layers in memory; resharded ``never``, one gather a step
and the unsharded weights and gradients held; ``auto`` as torchtitan (never under PP).
ZeRO-1 (Megatron's distributed optimizer) reduce-scatters once, behind the last backward.

The terms are worked by hand from the ring formulas ((n-1)/n x bytes / bandwidth + (n-1)
latency) on the A100 preset: NVLink 300 GB/s, 8 NICs of 25 GB/s a node, bus fraction 0.8.
"""

import math
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan.analytic import TransformerShape, analytic_profile, shape_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.partition import ranges_from_ends
from pipebubble.plan.planner import Request, build_points
from pipebubble.plan.scoring import Searcher
from pipebubble.plan.sharding import BUCKET, check_reshard

NVLINK = (300e9 * 0.8, 2e-6)  # inside a node
ACROSS_8 = (8 * 25e9 * 0.8, 5e-6)  # a group with 8 members a node: 8 NICs


def ring(nbytes: float, n: int, link) -> float:
    """All-gather or reduce-scatter of a ``nbytes`` buffer over ``n`` ranks, by hand."""
    bw, lat = link
    return (n - 1) / n * nbytes / bw + (n - 1) * lat


def searcher(gpus: int, batch: int, sharding: str = "fsdp", reshard: str = "auto",
             layers: int = 3, hidden: int = 256, schedules=("1f1b",)) -> Searcher:
    shape = TransformerShape(layers=layers, hidden=hidden, ffn=4 * hidden, heads=8, vocab=4000,
                             swiglu=False, tied_embeddings=False)
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=gpus, gpu_memory=1e15, global_batch=batch, microbatch_sizes=(1,),
                  recompute=("none",), tp=(1,), cp=(1,), shardings=(sharding,), max_chunks=1,
                  exhaustive_cuts=10**6, schedules=schedules, fsdp_reshard=reshard)
    (_, costs, axes), = build_points(prof, req, get_hardware("a100-80gb"))
    return Searcher(costs, req, axes)


def config(s: Searcher, pp: int, schedule: str = "1f1b"):
    return next(c for c in s.configs() if c.pp == pp and c.schedule == schedule)


def whole(s: Searcher, c):
    """The one-stage plan of pp = 1: its priced cut and its plan."""
    sched = s.schedule(c)
    lc = s.p.at(1, "none")
    ranges = ranges_from_ends([s.L])
    pr = s.pricing.price(c, sched, lc, ranges)
    return lc, pr, s.scorer.simulate(c, sched, pr, math.inf, math.inf)


@pytest.mark.parametrize("gpus, link", [(8, NVLINK), (16, ACROSS_8)])
def test_always_every_term_by_hand(gpus, link):
    """pp 1, dp = gpus, 2 microbatches, auto = always. Per layer l (embedding, 3 blocks,
    head): AG_l = ring(2 P_l), RS_l = ring(4 P_l) (fp32 gradients). The forward exposes the
    first gather and what each later gather exceeds of the layer before it; the backward
    (last layer first) the first gather, what each gather plus the previous layer's
    reduce-scatter exceeds of that layer's backward, and the last reduce-scatter. Nothing is
    left for after the step; the step is 2 x (F + B) + the optimizer step; memory is the
    sharded 16 / N bytes a parameter plus the weights and gradients of the layer computing
    and the one prefetched, (2 + 2) x max_l (P_l + P_{l+1})."""
    s = searcher(gpus, 2 * gpus)
    c = config(s, 1)
    assert c.microbatches == 2 and c.dp == gpus
    lc, pr, plan = whole(s, c)
    P = [float(x) for x in lc.params]
    F = [float(x) for x in lc.f]
    B = [float(i + w) for i, w in zip(lc.i, lc.w, strict=True)]
    AG = [ring(2 * p, gpus, link) for p in P]
    RS = [ring(4 * p, gpus, link) for p in P]
    L = len(P)
    fwd = AG[0] + sum(max(0.0, AG[l] - F[l - 1]) for l in range(1, L))
    bwd = AG[L - 1] + sum(max(0.0, AG[l] + RS[l + 1] - B[l + 1]) for l in range(L - 1)) + RS[0]
    assert pr.costs.f[0] == pytest.approx(sum(F) + fwd)
    assert pr.costs.b[0] == pytest.approx(sum(B) + bwd)
    assert fwd >= sum(AG) - sum(F) and bwd >= sum(AG) + sum(RS) - sum(B)
    assert plan.dp_exposed == 0.0  # all of it is inside F and B now
    opt = s.axes.optimizer_time(gpus, sum(P))
    assert plan.step_time == pytest.approx(2 * (sum(F) + fwd + sum(B) + bwd) + opt)
    assert plan.fsdp_reshard == "always"
    mem = plan.memory[0]
    assert mem["weights"] == pytest.approx(2 * sum(P) / gpus)
    assert mem["gradients"] == pytest.approx(2 * sum(P) / gpus)
    assert mem["optimizer"] == pytest.approx(12 * sum(P) / gpus)
    pair = max(P[l] + P[l + 1] for l in range(L - 1))
    assert mem["gathered_layers"] == pytest.approx((2 + 2) * pair)
    assert pr.static[0] == pytest.approx(16 * sum(P) / gpus + 4 * pair
                                         + float(lc.transient.max()))


def test_never_gathers_once_and_holds_the_weights():
    """Explicit never at pp 1 over 8 GPUs (one node): F and B are the layers' own; one
    gather of 2 P before the first forward and one reduce-scatter of 4 P after the last
    backward, each hiding behind one microbatch's forward / backward but for one bucket;
    memory holds the weights and gradients whole, 2 + 2 + 12 / 8 bytes a parameter."""
    s = searcher(8, 32, reshard="never")
    c = config(s, 1)
    assert c.microbatches == 4
    lc, pr, plan = whole(s, c)
    P, F, B = float(lc.params.sum()), float(lc.f.sum()), float((lc.i + lc.w).sum())
    assert pr.costs.f[0] == pytest.approx(F) and pr.costs.b[0] == pytest.approx(B)
    before, after = ring(2 * P, 8, NVLINK), ring(4 * P, 8, NVLINK)
    share = min(1.0, BUCKET / P)
    exposed = max(after * share, after - B) + max(before * share, before - F)
    assert plan.dp_exposed == pytest.approx(exposed)
    assert s.axes.bytes_per_param(8, 1) == 2 + 2 + 12 / 8
    mem = plan.memory[0]
    assert mem["weights"] == pytest.approx(2 * P) and mem["gradients"] == pytest.approx(2 * P)
    assert "gathered_layers" not in mem
    assert plan.fsdp_reshard == "never"


def test_auto_keeps_the_weights_under_pp_only():
    s = searcher(8, 16)
    assert s.axes.keeps_weights(2) and not s.axes.keeps_weights(1)
    assert s.axes.bytes_per_param(4, 2) == 2 + 2 + 12 / 4
    assert s.axes.bytes_per_param(8, 1) == 16 / 8
    assert s.axes.sync(4, 2).times(1e9, 2) == (ring(2e9, 4, NVLINK), ring(4e9, 4, NVLINK))
    assert s.axes.sync(8, 1).times(1e9, 1) == (0.0, 0.0)  # per microbatch instead
    always = searcher(8, 16, reshard="always")
    assert not always.axes.keeps_weights(2) and always.axes.bytes_per_param(4, 2) == 16 / 4


@pytest.mark.parametrize("m", [2, 4])
def test_zero1_reduce_scatters_once_behind_the_last_backward(m):
    """Megatron's distributed optimizer: whatever the microbatch count, one reduce-scatter of
    4 P behind the last microbatch's backward and one gather of 2 P behind the next forward;
    F and B carry nothing."""
    s = searcher(8, 8 * m, sharding="zero1")
    c = config(s, 1)
    assert c.microbatches == m
    lc, pr, plan = whole(s, c)
    P, F, B = float(lc.params.sum()), float(lc.f.sum()), float((lc.i + lc.w).sum())
    assert pr.costs.f[0] == pytest.approx(F) and pr.costs.b[0] == pytest.approx(B)
    before, after = ring(2 * P, 8, NVLINK), ring(4 * P, 8, NVLINK)
    share = min(1.0, BUCKET / P)
    assert plan.dp_exposed == pytest.approx(max(after * share, after - B)
                                            + max(before * share, before - F))
    assert plan.step_time == pytest.approx(m * (F + B) + plan.dp_exposed
                                           + s.axes.optimizer_time(8, P))


@settings(max_examples=8, deadline=None)
@given(layers=st.sampled_from([2, 3]), hidden=st.sampled_from([128, 256]),
       gpus=st.sampled_from([4, 8, 16]), per=st.sampled_from([1, 2, 4]),
       reshard=st.sampled_from(["always", "never"]), sharding=st.sampled_from(["fsdp", "hsdp"]))
def test_no_plan_is_cheaper_than_its_traffic(layers, hidden, gpus, per, reshard, sharding):
    """Every configuration, every cut: the step is at least each rank's data-parallel
    traffic, priced with the ring formulas on the links the network gives: resharded
    ``always``, m x (2 gathers + 1 reduce-scatter) of every layer of the rank (one stream
    carries them); ``never``, the one gather and the one reduce-scatter of its parameters
    (each hides behind at most one forward or backward of the rank)."""
    if sharding == "hsdp":
        gpus = 16  # a shard group of 8 (a node) and 2 replicas
    s = searcher(gpus, gpus * per, sharding=sharding, reshard=reshard, layers=layers,
                 hidden=hidden, schedules=("1f1b", "gpipe"))
    lc = s.p.at(1, "none")
    checked = 0
    for c in s.configs():
        if c.dp < 2 or (sharding == "hsdp" and not s.axes.shard(c.dp)):
            continue
        sched = s.schedule(c)
        if sched is None or sched.num_stages > s.L:
            continue
        sync = s.axes.sync(c.dp, c.pp)
        for ends in combinations(range(1, s.L), sched.num_stages - 1):
            ranges = ranges_from_ends([*ends, s.L])
            pr = s.pricing.price(c, sched, lc, ranges)
            plan = s.scorer.simulate(c, sched, pr, math.inf, math.inf)
            for r in range(c.pp):
                mine = [ranges[st_] for st_, k in enumerate(sched.stage_to_rank) if k == r]
                P = [float(p) for a, b in mine for p in lc.params[a:b + 1]]
                if resolve(s, c.pp) == "always":
                    floor = c.microbatches * sum(2 * sync.layer_traffic(p)[0]
                                                 + sync.layer_traffic(p)[1] for p in P)
                else:
                    floor = sum(sync.times(sum(P), c.pp))
                assert plan.step_time >= floor * (1 - 1e-9), (c, ranges, r)
            checked += 1
    assert checked > 0


def resolve(s: Searcher, pp: int) -> str:
    return "never" if s.axes.keeps_weights(pp) else "always"


def test_more_microbatches_cost_more_gathers_when_resharding():
    """always: every microbatch pays its gathers again, so the step with 4 microbatches of the
    same work exceeds the one with 2 by at least 2 more rounds of traffic that does not hide
    (here, across two nodes); never pays it once."""
    steps = {}
    for reshard in ("always", "never"):
        for m in (2, 4):
            s = searcher(16, 16 * m, reshard=reshard)
            steps[reshard, m] = whole(s, config(s, 1))[2].step_time
    lc = searcher(16, 32).p.at(1, "none")
    work = float(lc.f.sum() + (lc.i + lc.w).sum())
    assert steps["never", 4] - steps["never", 2] == pytest.approx(2 * work)
    assert steps["always", 4] - steps["always", 2] > 2 * work


def test_unknown_policy_is_one_line(tmp_path, capsys):
    with pytest.raises(UserError, match="valid are always, never, auto"):
        check_reshard("sometimes")
    path = tmp_path / "p.json"
    analytic_profile(layers=2, hidden=64, ffn=256, heads=4, vocab=100, seq=64, batch=1,
                     tflops=100, mfu=0.5).save(path)
    rc = main(["plan", "--profile", str(path), "--gpus", "8", "--global-batch", "8",
               "--fsdp-reshard", "sometimes"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "--fsdp-reshard 'sometimes'; valid are always, never, auto" in err
