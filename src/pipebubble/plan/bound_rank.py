"""Where ``plan --config`` ranks, from lower bounds alone: no full search.

The asked configuration is priced exactly on its own (the search restricted to it,
:func:`pipebubble.plan.config.restrict`: the same plan, step and memory the full search
gives it). Every *other* configuration the full search would consider
(:meth:`~pipebubble.plan.configs.Configs.configs` at every point of
:func:`~pipebubble.plan.planner.build_points`) is only bounded, with the bounds the search
prunes with, each true for every cut and order:

- its step is at least :meth:`~pipebubble.plan.configs.Configs.config_bound` (the mean rank,
  one microbatch's way through) and, where the placement is known, ``m x`` the min-max cut's
  slowest stage (:meth:`~pipebubble.plan.cuts.Cuts.stage_bound`);
- it fits nowhere when its weights spread evenly over the ranks
  (:meth:`~pipebubble.plan.memory_bounds.MemoryBounds.weight_bound`) exceed the budget.

A configuration whose bound is at or above the asked one's step, or that cannot fit, is
certainly not faster; the others *could* be. The few of them with the lowest bounds
(:data:`PRICE`, one schedule per split of the GPUs, microbatch size and recomputation, not
``auto``, within :data:`PRICE_UNITS` microbatch-stages in all) are priced exactly, as the
full search prices them
(:meth:`~pipebubble.plan.scoring.Searcher.evaluate`): each is then faster, slower or does
not fit. The search gives each configuration at most one plan, so the asked
configuration's rank in the full search (1 + the plans strictly faster, as ``plan`` counts
it) lies between 1 + those priced faster and 1 + those plus the ones that could still be.
The configurations of the restricted search itself are never faster (it returned the
fastest of them). ``tests/test_plan_bound_rank.py`` runs the full search on small cases and
checks the true rank lies in the interval. All counts are of work, never of the clock: the
same answer on any machine.

Two configurations on 2 GPUs, four equal layers (F = 1 s, B = 2 s): pp = 1 (m = 2) runs
in 24 s, pp = 2 (m = 4) in 30 s. Asked for pp = 2, the other's bound (its mean rank, 24 s) is
below 30 s, so it could be faster: rank #1 or #2 from the bounds alone, #2 once it is
priced. Asked for pp = 1, the other's bound (24 s of mean work and 0.5 s of mean fill) is
above 24 s: #1.

>>> from pipebubble.plan.layercosts import ProfileSet
>>> from pipebubble.plan.plans import Request
>>> from pipebubble.plan.profile import Profile
>>> layer = {"forward": 1, "backward": 2, "params": 0, "activation_bytes": 0, "flops": 0}
>>> prof = ProfileSet([Profile.from_dict({"batch": 1, "layers": [{"name": str(i), **layer}
...                                                              for i in range(4)]})])
>>> req = Request(gpus=2, gpu_memory=1, global_batch=4, microbatch_sizes=(1,),
...               schedules=("1f1b",), recompute=("none",), latency=0, shardings=("ddp",))
>>> r = rank_by_bounds(prof, req, {"pp": 2}, 30.0, price=0)
>>> (r.considered, r.own, r.could_be_faster, r.low, r.high, r.best_bound)
(2, 1, 1, 1, 2, 24.0)
>>> r = rank_by_bounds(prof, req, {"pp": 2}, 30.0)
>>> (r.priced, r.faster, r.low, r.high, r.fastest.step_time)
(1, 1, 2, 2, 24.0)
>>> r = rank_by_bounds(prof, req, {"pp": 1}, 24.0)
>>> (r.could_be_faster, r.slower, r.exact)
(0, 1, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..costs import fits_limit
from ..schedules import lookup
from .axes import Point
from .plans import Config, Plan, Request
from .shardings import Sharding

FASTER = 1 - 1e-12  # "faster" as plan counts it: a step below the asked one's x FASTER
PRICE = 8  # the configurations of lowest bound priced exactly, at most
PRICE_UNITS = 1 << 15  # ... within this many microbatch-stages (pp x m x chunks) in all


@dataclass(frozen=True)
class BoundRank:
    """The asked configuration's rank interval (module doc)."""

    step: float  # the asked configuration's priced step (seconds)
    considered: int  # configurations the full search would consider, the asked ones included
    own: int  # of them, the restricted search's (the asked configuration's): never faster
    could_be_faster: int  # not priced, and their lower bound is below ``step``
    slower: int  # bounded at or above ``step``, or priced and not faster
    cannot_fit: int  # their memory lower bound is above the budget, or priced: none fits
    best_bound: float | None  # the least lower bound of those that could be faster
    best: Config | None  # the configuration with that bound
    seconds: float  # the time the bounds took
    faster: int = 0  # priced (the lowest bounds first, :data:`PRICE`) and faster
    fastest: Plan | None = None  # the fastest of those
    priced: int = 0  # configurations priced exactly
    not_run: int = 0  # left out: the framework surely does not run them (``may_count``)

    @property
    def low(self) -> int:
        """The best rank it may have: behind the configurations priced and faster."""
        return 1 + self.faster

    @property
    def high(self) -> int:
        """The worst rank it may have: behind every configuration that could be faster."""
        return 1 + self.faster + self.could_be_faster

    @property
    def exact(self) -> bool:
        """Whether the interval is one rank."""
        return self.low == self.high

    def as_json(self) -> dict:
        return {"low": self.low, "high": self.high, "considered": self.considered,
                "own": self.own, "faster": self.faster, "priced": self.priced,
                "could_be_faster": self.could_be_faster, "slower": self.slower,
                "cannot_fit": self.cannot_fit, "not_run": self.not_run,
                "best_bound": self.best_bound,
                "best_bound_vs_step": (self.best_bound / self.step - 1
                                       if self.best_bound is not None and self.step > 0
                                       else None),
                "fastest_step": self.fastest.step_time if self.fastest else None,
                "seconds": self.seconds}


PIPE_KEYS = {"pp": "pp", "dp": "dp", "mbs": "microbatch_size", "v": "chunks",
             "schedule": "schedule", "recompute": "recompute"}  # --config key: Config field


def _point_matches(tp: int, cp: int, sp: bool, ep: int, sharding: Sharding, config: dict,
                   etp: int | None = None) -> bool:
    if "sharding" in config and sharding is not Sharding.of(config["sharding"]):
        return False
    got = {"tp": tp, "cp": cp, "sp": sp, "ep": ep, "etp": tp if etp is None else etp}
    return all(got[k] == config[k] for k in got if k in config)


def point_matches(pt: Point, config: dict) -> bool:
    """Whether a point (tp, sp, cp, ep, sharding) is one ``config`` (``plan --config``'s
    dict, :func:`~pipebubble.plan.config.parse_config`) allows."""
    return _point_matches(pt.tp, pt.cp, pt.sp, pt.ep, pt.sharding, config, pt.etp)


def matches(c: Config, config: dict) -> bool:
    """Whether ``c`` is one of the configurations ``config`` restricts the search to."""
    return _point_matches(c.tp, c.cp, c.sp, c.dims.ep, c.sharding, config, c.dims.etp) and all(
        getattr(c, f) == config[k] for k, f in PIPE_KEYS.items() if k in config)


def rank_by_bounds(profiles, req: Request, config: dict, step: float, hardware=None,
                   efficiency: float | None = None, mfu: float | None = None,
                   may_count: Callable[[Config], bool] | None = None, price: int = PRICE,
                   ranks: Callable[[Plan], bool] | None = None) -> BoundRank:
    """The rank interval of a configuration priced at ``step`` among every configuration
    the full search of ``req`` considers (module doc); ``may_count``: False for a
    configuration that cannot be in the ranking's pool (one the framework surely does not
    run), left out of the count (kept: every configuration); ``ranks``: whether a priced
    plan is in that pool (the framework runs it: :func:`~pipebubble.plan.frameworks.blocker`
    says none); ``price``: how many of the lowest bounds to price exactly."""
    from .planner import build_points
    from .scoring import SearchCache, Searcher

    t0 = time.perf_counter()
    below = step * FASTER
    cache = SearchCache()
    considered = own = slower = no_fit = not_run = 0
    open_: list[tuple[float, Config, Searcher]] = []  # could be faster, by config bound
    chains: dict[str, int] = {}
    for _, costs, axes in build_points(profiles, req, hardware, efficiency, mfu):
        s = Searcher(costs, req, axes, cache)
        weights: dict[tuple, float] = {}  # the memory bound, once per what it depends on
        pipe = [(f, config[k]) for k, f in PIPE_KEYS.items() if k in config]
        here = point_matches(s.point, config)
        for c in s.configs():
            considered += 1
            if here and all(getattr(c, f) == v for f, v in pipe):  # matches(c, config)
                own += 1
                continue
            if may_count is not None and not may_count(c):
                not_run += 1  # not in the pool: not ranked against
                continue
            if c.bound >= below:
                slower += 1
                continue
            ch = chains.get(c.schedule)
            if ch is None:
                ch = chains[c.schedule] = lookup(c.schedule).chains
            key = (c.microbatch_size, c.recompute, c.dp, c.pp, ch)
            need = weights.get(key)
            if need is None:
                need = weights[key] = s.memory_floor(c)
            if not fits_limit(need, req.gpu_memory):
                no_fit += 1
                continue
            open_.append((c.bound, c, s))
    # The least bound of those left, with the slowest-stage bound too: refined lowest
    # first, until no unrefined one's bound is below the best refined.
    open_.sort(key=lambda x: x[0])
    best, left = math.inf, []
    for bound, c, s in open_:
        if bound < best:
            bound = max(bound, s.stage_bound(c))
            best = min(best, bound)
        left.append((bound, c, s))
    left = [x for x in left if x[0] < below]
    slower += len(open_) - len(left)  # a refined bound reached the step
    # The few with the lowest bounds are priced exactly (the plan the full search gives
    # them), within a counted budget: each is then faster, slower or does not fit.
    left.sort(key=lambda x: x[0])
    faster, fastest, priced, work, rest, tried = 0, None, 0, 0, [], set()
    for bound, c, s in left:
        units = c.pp * c.microbatches * c.chunks
        group = (id(s), c.pp, c.dp, c.microbatch_size, c.recompute)
        if (priced >= price or lookup(c.schedule).searched or work + units > PRICE_UNITS
                or group in tried):  # one schedule per split: its siblings often fail alike
            rest.append((bound, c))
            continue
        priced, work = priced + 1, work + units
        tried.add(group)
        plan = s.evaluate(c, math.inf, req.gpu_memory)
        if plan is None:
            no_fit += 1
        elif ranks is not None and not ranks(plan):
            not_run += 1  # priced, but not in the pool (the framework does not run it)
        elif plan.step_time < below:
            faster += 1
            if fastest is None or plan.step_time < fastest.step_time:
                fastest = plan
        else:
            slower += 1
    best_bound, best_c = min(rest, key=lambda x: x[0], default=(None, None))
    return BoundRank(step, considered, own, len(rest), slower, no_fit, best_bound, best_c,
                     time.perf_counter() - t0, faster, fastest, priced, not_run)
