"""``auto`` as a configuration of the planner: the automatic scheduler's order
(:func:`~pipebubble.schedules.auto.auto_schedule`) for the min-max cut into ``pp`` stages
(loop placement, chunks 1) or ``2 pp`` (V placement, chunks 2), given each rank's memory
left after its weights, gradients, optimizer state and recomputation transient.

The scheduler searches orders (seconds for a large pipeline), so it runs last and only
where it can win: the cut is priced first, and the bound of that price (true for every order
of the cut, :mod:`~pipebubble.plan.cut_price`) must beat the K-th best plan found. The
search visits auto configurations after every family's, in order of that bound, so the
threshold they face is the tightest the families give. Then a tighter bound that holds for
every order auto can return (:meth:`AutoPlans.ruled_out`): its own searched orders
split every backward into an I and a W, so the cut's bound counting each backward's hidden
part (``split_only``) holds for them; the only others it returns are registered schedules
unchanged, and of those only the ones with a fused backward (1F1B, GPipe, DualPipeV) can
beat that bound: their plans on the cut are simulated. Auto runs only when one of the two
beats the K-th plan. (On the LLaMA-3 405B bench, 3 searches instead of 44; only true bounds,
so the plans found are the same.) Then, under the memory each rank has left, the same two
again: the scheduler's own bound (:func:`~pipebubble.schedules.auto.bounds.bound`, whose
memory kind counts the round trips a stage's forwards wait when only k microbatches fit)
plus the least a rank adds after the pipeline, and the fused registered schedules whose
peak fits what is left (auto returns no other): when neither beats the K-th plan, auto is
not searched (GPT-1T on 512 A100s: 77 searches instead of 295).

The search runs at auto's default budget (:data:`~pipebubble.schedules.auto.SEARCH_SECONDS`
of counted work, the same as ``pipebubble schedule auto``), bounded by the work ledger alone
(no wall clock, :mod:`pipebubble.schedules.auto.budget`), so that the planner's ranking does
not depend on the clock or the load.

When nothing fits, the least budget at which auto finds an order is known without running
it (:meth:`AutoPlans.least_budget`).
"""

from __future__ import annotations

import math
import time

from ..costs import fits_limit
from ..ir.schedule import ScheduleError, loop_placement, v_placement
from ..schedules.registry import get_schedule, lookup, schedule_names
from .axes import Axes
from .cut_price import Pricing
from .cut_score import CutScorer
from .cuts import Cuts
from .layercosts import LayerCosts, ProfileSet
from .plans import Config, Plan, Priced
from .schedule_facts import ScheduleFacts
from .search_cache import PointCache

# A family whose every backward is split (an I and a W: no B) at every size (its spec's
# ``split_only``) meets the split-only bound, so AutoPlans.ruled_out need not generate it (V-Half
# and V-Min take seconds at p = 64); tests/test_plan_scale_auto.py checks the specs against
# every registered family's schedules. Any other family is generated and looked at.


class AutoPlans:
    """``auto`` (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``profiles``, the point's ``axes`` (optimizer time), its ``point`` cache
    (auto's priced cuts and floors) and the parts it calls: the schedules' ``facts``
    (order-free shapes, split or fused backwards), ``cuts`` (the min-max cut), ``pricing``
    (the cut's price and bounds) and ``scorer`` (simulating an order on the cut).
    :attr:`runs` and :attr:`seconds` count the automatic scheduler's searches."""

    def __init__(self, profiles: ProfileSet, axes: Axes, point: PointCache,
                 facts: ScheduleFacts, cuts: Cuts, pricing: Pricing, scorer: CutScorer):
        self.p, self.axes, self.L = profiles, axes, len(profiles)
        self.facts, self.cuts, self.pricing, self.scorer = facts, cuts, pricing, scorer
        self._auto_cuts = point.auto_cuts
        self.runs, self.seconds = 0, 0.0  # the automatic scheduler's searches

    def cut(self, c: Config, lc: LayerCosts) -> Priced | None:
        """The cut ``auto`` is searched on (the min-max cut into ``pp x chunks`` stages of its
        placement), priced; None when there are too few layers or no automatic scheduler."""
        if c.pp * c.chunks > self.L:
            return None
        key = (id(lc), c)
        got = self._auto_cuts.get(key)
        if got is not None and got[0] is lc:
            return got[1]
        shape = self.facts.auto_shape(c)
        cut = self.cuts.time_cuts(lc, c, c.pp * c.chunks, c.microbatches, shape.stage_to_rank)[0]
        pr = self.pricing.price(c, shape, lc, cut, split=True)  # the order may split W
        self._auto_cuts[key] = (lc, pr)
        return pr

    def bound(self, c: Config) -> float:
        """The bound of auto's cut (inf when auto has no cut here)."""
        pr = self.cut(c, self.p.at(c.microbatch_size, c.recompute))
        return math.inf if pr is None else pr.bound

    def least_budget(self, c: Config) -> float | None:
        """The least ``--gpu-memory`` at which :meth:`evaluate` finds an order for
        ``c``: its cut does not depend on the budget, and the automatic scheduler finds an
        order exactly when each rank's memory left after its static bytes is at least
        :func:`~pipebubble.schedules.auto.bounds.min_limits` (every stage holding one
        microbatch; below it no order exists). So it is ``max_r (static_r + need_r)``."""
        from ..schedules.auto.bounds import min_limits

        lc = self.p.at(c.microbatch_size, c.recompute)
        pr = self.cut(c, lc)
        if pr is None:
            return None
        where = _auto_where(c)
        need = min_limits(pr.costs.resolve(len(where), c.chunks), where)
        least = max(x + n for x, n in zip(pr.static, need, strict=True))
        # In floats (least - static) may come out an ulp below need: step up until it
        # does not, so that the scheduler, given exactly this budget, finds its order.
        while any(least - x < n for x, n in zip(pr.static, need, strict=True)):
            least = math.nextafter(least, math.inf)
        return least

    def ruled_out(self, c: Config, lc: LayerCosts, pr: Priced, threshold: float) -> bool:
        """Whether no order auto can return for ``c`` gives a plan below ``threshold``
        (module doc): auto's order is either one of its searched orders (greedy, adaptive
        V blocks, stretched blocks, local search, MIP and tail windows: every backward split
        into an I and a W, so the cut's bound with ``split_only``, which also counts the
        part of each backward that splitting it exposes, holds for it:
        :meth:`~.cut_price.Pricing.price`) or one of the registered schedules of its
        placement unchanged; of these only those with a fused backward (B: 1F1B, GPipe,
        DualPipeV) can beat that bound, and their plans on auto's cut are simulated (the
        very step auto's plan would have with that order, memory aside)."""
        key = (id(lc), c, "split only")
        got = self._auto_cuts.get(key)
        if got is None or got[0] is not lc:
            bound = self.pricing.price(c, self.facts.auto_shape(c), lc, pr.ranges, split=True,
                                split_only=True).bound
            got = self._auto_cuts[key] = (lc, bound, None)
        if got[1] < threshold:
            return False
        if got[2] is None:  # the fused registered schedules' plans, once
            fused = min((self.scorer.step(c, sched, pr)[2] for sched in self._fused_registered(c)),
                        default=math.inf)
            got = self._auto_cuts[key] = (lc, got[1], fused)
        return got[2] >= threshold

    def split_order_floor(self, c: Config, pr: Priced, left: list[float]) -> float:
        """A step no plan of ``c`` with one of auto's searched orders (every backward split)
        beats with ``left`` bytes per rank for activations: the automatic scheduler's own
        bound (:func:`~pipebubble.schedules.auto.bounds.bound`, its memory kind included:
        with k microbatches in flight a stage's forwards are round trips apart) on the
        pipeline's end, plus the least a rank adds after it (its exposed data-parallel
        traffic and optimizer step: the plan's step is ``max_r (end_r + those_r)``)."""
        from ..schedules.auto.bounds import bound

        key = (id(pr), c, tuple(left))
        got = self._auto_cuts.get(key)
        if got is not None and got[0] is pr:
            return got[1]
        where = _auto_where(c)
        try:
            sc = pr.costs.resolve(len(where), c.chunks)
            lb = bound(sc, where, c.microbatches, left).value
        except ScheduleError:
            return -math.inf
        after = min(x + self.axes.optimizer_time(c.dp, P)
                    for x, P in zip(pr.exposed, pr.rank_params, strict=True))
        floor = (lb + after) * (1 - 1e-9)  # a true bound, rounding aside
        self._auto_cuts[key] = (pr, floor)
        return floor

    def fused_floor(self, c: Config, pr: Priced, left: list[float]) -> float:
        """The fastest plan on auto's cut of the registered fused-backward schedules that
        fit ``left`` (the one kind of order auto returns that its split-order bound does not
        cover; auto returns a registered schedule only when its peak fits): inf if none."""
        from ..sim.program import schedule_peaks

        key = (id(pr), c, tuple(left), "fused")
        got = self._auto_cuts.get(key)
        if got is not None and got[0] is pr:
            return got[1]
        where = _auto_where(c)
        sc = None
        best = math.inf
        for sched in self._fused_registered(c):
            pkey = (id(sched), *(tuple(v) if isinstance(v, list | tuple) else v for v in (
                pr.costs.activation_memory, pr.costs.weight_memory, pr.costs.input_memory,
                pr.costs.recompute)))  # what the peaks read (CostModel.memory_deltas)
            peaks = self._auto_cuts.get(pkey)  # the order's peaks: shared by the limits
            if peaks is None or peaks[0] is not sched:
                if sc is None:
                    sc = pr.costs.resolve(len(where), c.chunks)
                peaks = self._auto_cuts[pkey] = (sched, schedule_peaks(sched, sc))
            if all(fits_limit(x, cap) for x, cap in zip(peaks[1], left, strict=True)):
                best = min(best, self.scorer.step(c, sched, pr)[2])
        self._auto_cuts[key] = (pr, best)
        return best

    def _fused_registered(self, c: Config):
        """The registered schedules auto scores in ``c``'s placement (the same filter and
        the same registry keys as ``schedules.auto._registered``, so one generation serves
        both) whose orders have a fused backward (B)."""
        where, kind = _auto_where(c), lookup(c.schedule).placement_at(c.chunks)
        for name in schedule_names():
            try:
                spec = lookup(name)
                if (spec.searched or spec.chunks != c.chunks or spec.split_only
                        or spec.chains != 1 or spec.placement != kind):
                    continue
                sched = get_schedule(name, c.pp, c.microbatches)
            except ScheduleError:
                continue
            if sched.chains != 1 or sched.stage_to_rank != where:
                continue
            split, fused = self.facts.kinds(sched)
            if not split or fused:
                yield sched

    def plan_at(self, c: Config, budget: float) -> Plan | None:
        """The auto plan of ``c`` at ``budget``, marked as found from that budget on."""
        plan = self.evaluate(c, self.p.at(c.microbatch_size, c.recompute), math.inf,
                                   budget)
        if plan is not None:
            plan.budget = budget
        return plan

    def evaluate(self, c, lc, threshold, budget) -> Plan | None:
        """The auto plan of ``c`` if it fits ``budget`` and beats ``threshold`` (module doc)."""
        pr = self.cut(c, lc)
        if pr is None or pr.bound >= threshold or not fits_limit(max(pr.static), budget):
            return None
        if self.ruled_out(c, lc, pr, threshold):
            return None  # no order auto can return beats threshold: not searched
        left = [budget - x for x in pr.static]
        if (self.split_order_floor(c, pr, left) >= threshold
                and self.fused_floor(c, pr, left) >= threshold):
            return None  # nor under the memory left: not searched
        t0 = time.perf_counter()
        try:
            # the spec's one entry: chunks 1 is the loop placement, 2 the V one
            sched = lookup(c.schedule).build(c.pp, c.microbatches, c.chunks, costs=pr.costs,
                                             memory_limit=left)
        except (ScheduleError, ValueError):
            return None  # no order fits the memory left
        finally:
            self.runs += 1
            self.seconds += time.perf_counter() - t0
        if tuple(sched.stage_to_rank) != _auto_where(c):
            return None
        plan = self.scorer.simulate(c, sched, pr, budget, threshold)
        if plan is not None:
            plan.cut_search = "min-max"  # auto's order is searched for the min-max cut only
        return plan


def _auto_where(c: Config) -> tuple[int, ...]:
    """Stage -> rank of an ``auto`` configuration: loop placement (chunks 1) or V (2)."""
    return loop_placement(c.pp, c.pp) if c.chunks == 1 else v_placement(c.pp)
