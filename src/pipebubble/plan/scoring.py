"""Score one configuration of the planner: cut, price, bound, simulate.

:class:`Searcher` holds what one search shares (the profile, the request, generated
schedules, cuts, priced cuts) and answers for a :class:`~pipebubble.plan.plans.Config` the
fastest plan that fits (:meth:`Searcher.evaluate`). Each concept lives in its own module
and is a part of the Searcher:

- :mod:`~pipebubble.plan.configs`: the configurations of a point and their first bound;
- :mod:`~pipebubble.plan.cuts`: where to cut (the min-max cuts (a), the capped cut (b));
- :mod:`~pipebubble.plan.cut_price`: a cut's per-stage costs and its lower bound;
- :mod:`~pipebubble.plan.memory_bounds`: fits or not, without timing (the order's peaks);
- :mod:`~pipebubble.plan.auto_plans`: ``auto``, searched last and only where it can win;
- :mod:`~pipebubble.plan.least_memory`: the least budget, when nothing fits.

The plan of a configuration is its fastest fitting cut among: every cut when there are at
most ``exhaustive_cuts``; else the (a) cuts that fit, or (b) when none does. Only true
bounds skip work: a cut whose price bound cannot beat ``threshold`` is never simulated, and
is looked at only to learn whether it fits (its memory, from the order alone), since a
fitting (a) cut, however slow, makes (b) not the plan. Before any of that
(:meth:`Searcher._surely_slow`): no cut beats the min-max cut's slowest stage, and when
every cut is scored and there are few, their bounds on the family's placement alone rule
the configuration out before its schedule is generated; cut (b) is ruled out by one
feasibility sweep when every capped cut has a stage slower than ``threshold``. Whatever is
skipped, the answer is the one simulating everything gives (``Request(prune=False)``;
tests/test_plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import combinations

from ..costs import fits_limit
from ..errors import UserError, marked, param
from ..ir.schedule import Schedule, ScheduleError, make_schedule
from ..schedules import get_schedule, lookup
from .auto_plans import AutoPlans
from .axes import Axes, Point
from .configs import Configs
from .cut_price import Pricing
from .cuts import Cuts
from .families import placement_of, schedule_list
from .layercosts import ProfileSet
from .least_memory import LeastMemory
from .memory_bounds import MemoryBounds
from .network import Network
from .partition import min_max_partition, ranges_from_ends
from .pipeline_axis import run_pipeline
from .plans import Config, Plan, Priced, Request


@dataclass
class SearchCache:
    """What the searchers of one search (one per point) share: what depends on the schedule
    or the layer costs only, not on the point's sharding. One object, passed to each
    :class:`Searcher`; entries keyed by a schedule or layer-cost object's ``id`` keep that
    object beside the value and are checked against it (an id is reused once its object
    dies)."""

    schedules: dict = field(default_factory=dict)  # (family, pp, m, v) -> Schedule | None
    held: dict = field(default_factory=dict)  # per schedule: microbatches held per stage
    split: dict = field(default_factory=dict)  # per schedule: split / fused backward
    peaks: dict = field(default_factory=dict)  # per order and stage memory: simulated peaks
    ranks: dict = field(default_factory=dict)
    prefixes: dict = field(default_factory=dict)  # per layer costs: prefix sums
    sums: dict = field(default_factory=dict)
    why_not: dict = field(default_factory=dict)  # "family pp=N" -> why it has no schedule
    # The pipeline's timeline depends on the schedule and the stage costs only: points that
    # differ in sharding alone (same layers, same cut) share their simulations.
    runs: dict = field(default_factory=dict)
    # Orders-free schedules of a placement (pp, m, stages): bounds before generating.
    shapes: dict = field(default_factory=dict)
    # Cuts (a) depend on the layer costs only: per layer-cost object (the shardings of one
    # (tp, sp, cp) share it), the object and its cuts.
    cuts: dict = field(default_factory=dict)

    def cuts_of(self, profiles) -> dict:
        """The cut cache of ``profiles`` (kept beside it: never another object's)."""
        got = self.cuts.get(id(profiles))
        if got is None or got[0] is not profiles:
            got = self.cuts[id(profiles)] = (profiles, {})
        return got[1]


SHAPE_CUTS = 16  # the most cuts priced to rule a configuration out before generating it
COSTLY = 2**17  # actions: a schedule with more is generated late (Searcher.costly)


def schedule_actions(c: Config) -> int:
    """The actions ``c``'s schedule will have, known before generating it: an F and a B (or
    an F, an I and a W where the family splits the backward) per microbatch and stage (at
    most, for DualPipe's families: an overlapped F&B pair is one action).

    >>> from pipebubble.plan.dims import ParallelDims
    >>> c = Config(ParallelDims(pp=4), 1, 8, "1f1b", 1, "none", 0.0)
    >>> schedule_actions(c), schedule_actions(replace(c, schedule="zb-h1"))
    (64, 96)
    """
    per = 3 if lookup(c.schedule).split_backward else 2
    return per * c.pp * c.microbatches * c.chunks


class Searcher(Configs, Cuts, Pricing, MemoryBounds, AutoPlans, LeastMemory):
    """One search: the configurations of a request, and the plan of each (module doc)."""

    def __init__(self, profiles: ProfileSet, req: Request, axes: Axes | None = None,
                 shared: SearchCache | None = None):
        self.p, self.req = profiles, req
        self.axes = axes or legacy_axes(req, Point())
        self.point = self.axes.point
        self.gpus = req.gpus // self.point.dims.model_parallel  # pipeline x data parallel
        self.L = len(profiles)
        self.names = schedule_list(req.schedules)
        modes = profiles.recompute_modes()
        if req.recompute is None:
            req = self.req = replace(req, recompute=("none", "full") if "full" in modes
                                     else ("none",))
        for r in req.recompute:
            if r not in ("none", "selective", "full"):
                raise UserError(f"unknown {param('recompute')} {r!r}; valid are none, selective, "
                                "full")
            if r not in modes:
                profiles.at(1, r)  # raises the profile's message
        self.simulated = 0
        self.auto_runs, self.auto_seconds = 0, 0.0  # the automatic scheduler's searches
        # Shared by the searchers of one search (one per point): SearchCache.
        cache = self.cache = SearchCache() if shared is None else shared
        self._schedules: dict[tuple, Schedule | None] = cache.schedules
        self._held, self._split = cache.held, cache.split
        self._peaks, self._ranks = cache.peaks, cache.ranks
        self._prefixes, self._sums = cache.prefixes, cache.sums
        self.why_not: dict[str, str] = cache.why_not
        self._runs: dict[tuple, tuple[Schedule, object]] = cache.runs
        self._shapes: dict[tuple, Schedule] = cache.shapes
        self._cuts: dict[tuple, list] = cache.cuts_of(profiles)
        # This point's sharding: the data-parallel traffic and the costs that carry it.
        self._sync_times: dict[tuple, tuple[float, float]] = {}
        self._exposures: dict[tuple, float] = {}
        self._stage_costs: dict[tuple, tuple] = {}
        self._tails: dict[tuple, tuple] = {}  # per (stage costs, placement): Pricing._price
        self._auto_cuts: dict[tuple, tuple] = {}

    def schedule(self, c: Config) -> Schedule | None:
        """The family's schedule of ``c`` (generated once per search), None if it has none."""
        key = (c.schedule, c.pp, c.microbatches, c.chunks)
        if key not in self._schedules:
            try:
                self._schedules[key] = get_schedule(c.schedule, c.pp, c.microbatches, c.chunks)
            except ScheduleError as exc:
                self._schedules[key] = None
                self.why_not.setdefault(f"{c.schedule} pp={c.pp}", marked(exc))
        return self._schedules[key]

    def costly(self, c: Config) -> bool:
        """Whether ``c``'s schedule, not generated yet, would have over :data:`COSTLY` actions
        (:func:`schedule_actions`): the search then visits ``c`` late, when its threshold is
        tighter. Only an order, and one fixed by the request alone (never the clock), so a
        search does the same work on any machine and load."""
        if lookup(c.schedule).searched or (c.schedule, c.pp, c.microbatches,
                                           c.chunks) in self._schedules:
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
                least = self.least_auto_budget(c)
                return None if least is None else self.auto_plan_at(c, least)
            return self._evaluate_auto(c, lc, threshold, budget)
        if threshold < math.inf and self._surely_slow(c, lc, threshold):
            return None  # no cut can beat threshold (its schedule not generated for it)
        if not min_memory and not fits_limit(self._memory_bound(c), budget):
            return None  # its weights alone do not fit (memory_bound below is never less)
        sched = self.schedule(c)
        if sched is None:
            return None
        S_c = sched.num_stages // sched.chains
        if S_c > self.L:
            return None
        if min_memory:
            return self._least_memory_plan(c, sched, lc, self.held(sched))
        if math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts:
            return self._every_cut(c, sched, lc, threshold, budget)
        if not fits_limit(self.memory_bound(c, sched), budget):
            return None  # no cut fits
        pas = [self._price(c, sched, lc, cut) for cut in self._time_cuts(
            lc, c, S_c, sched.num_microbatches, sched.stage_to_rank)]
        fast = [pa for pa in pas if pa.bound < threshold]
        if not fast:
            # No (a) cut can win. The plan of c is the fastest (a) cut that fits (it cannot
            # enter the top K), or (b) when none fits: (b) is all that could still win.
            if any(self._fits_surely(pa, sched, lc, budget) for pa in pas):
                return None
            if not self.capped_possible(lc, c, sched, self.held(sched), budget):
                return None  # no (b) either
        else:  # simulate the (a) cuts that may win
            # whether a cut fits is known from its order alone (MemoryBounds.fits, what the
            # simulation reports): only the cuts that fit are simulated
            fits = [p for p in (self._simulate(c, sched, pa, budget, math.inf)
                                for pa in fast if fits_limit(max(pa.static), budget)
                                and self.fits(pa, sched, budget)) if p is not None]
            if fits:  # (a) fits: it is the plan of c
                best = min(fits, key=lambda p: p.step_time)
                best.cut_search = "min-max"
                return best if best.step_time < threshold else None
        # No (a) cut that may win fits. Of the others learn only whether they fit (from
        # their order's memory, not simulated): if one does, it is the plan, and too slow.
        if any(fits_limit(max(pa.static), budget) and self.fits(pa, sched, budget)
               for pa in pas if pa.bound >= threshold):
            return None
        return self._capped_plan(c, sched, lc, threshold, budget)

    def _surely_slow(self, c: Config, lc, threshold: float) -> bool:
        """Whether no cut of ``c`` can beat ``threshold``, known without its schedule (for a
        family of known placement, :func:`~pipebubble.plan.families.placement_of`):

        - every cut has a stage that costs at least the min-max cut's slowest (the
          partition is exact), and a rank works at least its stage: at least ``threshold``;
        - or, when every cut is scored and there are few and the schedule is not generated
          yet, each cut's bound on the placement alone (W taken as split: a bound for
          either) is at least ``threshold``."""
        placement = placement_of(c.schedule)
        S_c = c.pp * c.chunks
        if placement is None or S_c > self.L:
            return False
        if self.stage_bound(c, lc) >= threshold:
            return True
        if ((c.schedule, c.pp, c.microbatches, c.chunks) in self._schedules
                or math.comb(self.L - 1, S_c - 1) > min(self.req.exhaustive_cuts, SHAPE_CUTS)):
            return False
        shape = self._shape(c, placement)
        return all(self._price(c, shape, lc, ranges_from_ends([*ends, self.L]),
                               split=True).bound >= threshold
                   for ends in combinations(range(1, self.L), S_c - 1))

    def stage_bound(self, c: Config, lc=None) -> float:
        """No cut of ``c`` takes less than ``m x`` the min-max cut's slowest stage (every
        cut has a stage at least that slow, and its rank works it m times): the first test
        of :meth:`_surely_slow`, also what ``plan --config`` ranks with
        (:mod:`~pipebubble.plan.bound_rank`). 0.0 where the placement is not known before
        generating (``auto``, DualPipe) or the stages outnumber the layers."""
        S_c = c.pp * c.chunks
        if placement_of(c.schedule) is None or S_c > self.L:
            return 0.0
        key = ("slowest stage", c.microbatch_size, c.recompute, S_c)
        slowest = self._cuts.get(key)
        if slowest is None:
            if lc is None:
                lc = self.p.at(c.microbatch_size, c.recompute)
            work = self.cut_costs(lc, c, 1)  # the very cut (a) starts from
            slowest = self._cuts[key] = max(float(work[a:b + 1].sum()) for a, b in
                                            min_max_partition(work, S_c))
        return c.microbatches * slowest * (1 - 1e-9)

    def _shape(self, c: Config, placement: str) -> Schedule:
        """A schedule with ``c``'s ranks, stages, microbatches and ``placement`` and no
        orders: what a cut's price needs of it (once per search)."""
        key = (c.pp, c.microbatches, c.pp * c.chunks, placement)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = make_schedule("shape", [()] * c.pp, c.pp * c.chunks,
                                                      c.microbatches, placement=placement)
        return shape

    def _capped_plan(self, c, sched, lc, threshold, budget) -> Plan | None:
        """Cut (b)'s plan, if (b) exists, fits and beats ``threshold``."""
        cut_b = self._capped_cut(lc, c, sched, self.held(sched), budget, threshold)
        if cut_b is None:
            return None
        plan = self._score(c, sched, lc, cut_b, threshold, budget)
        if plan is not None:
            plan.cut_search = "min-max-capped"
        return plan

    def _every_cut(self, c, sched, lc, threshold, budget) -> Plan | None:
        """Few cuts: every one scored, the fastest that fits below ``threshold``."""
        if not fits_limit(self.memory_bound(c, sched), budget):
            return None
        held = self.held(sched)
        S_c = sched.num_stages // sched.chains
        best = None
        for ends in combinations(range(1, self.L), S_c - 1):
            p = self._score(c, sched, lc, ranges_from_ends([*ends, self.L]), threshold,
                            budget, held)
            if p is not None and (best is None or p.step_time < best.step_time):
                best, threshold = p, min(threshold, p.step_time)
        return best

    def _score(self, c, sched, lc, ranges, threshold, budget, held=None) -> Plan | None:
        """The cut's plan if it fits ``budget`` and beats ``threshold``, else None."""
        pr = self._price(c, sched, lc, ranges)
        if (pr.bound >= threshold or not fits_limit(max(pr.static), budget)
                or not self.fits(pr, sched, budget)):
            return None
        return self._simulate(c, sched, pr, budget, threshold)

    def _step(self, c: Config, sched: Schedule, pr: Priced) -> tuple[object, list, float]:
        """The cut's pipeline run (simulated once per schedule and stage costs), each rank's
        optimizer step and the plan's step time (:meth:`_simulate`), memory aside."""
        co = pr.costs
        key = (id(sched), tuple(co.f), tuple(co.b), tuple(co.w), co.comm,
               tuple(co.activation_memory), tuple(co.weight_memory),
               tuple(co.i_extra) if isinstance(co.i_extra, list) else co.i_extra,
               tuple(co.a2a_f) if isinstance(co.a2a_f, list) else co.a2a_f,
               tuple(co.a2a_b) if isinstance(co.a2a_b, list) else co.a2a_b)
        got = self._runs.get(key)
        if got is None or got[0] is not sched:
            self.simulated += 1
            got = self._runs[key] = (sched, run_pipeline(sched, co))
        run = got[1]
        opt = [self._rank_optimizer(c, P, E) for P, E in zip(  # optimizer.py
            pr.rank_params, pr.rank_expert or [0.0] * len(pr.rank_params), strict=True)]
        step = float(max(e + x + o for e, x, o in zip(run.rank_end, pr.exposed, opt,
                                                       strict=True)))
        return run, opt, step

    def _simulate(self, c: Config, sched: Schedule, pr: Priced, budget: float,
                  threshold: float) -> Plan | None:
        """Simulate the cut (:func:`~pipebubble.plan.pipeline_axis.run_pipeline`): step time =
        ``max_r (end_r + exposed data-parallel traffic_r + optimizer step_r)``, peak per
        rank = static + the simulated activation peak. None unless it fits ``budget`` and
        beats ``threshold``."""
        run, opt, step = self._step(c, sched, pr)
        peaks = [float(x + a) for x, a in zip(pr.static, run.peak_activations, strict=True)]
        if step >= threshold or not all(fits_limit(x, budget) for x in peaks):
            return None
        where = sched.stage_to_rank
        ar = max((sum(pr.costs.allreduce[s] for s, r in enumerate(where) if r == k)
                  for k in range(c.pp)), default=0.0) if c.dims.data_context > 1 else 0.0
        plan = Plan(c, pr.ranges, tuple(where), step, run.step_time, run.bubble_fraction,
                    peaks, ar, pr.costs.comm, pr.costs, sched, self.req.global_batch)
        plan.dp_exposed = max(pr.exposed, default=0.0)
        plan.optimizer_time = max(opt, default=0.0)
        plan.static = list(pr.static)
        w, g, o = self.axes.state_bytes
        n = max(self.axes.shard(c.dp), 1)
        keep = self.axes.keeps_weights(c.pp)
        sh_w, sh_g, sh_o = c.sharding.sharded(keep)  # shardings.Sharding: 1 / n of these
        fsdp = sh_w  # weights sharded: gathered per microbatch, the layers in flight
        if c.sharding.shards_params:
            plan.fsdp_reshard = "never" if keep else "always"
        gathered = self._gathered(c, self.p.at(c.microbatch_size, c.recompute), sched,
                                  pr.ranges) if fsdp else None
        n_e = n if c.sharding.hybrid else max(c.dims.expert_data_parallel, 1)  # plan/expert
        for r in range(c.pp):
            E = pr.rank_expert[r] if pr.rank_expert else 0.0
            P = pr.rank_params[r] - E
            states = {"weights": w * P / (n if sh_w else 1) + w * E / (n_e if sh_w else 1),
                      "gradients": g * P / (n if sh_g else 1) + g * E / (n_e if sh_g else 1),
                      "optimizer": o * P / (n if sh_o else 1) + o * E / (n_e if sh_o else 1)}
            if gathered is not None:  # FSDP resharded always: the layers in flight
                states["gathered_layers"] = gathered[r]
            states["recompute_transient"] = pr.static[r] - sum(states.values())
            states["activations"] = run.peak_activations[r]
            plan.memory.append({k: float(v) for k, v in states.items()})
        return plan


def legacy_axes(req: Request, point: Point) -> Axes:
    """The axes without ``--gpu``: one-level network (``--allreduce-bandwidth``), every hop on
    ``--p2p-bandwidth``; model states ``req.model_states()`` (memory.py)."""
    return Axes(point, Network.flat(req.allreduce_bandwidth, req.latency),
                req.model_states(), req.grad_bytes,
                p2p=(req.p2p_bandwidth, req.latency), reshard=req.fsdp_reshard,
                dp_overlap=req.dp_overlap)
