"""The search's listing (plan/search.py Listed): every configuration each point lists, in
the order of their estimates (ties in listing order), with a Config made only on demand;
and the garbage collector paused for the search and restored after it."""

from __future__ import annotations

import gc

from pipebubble.plan.axes import Point
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.plans import Request
from pipebubble.plan.profile import Profile
from pipebubble.plan.scoring import SearchCache, Searcher, legacy_axes
from pipebubble.plan.search import Listed, collector_paused, search_points
from pipebubble.plan.shardings import Sharding
from pipebubble.schedules import lookup


def toy(layers: int) -> ProfileSet:
    return ProfileSet([Profile.from_dict({"batch": 1, "layers": [
        {"name": f"l{i}", "forward": 1.0 + i % 3, "backward": 2.0, "params": 10,
         "activation_bytes": 5, "flops": 0} for i in range(layers)]})])


def searchers(prof: ProfileSet, req: Request) -> list[Searcher]:
    shared = SearchCache()
    return [Searcher(prof, req, legacy_axes(req, Point(sharding=s)), shared)
            for s in (Sharding.DDP, Sharding.ZERO1)]


REQ = Request(gpus=8, gpu_memory=1e12, global_batch=32, microbatch_sizes=(1, 2),
              recompute=("none",), latency=0, max_chunks=2)


def test_listed_holds_every_configuration_in_the_estimate_order():
    prof = toy(8)
    ss = searchers(prof, REQ)
    every = [(c, s) for s in ss for c in s.configs()]
    families = [(c, s) for c, s in every if not lookup(c.schedule).searched]
    expected = sorted(families, key=lambda cs: cs[1].estimate(cs[0]))  # stable: ties listed
    listed = Listed(searchers(prof, REQ))
    assert len(listed.estimates) == len(families) > 50
    got = [listed.config(j) for j in listed.estimates.argsort(kind="stable").tolist()]
    assert [c for c, _ in got] == [c for c, _ in expected]
    assert [s.point for _, s in got] == [s.point for _, s in expected]
    assert [c.bound for c, _ in got] == [c.bound for c, _ in expected]
    assert listed.bounds.tolist() == [c.bound for c, _ in families]
    autos = [c for c, s in every if lookup(c.schedule).searched]
    assert [c for c, _ in listed.autos] == autos and autos


def test_the_points_of_one_layer_cost_object_share_their_sums_but_not_their_bounds():
    prof = toy(8)
    ddp, zero1 = searchers(prof, REQ)
    list(ddp.configs()), list(zero1.configs())
    assert ddp.listing._layer_sums is zero1.listing._layer_sums
    assert ddp.listing._config_bounds is not zero1.listing._config_bounds


def test_the_collector_is_paused_in_the_search_and_restored_after():
    seen = []
    prof = toy(4)
    pts = [(s.point, prof, s.axes) for s in searchers(prof, REQ)]

    def keep(plan) -> bool:
        seen.append(gc.isenabled())
        return True

    assert gc.isenabled()
    search_points(pts, REQ, keep)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:  # off before: still off after
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
