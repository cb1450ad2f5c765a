"""``plan --config`` without a full search (plan/bound_rank.py): the configuration priced on
its own is priced exactly as the full search prices it, and the rank stated from the bounds
holds: on small cases the full search (every configuration's plan, ``top`` unbounded) is run
and the true rank (1 + the plans strictly faster) must lie in the stated interval."""

from dataclasses import replace

import pytest

from pipebubble.plan import frameworks as F
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.bound_rank import FASTER, matches, rank_by_bounds
from pipebubble.plan.config import parse_config, restrict
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import NoPlanFits, Request, search
from pipebubble.plan.plans import one_rank_order
from pipebubble.plan.profile import Profile

ALL = 10**6  # top: every configuration's plan


def _measured(seed: int) -> ProfileSet:
    """A measured-style profile: 8 layers of uneven times, weights and activations."""
    import random

    rng = random.Random(seed)
    layers = [{"name": f"l{i}", "forward": f, "backward": f + rng.randint(1, 4),
               "params": rng.randint(1, 40), "activation_bytes": rng.randint(1, 30),
               "flops": 0} for i, f in enumerate(rng.randint(1, 4) for _ in range(8))]
    return ProfileSet([Profile.from_dict({"batch": 1, "layers": layers})])


def _cases():
    """(name, profiles, request, hardware): small enough for a search without pruning."""
    fams = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipe")
    legacy = dict(microbatch_sizes=(1, 2), max_chunks=2, recompute=("none",),
                  bytes_per_param=2, grad_bytes=1, allreduce_bandwidth=1e3, p2p_bandwidth=1e9,
                  latency=0.01, schedules=fams)
    yield ("measured, roomy", _measured(1),
           Request(gpus=8, gpu_memory=4000, global_batch=16, **legacy), None)
    yield ("measured, tight memory", _measured(2),
           Request(gpus=8, gpu_memory=420, global_batch=16, **legacy), None)
    tiny = ProfileSet([analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, kv_heads=4,
                                        vocab=8192, seq=512, batch=1)])
    hw = get_hardware("h100-sxm")
    yield ("analytic on h100, every axis", tiny,
           Request(gpus=8, gpu_memory=hw.memory * 0.95, global_batch=16,
                   microbatch_sizes=(1, 2), max_chunks=2, recompute=("none", "full"),
                   schedules=("1f1b", "interleaved-1f1b", "zbv")), hw)
    yield ("analytic on h100, 3 GiB", tiny,
           Request(gpus=8, gpu_memory=3 * 2**30, global_batch=32, microbatch_sizes=(1, 4),
                   max_chunks=2, recompute=("none", "full"), schedules=("1f1b", "zb-h1")), hw)


CASES = list(_cases())


def _text(p, keys=None) -> str:
    """The plan's configuration as ``--config`` text (``keys``: only those)."""
    c = p.config
    items = {"tp": c.tp, "sp": int(c.sp), "cp": c.cp, "pp": c.pp, "dp": c.dp,
             "sharding": str(c.sharding), "mbs": c.microbatch_size, "schedule": c.schedule,
             "v": c.chunks, "recompute": c.recompute}
    return ",".join(f"{k}={v}" for k, v in items.items() if keys is None or k in keys)


def _key(c) -> tuple:
    """A configuration, its schedule left out at pp = 1 (the full search tries one family
    of each order there, a search asked for another family of that order tries that one;
    test_at_pp_1_each_family_is_priced_as_the_full_search_prices_it checks them)."""
    return (c.dims, c.sharding, c.microbatch_size, c.microbatches, c.recompute,
            c.schedule if c.pp > 1 else None, c.chunks)


def _check(prof, req, hw, full, text: str, may_count=None, pool=None, ranks=None):
    """Price ``text`` on its own, rank it by the bounds, and check both against ``full``."""
    config = parse_config(text, req.gpus)
    try:
        mine = search(prof, replace(restrict(req, config), top=1), hw).plans[0]
    except NoPlanFits:
        assert not any(matches(p.config, config) for p in full.plans)
        return None
    # priced exactly as the full search prices it: every configuration the restricted search
    # prices has the full search's plan (step, memory, cut), and the asked one is its fastest
    alone = search(prof, replace(restrict(req, config), top=ALL), hw).plans
    assert mine.step_time == alone[0].step_time
    by_key = {_key(p.config): p for p in full.plans}
    for p in alone:
        q = by_key[_key(p.config)]
        if p.config == q.config:  # (at pp = 1 the full search prices one of an order)
            assert (p.step_time, p.peak_memory, p.ranges) == (q.step_time, q.peak_memory,
                                                              q.ranges), text
    r = rank_by_bounds(prof, req, config, mine.step_time, hw, may_count=may_count,
                       ranks=ranks)
    assert r.considered == full.searched  # every configuration the full search considers
    faster = [p for p in (full.plans if pool is None else pool)
              if p.step_time < mine.step_time * FASTER]
    true_rank = 1 + len(faster)
    assert r.low <= true_rank <= r.high, (text, true_rank, r)
    assert (r.faster + r.could_be_faster + r.slower + r.cannot_fit + r.not_run + r.own
            == r.considered)
    assert r.priced <= 8 and r.faster <= r.priced
    if r.fastest is not None:  # a priced plan: the full search's plan of that configuration
        q = {_key(p.config): p for p in full.plans}[_key(r.fastest.config)]
        assert q.step_time == r.fastest.step_time < mine.step_time
        assert ranks is None or ranks(r.fastest)  # in the pool ranked among
    if len(faster) > r.faster:  # one not priced: its bound (at most its step) is open
        assert r.best_bound is not None
        # each faster plan not priced is at least the best open bound: only the priced
        # ones may be faster than that
        assert sum(p.step_time < r.best_bound * (1 - 1e-12) for p in faster) <= r.faster
    if r.best_bound is not None:
        assert r.best_bound < mine.step_time and r.best is not None
    return true_rank, r


@pytest.mark.parametrize("name, prof, req, hw", CASES, ids=[c[0] for c in CASES])
def test_priced_alone_as_the_full_search_prices_it_and_the_rank_holds(name, prof, req, hw):
    full = search(prof, replace(req, top=ALL), hw)
    assert len(full.plans) < ALL
    plans = sorted(full.plans, key=lambda p: p.step_time)
    # the fastest, the slowest and a spread in between, each asked in full
    picks = {id(p): p for p in [*plans[:3], *plans[-3:], *plans[::max(1, len(plans) // 12)]]}
    ranks = []
    for p in picks.values():
        got = _check(prof, req, hw, full, _text(p))
        assert got is not None
        ranks.append(got)
    # the fastest plan's bound interval starts at #1, and some configuration is #1 exactly
    # when no other's bound beats it (stated as "#1"): never claimed for a slower one
    for true_rank, r in ranks:
        if r.exact:
            assert true_rank == 1
    # partial configurations: the rest of the axes searched, priced as the best of them
    for keys in (("pp", "dp", "sharding"), ("tp", "pp", "mbs", "recompute"),
                 ("schedule", "pp"), *([("pp",), ("schedule",)] if hw is None else [])):
        for p in plans[:: max(1, len(plans) // 2)]:
            _check(prof, req, hw, full, _text(p, keys))


def test_the_rank_among_what_a_framework_runs_holds():
    """Under a framework the rank counts only the plans it runs; the configurations it surely
    does not run (frameworks.may_run_config) are left out, and the interval still holds."""
    name, prof, req, hw = CASES[2]
    fw = F.get_framework("megatron")
    full = search(prof, replace(req, top=ALL), hw)
    pool = [p for p in full.plans if F.blocker(fw, p) is None]
    assert pool and len(pool) < len(full.plans)
    for p in sorted(full.plans, key=lambda p: p.step_time)[::40]:
        got = _check(prof, req, hw, full, _text(p),
                     may_count=lambda c: F.may_run_config(fw, c), pool=pool,
                     ranks=lambda p: F.blocker(fw, p) is None)
        assert got is not None


def test_at_pp_1_each_family_is_priced_as_the_full_search_prices_it():
    """One rank: families whose orders are equal are the same plan, tried once (1F1B first);
    the others are priced apart, and ``--config schedule=F`` prices F as the full search
    does (or, merged, as the family of F's order). By hand: GPipe keeps all m microbatches'
    activations where 1F1B keeps one; ZB-H2's order at pp = 1 is ZB-H1's; ZB-H1 splits each
    backward, so under TP its I exposes the collectives B hides behind its W: slower; at
    tp 1 nothing hides behind W, I then W is B, and ZB-H1 is 1F1B's plan (shown once, as
    1F1B; ``schedule=zb-h1`` prices it at 1F1B's step and memory)."""
    fams = ("gpipe", "1f1b", "zb-h1", "zb-h2")
    prof = ProfileSet([analytic_profile(layers=4, hidden=512, ffn=1408, heads=8, kv_heads=4,
                                        vocab=8192, seq=512, batch=1)])
    hw = get_hardware("h100-sxm")
    req = Request(gpus=2, gpu_memory=hw.memory * 0.95, global_batch=8, microbatch_sizes=(2,),
                  recompute=("none",), pp=(1,), shardings=("ddp",), schedules=fams)
    full = search(prof, replace(req, top=ALL), hw).plans
    assert one_rank_order("zb-h2", 4) == one_rank_order("zb-h1", 4)
    assert {p.config.schedule for p in full} == {"gpipe", "1f1b", "zb-h1"}
    by_config = {p.config: p for p in full}
    assert len(by_config) == len(full)  # one plan a configuration
    checked, tps = 0, set()
    for p in full:
        if p.config.schedule != "1f1b":
            continue
        c, m = p.config, p.config.microbatches
        assert req.pp1_schedules(list(fams), m) == ["1f1b", "gpipe", "zb-h1"]
        for f in fams:
            text = _text(p).replace("schedule=1f1b", f"schedule={f}")
            mine = search(prof, replace(restrict(req, parse_config(text, req.gpus)), top=1),
                          hw).plans[0]
            merged = "zb-h1" if f == "zb-h2" else f
            if c.tp == 1 and merged == "zb-h1":
                merged = "1f1b"  # nothing hides behind W: the split is 1F1B's plan
                assert replace(c, schedule="zb-h1") not in by_config
            same = by_config[replace(c, schedule=merged)]
            assert mine.config.schedule == f
            if not (c.tp == 1 and f in ("zb-h1", "zb-h2")):  # priced as the search does
                assert (mine.step_time, mine.peak_memory, mine.ranges) == (
                    same.step_time, same.peak_memory, same.ranges), (f, _text(p))
            else:  # a split at tp 1: 1F1B's plan up to the sum I + W = B
                assert mine.step_time == pytest.approx(same.step_time, rel=1e-12)
                assert (mine.peak_memory, mine.ranges) == (same.peak_memory, same.ranges)
            if f == "zb-h1":
                zb = mine
            checked += 1
        gpipe = by_config[replace(c, schedule="gpipe")]
        tps.add(c.tp)
        assert gpipe.memory[0]["activations"] == pytest.approx(m * p.memory[0]["activations"])
        assert gpipe.step_time == pytest.approx(p.step_time, rel=1e-12)
        assert zb.memory[0]["activations"] == p.memory[0]["activations"]
        if c.tp > 1:
            assert zb.step_time > p.step_time * 1.01
        else:
            assert zb.step_time == pytest.approx(p.step_time, rel=1e-12)
    assert tps == {1, 2} and checked >= 4 * 2  # tp 1 (dp 2) and tp 2 (with and without sp)


def test_the_bounds_rule_out_most_configurations_on_a_large_shape():
    """A sanity check of the bounds' strength where no full search is run: on 64 GPUs the
    asked configuration's bound interval leaves out the configurations that cannot fit or
    are bounded slower, and names a best bound below its step."""
    prof = ProfileSet([analytic_profile(layers=32, hidden=4096, ffn=11008, heads=32,
                                        vocab=32000, seq=4096, batch=1)])
    hw = get_hardware("a100-80gb")
    req = Request(gpus=64, gpu_memory=hw.memory * 0.95, global_batch=512,
                  recompute=("none", "full"), schedules=("1f1b", "interleaved-1f1b"))
    config = parse_config("tp=8,pp=8,dp=1,sharding=ddp,mbs=1,schedule=1f1b,recompute=full", 64)
    mine = search(prof, replace(restrict(req, config), top=1), hw).plans[0]
    r = rank_by_bounds(prof, req, config, mine.step_time, hw)
    assert r.slower + r.cannot_fit > 0 and r.could_be_faster > 0
    assert r.best_bound < mine.step_time and r.high == r.low + r.could_be_faster
    assert r.priced == 8 and r.faster >= 1  # the lowest bounds priced: some beat it


# ---- the command line --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def free_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("bound_rank") / "tiny.json"
    analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, kv_heads=4, vocab=8192, seq=512,
                     batch=1).save(path)
    return str(path)


CLI = ["--gpus", "8", "--gpu", "h100-sxm", "--global-batch", "16", "--mbs", "1,2",
       "--schedules", "1f1b,interleaved-1f1b", "--max-chunks", "2"]


def test_the_command_states_the_rank_and_prints_the_configuration(free_profile, capsys):
    from pipebubble.cli import main

    cfg = "tp=2,pp=2,dp=2,sharding=ddp,mbs=1,schedule=1f1b,recompute=none"
    assert main(["plan", "--profile", free_profile, *CLI, "--config", cfg]) == 0
    text = " ".join(capsys.readouterr().out.split())  # wrapped at the terminal's width
    assert "--config priced on its own" in text and "full search considers" in text
    assert "--config: tp=2 sp cp=1 pp=2 dp=2 ddp 1f1b" in text or \
        "--config: tp=2 cp=1 pp=2 dp=2 ddp 1f1b" in text
    assert ("rank between #" in text and "for the exact rank" in text) or "rank: #" in text
    assert "pastes for --config (tp=2" in text and "fastest plans that fit" not in text
    assert "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" in text


def test_a_configuration_that_does_not_fit_is_said_so_without_a_search(free_profile, capsys):
    import json

    from pipebubble.cli import main

    assert main(["plan", "--profile", free_profile, *CLI, "--gpu-memory", "300MiB",
                 "--reserve", "0", "--config", "tp=1,pp=1,dp=8,sharding=ddp,mbs=2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"] == [] and out["config"]["fits"] is False
    assert out["config"]["rank"] is None and "does not fit" in out["config"]["rank_note"]


@pytest.mark.parametrize("argv, message", [
    (["--exact-rank"], "--exact-rank ranks a --config among the full search's plans; give "
     "--config K=V,... too"),
    (["--config", "tp=3"], "--config tp=3 = 3 GPUs does not divide --gpus 8"),
    (["--config", "pp=2,pp=2"], "--config gives pp twice"),
])
def test_bad_input_is_one_line(free_profile, capsys, argv, message):
    from pipebubble.cli import main

    assert main(["plan", "--profile", free_profile, *CLI, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
