"""Score one configuration of the planner: cut, price, bound, simulate.

:class:`Searcher` is one point's search (one (tp, sp, cp, sharding) of the request): it
lists the point's configurations and answers for a :class:`~pipebubble.plan.plans.Config`
the fastest plan that fits (:meth:`Searcher.evaluate`). It is composed of parts, each a
class of its own module with explicit inputs, each usable alone:

=================  ==========================================  ==========================
part               what it answers                              its inputs
=================  ==========================================  ==========================
``facts``          :class:`~.schedule_facts.ScheduleFacts`:     the search's cache
                   schedules, held microbatches, split or
                   fused backward, order-free shapes
``listing``        :class:`~.configs.Configs`: the point's      profiles, request, axes,
                   configurations and their first bound         point cache
``cuts``           :class:`~.cuts.Cuts`: where to cut (the      profiles, axes, search's
                   min-max cuts (a), the capped cut (b))        cache
``pricing``        :class:`~.cut_price.Pricing`: a cut's        axes, both caches, facts
                   per-stage costs and its lower bound
``memory``         :class:`~.memory_bounds.MemoryBounds`:       profiles, axes, both
                   fits or not, without timing                  caches, facts
``scorer``         :class:`~.cut_score.CutScorer`: a priced     profiles, request, axes,
                   cut simulated into a plan                    search's cache, pricing,
                                                                memory
``autos``          :class:`~.auto_plans.AutoPlans`: ``auto``,   profiles, axes, point
                   searched last and only where it can win      cache, facts, cuts,
                                                                pricing, scorer
``least``          :class:`~.least_memory.LeastMemory`: the     request, profiles, facts,
                   least budget, when nothing fits              cuts, memory, scorer, autos
=================  ==========================================  ==========================

Two caches (:mod:`~pipebubble.plan.search_cache`): the one
:class:`~.search_cache.SearchCache` every point's searcher of a search shares (what depends
on schedules and layer costs only), and the point's own :class:`~.search_cache.PointCache`
(what depends on its sharding), which its parts share.

The plan of a configuration is its fastest fitting cut among: every cut when there are at
most ``exhaustive_cuts``; else the (a) cuts that fit, or (b) when none does. Only true
bounds skip work: a cut whose price bound cannot beat ``threshold`` is never simulated, and
is looked at only to learn whether it fits (its memory, from the order alone), since a
fitting (a) cut, however slow, makes (b) not the plan. Before any of that
(:meth:`Searcher.surely_slow`): no cut beats the min-max cut's slowest stage, and when
every cut is scored and there are few, their bounds on the family's placement alone rule
the configuration out before its schedule is generated; cut (b) is ruled out by one
feasibility sweep when every capped cut has a stage slower than ``threshold``. Whatever is
skipped, the answer is the one simulating everything gives (``Request(prune=False)``;
tests/test_plan.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import combinations

from ..costs import fits_limit
from ..ir.schedule import Schedule
from ..schedules import lookup
from .auto_plans import AutoPlans
from .axes import Axes, Point
from .configs import Configs
from .cut_price import Pricing
from .cut_score import CutScorer
from .cuts import Cuts
from .families import placement_of
from .layercosts import ProfileSet
from .least_memory import LeastMemory
from .memory_bounds import MemoryBounds
from .network import Network
from .partition import ranges_from_ends
from .plans import Config, NoPlanFits, Plan, Request
from .schedule_facts import ScheduleFacts
from .search_cache import PointCache, SearchCache

__all__ = ["COSTLY", "SHAPE_CUTS", "PointCache", "SearchCache", "Searcher", "legacy_axes",
           "schedule_actions"]


SHAPE_CUTS = 16  # the most cuts priced to rule a configuration out before generating it
COSTLY = 2**17  # actions: a schedule with more is generated late (Searcher.costly)


def schedule_actions(c: Config) -> int:
    """The actions ``c``'s schedule will have, known before generating it: an F and a B (or
    an F, an I and a W where the family splits the backward) per microbatch and stage (at
    most, for DualPipe's families: an overlapped F&B pair is one action).

    >>> from dataclasses import replace
    >>> from pipebubble.plan.dims import ParallelDims
    >>> c = Config(ParallelDims(pp=4), 1, 8, "1f1b", 1, "none", 0.0)
    >>> schedule_actions(c), schedule_actions(replace(c, schedule="zb-h1"))
    (64, 96)
    """
    per = 3 if lookup(c.schedule).split_backward else 2
    return per * c.pp * c.microbatches * c.chunks


class Searcher:
    """One point's search: its configurations, and the plan of each (module doc).

    ``profiles`` and ``req`` are the search's; ``axes`` the point's (without it: the
    request's flat network at the default point, :func:`legacy_axes`); ``shared``: the
    search's :class:`SearchCache` (a fresh one when not given)."""

    def __init__(self, profiles: ProfileSet, req: Request, axes: Axes | None = None,
                 shared: SearchCache | None = None):
        self.p = profiles
        self.axes = axes or legacy_axes(req, Point())
        self.point = self.axes.point
        self.L = len(profiles)
        cache = self.cache = SearchCache() if shared is None else shared
        here = self.point_cache = PointCache()
        self.facts = ScheduleFacts(cache)
        self.listing = Configs(profiles, req, self.axes, here, cache)
        req = self.req = self.listing.req  # its recomputation modes settled
        self.gpus, self.names = self.listing.gpus, self.listing.names
        self.cuts = Cuts(profiles, self.axes, cache)
        self.pricing = Pricing(self.axes, cache, here, self.facts)
        self.memory = MemoryBounds(profiles, self.axes, cache, here, self.facts)
        self.scorer = CutScorer(profiles, req, self.axes, self.pricing, self.memory, cache)
        self.autos = AutoPlans(profiles, self.axes, here, self.facts, self.cuts, self.pricing,
                               self.scorer)
        self.least = LeastMemory(req, profiles, self.facts, self.cuts, self.memory,
                                 self.scorer, self.autos)
        self.why_not: dict[str, str] = cache.why_not

    # -- what the search asks of a point (plan/search.py, plan/bound_rank.py) --
    def configs(self) -> Iterator[Config]:
        """Every configuration of this point, with its bound (:meth:`Configs.configs`)."""
        return self.listing.configs()

    def estimate(self, c: Config) -> float:
        """The step estimate that orders the visit (:meth:`Configs.estimate`)."""
        return self.listing.estimate(c)

    def nothing_divides(self) -> str:
        """Why this point has no configuration (:meth:`Configs.nothing_divides`)."""
        return self.listing.nothing_divides()

    def no_fit(self, configs: list[Config]) -> NoPlanFits:
        """The least memory any of ``configs`` needs, as an error
        (:meth:`LeastMemory.no_fit`)."""
        return self.least.no_fit(configs)

    def auto_bound(self, c: Config) -> float:
        """The bound of auto's cut (:meth:`AutoPlans.bound`)."""
        return self.autos.bound(c)

    def stage_bound(self, c: Config, lc=None) -> float:
        """``m x`` the min-max cut's slowest stage (:meth:`Cuts.stage_bound`)."""
        return self.cuts.stage_bound(c, lc)

    def memory_floor(self, c: Config) -> float:
        """No plan of ``c`` holds less (:meth:`MemoryBounds.memory_floor`)."""
        return self.memory.memory_floor(c)

    def schedule(self, c: Config) -> Schedule | None:
        """The family's schedule of ``c`` (:meth:`ScheduleFacts.schedule`)."""
        return self.facts.schedule(c)

    def held(self, sched: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
        """Microbatches held per stage (:meth:`ScheduleFacts.held`)."""
        return self.facts.held(sched, until)

    @property
    def simulated(self) -> int:
        """Pipeline runs simulated for this point."""
        return self.scorer.simulated

    @property
    def auto_runs(self) -> int:
        """The automatic scheduler's searches for this point."""
        return self.autos.runs

    @property
    def auto_seconds(self) -> float:
        """Their wall seconds."""
        return self.autos.seconds

    def costly(self, c: Config) -> bool:
        """Whether ``c``'s schedule, not generated yet, would have over :data:`COSTLY` actions
        (:func:`schedule_actions`): the search then visits ``c`` late, when its threshold is
        tighter. Only an order, and one fixed by the request alone (never the clock), so a
        search does the same work on any machine and load."""
        if lookup(c.schedule).searched or self.facts.generated(c):
            return False
        return schedule_actions(c) > COSTLY

    # -- the plan of one configuration --
    def evaluate(self, c: Config, threshold: float, budget: float,
                 min_memory: bool = False) -> Plan | None:
        """The fastest fitting plan of ``c`` below ``threshold`` (None if none). With
        ``min_memory``: the plan that fits the least budget, whatever ``budget`` is."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        if lookup(c.schedule).searched:
            if min_memory:
                least = self.autos.least_budget(c)
                return None if least is None else self.autos.plan_at(c, least)
            return self.autos.evaluate(c, lc, threshold, budget)
        if threshold < math.inf and self.surely_slow(c, lc, threshold):
            return None  # no cut can beat threshold (its schedule not generated for it)
        memory = self.memory
        if not min_memory and not fits_limit(memory.weight_bound(c), budget):
            return None  # its weights alone do not fit (memory_bound below is never less)
        sched = self.facts.schedule(c)
        if sched is None:
            return None
        S_c = sched.num_stages // sched.chains
        if S_c > self.L:
            return None
        if min_memory:
            return self.least.plan_of(c, sched, lc, self.facts.held(sched))
        if math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts:
            return self._every_cut(c, sched, lc, threshold, budget)
        if not fits_limit(memory.memory_bound(c, sched), budget):
            return None  # no cut fits
        price, simulate = self.pricing.price, self.scorer.simulate
        pas = [price(c, sched, lc, cut) for cut in self.cuts.time_cuts(
            lc, c, S_c, sched.num_microbatches, sched.stage_to_rank)]
        fast = [pa for pa in pas if pa.bound < threshold]
        if not fast:
            # No (a) cut can win. The plan of c is the fastest (a) cut that fits (it cannot
            # enter the top K), or (b) when none fits: (b) is all that could still win.
            if any(memory.fits_surely(pa, sched, lc, budget) for pa in pas):
                return None
            if not self.cuts.capped_possible(lc, c, sched, self.facts.held(sched), budget):
                return None  # no (b) either
        else:  # simulate the (a) cuts that may win
            # whether a cut fits is known from its order alone (MemoryBounds.fits, what the
            # simulation reports): only the cuts that fit are simulated, and of those only
            # the ones whose order's floor (CutScorer.bound: long orders) beats threshold
            fitting = [pa for pa in fast if fits_limit(max(pa.static), budget)
                       and memory.fits(pa, sched, budget)]
            floor = self.scorer.bound
            fits = [p for p in (simulate(c, sched, pa, budget, math.inf) for pa in fitting
                                if floor(c, sched, pa, threshold) < threshold)
                    if p is not None]
            if fits:  # (a) fits: it is the plan of c
                best = min(fits, key=lambda p: p.step_time)
                best.cut_search = "min-max"
                return best if best.step_time < threshold else None
            if len(fitting) > len(fits):  # (a) fits, its floor at threshold or above
                return None
        # No (a) cut that may win fits. Of the others learn only whether they fit (from
        # their order's memory, not simulated): if one does, it is the plan, and too slow.
        if any(fits_limit(max(pa.static), budget) and memory.fits(pa, sched, budget)
               for pa in pas if pa.bound >= threshold):
            return None
        return self._capped_plan(c, sched, lc, threshold, budget)

    def surely_slow(self, c: Config, lc, threshold: float) -> bool:
        """Whether no cut of ``c`` can beat ``threshold``, known without its schedule (for a
        family of known placement, :func:`~pipebubble.plan.families.placement_of`):

        - every cut has a stage that costs at least the min-max cut's slowest (the
          partition is exact), and a rank works at least its stage: at least ``threshold``
          (:meth:`Cuts.stage_bound`);
        - or, when every cut is scored and there are few and the schedule is not generated
          yet, each cut's bound on the placement alone (W taken as split: a bound for
          either) is at least ``threshold``."""
        placement = placement_of(c.schedule)
        S_c = c.pp * c.chunks
        if placement is None or S_c > self.L:
            return False
        if self.cuts.stage_bound(c, lc) >= threshold:
            return True
        if (self.facts.generated(c)
                or math.comb(self.L - 1, S_c - 1) > min(self.req.exhaustive_cuts, SHAPE_CUTS)):
            return False
        shape = self.facts.shape(c, placement)
        return all(self.pricing.price(c, shape, lc, ranges_from_ends([*ends, self.L]),
                                      split=True).bound >= threshold
                   for ends in combinations(range(1, self.L), S_c - 1))

    def _capped_plan(self, c, sched, lc, threshold, budget) -> Plan | None:
        """Cut (b)'s plan, if (b) exists, fits and beats ``threshold``."""
        cut_b = self.cuts.capped_cut(lc, c, sched, self.facts.held(sched), budget, threshold)
        if cut_b is None:
            return None
        plan = self.scorer.score(c, sched, lc, cut_b, threshold, budget)
        if plan is not None:
            plan.cut_search = "min-max-capped"
        return plan

    def _every_cut(self, c, sched, lc, threshold, budget) -> Plan | None:
        """Few cuts: every one scored, the fastest that fits below ``threshold``."""
        if not fits_limit(self.memory.memory_bound(c, sched), budget):
            return None
        S_c = sched.num_stages // sched.chains
        best = None
        for ends in combinations(range(1, self.L), S_c - 1):
            p = self.scorer.score(c, sched, lc, ranges_from_ends([*ends, self.L]), threshold,
                                  budget)
            if p is not None and (best is None or p.step_time < best.step_time):
                best, threshold = p, min(threshold, p.step_time)
        return best


def legacy_axes(req: Request, point: Point) -> Axes:
    """The axes without ``--gpu``: one-level network (``--allreduce-bandwidth``), every hop on
    ``--p2p-bandwidth``; model states ``req.model_states()`` (memory.py)."""
    return Axes(point, Network.flat(req.allreduce_bandwidth, req.latency),
                req.model_states(), req.grad_bytes,
                p2p=(req.p2p_bandwidth, req.latency), reshard=req.fsdp_reshard,
                dp_overlap=req.dp_overlap)
