"""What the planner knows about a plan's memory before (or instead of) timing it.

Memory depends on the order only, never on the clock: the activation peak of each rank is
the evaluation core's :func:`~pipebubble.sim.program.schedule_peaks`, and whether a plan
fits its budget is :func:`~pipebubble.costs.fits_limit` of static bytes + that peak. So a cut
that cannot win on time is ruled out on memory without simulating it. Two cheaper bounds
come first:

- :meth:`MemoryBounds.fits_surely`: every rank's static memory plus, for each of its
  stages, the most microbatches the stage holds at once (``held_s``) times M_B is within the
  budget: the cut fits (an upper bound on the peak);
- :meth:`MemoryBounds.memory_bound`: no cut's busiest rank holds less than the mean over
  ranks of the weights and the activations every stage must hold at once (a lower bound).
"""

from __future__ import annotations

from ..costs import fits_limit
from ..ir.schedule import Schedule
from ..schedules import lookup
from ..sim.program import schedule_peaks
from .axes import Axes
from .layercosts import LayerCosts, ProfileSet
from .plans import Config, Priced
from .schedule_facts import ScheduleFacts
from .search_cache import PointCache, SearchCache


class MemoryBounds:
    """Memory bounds (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``profiles``, the point's ``axes`` (bytes per parameter), the search's
    ``cache`` (the orders' activation peaks, shared by every point), the point's ``point``
    cache and the schedules' ``facts`` (microbatches held per stage). Each cache is made
    fresh when not given."""

    def __init__(self, profiles: ProfileSet, axes: Axes, cache: SearchCache | None = None,
                 point: PointCache | None = None, facts: ScheduleFacts | None = None):
        self.p, self.axes = profiles, axes
        cache = SearchCache() if cache is None else cache
        point = PointCache() if point is None else point
        self.facts = ScheduleFacts(cache) if facts is None else facts
        self._peaks = cache.peaks
        self._weight_bounds, self._memory_bounds = point.weight_bounds, point.memory_bounds

    def fits_surely(self, pr: Priced, sched: Schedule, lc: LayerCosts, budget: float) -> bool:
        """Whether the cut fits without looking at the order (module doc)."""
        held = self.facts.held(sched)
        act = pr.costs.activation_memory
        need = list(pr.static)
        for s, r in enumerate(sched.stage_to_rank):
            need[r] += held[s] * act[s]
        return fits_limit(max(need), budget)

    def fits(self, pr: Priced, sched: Schedule, budget: float) -> bool:
        """Whether the cut fits ``budget`` on every rank: static bytes + the order's
        activation peak (:func:`~pipebubble.sim.program.schedule_peaks`), exactly what the
        simulated plan would report."""
        co = pr.costs
        key = (id(sched), tuple(co.activation_memory), tuple(co.weight_memory))
        got = self._peaks.get(key)
        if got is None or got[0] is not sched:  # the order's peaks: shared by shardings
            got = self._peaks[key] = (sched, schedule_peaks(sched, co))
        peaks = got[1]
        return all(fits_limit(x + a, budget) for x, a in zip(pr.static, peaks, strict=True))

    def weight_bound(self, c: Config) -> float:
        """No cut holds less than its weights spread evenly (a copy per chain: two for
        DualPipe)."""
        copies = lookup(c.schedule).chains
        key = (c.microbatch_size, c.recompute, c.dp, c.pp, copies)  # once per point
        memo = self._weight_bounds
        got = memo.get(key)
        if got is None:
            lc = self.p.at(c.microbatch_size, c.recompute)
            got = memo[key] = (copies * self.axes.bytes_per_param(c.dp, c.pp)
                               * float(lc.params.sum()) / c.pp)
        return got

    def memory_floor(self, c: Config) -> float:
        """No cut and no order of ``c`` has its busiest rank hold less than
        :meth:`weight_bound` plus one microbatch's activations of the model spread over the
        ranks: a rank's order runs the forward of microbatch 0 on each of its stages (of the
        chain it takes) before the backward of any, so it holds all their activations at
        once. Needs no schedule (``plan --config`` ranks with it,
        :mod:`~pipebubble.plan.bound_rank`)."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        return self.weight_bound(c) + float(lc.act.sum()) / c.pp

    def memory_bound(self, c: Config, sched: Schedule) -> float:
        """No cut's busiest rank holds less: ``(weights of every stage + sum over stages of
        held_s x M_B(s)) / pp``, where ``held_s`` counts microbatches from F to their first
        backward (all of M_B is held then, and the rank holds at least that stage's share at
        its peak), bounded below by ``min_s held_s x`` (activation bytes of the model)."""
        key = (id(sched), c.microbatch_size, c.recompute, c.dp)  # once per point
        memo = self._memory_bounds
        got = memo.get(key)
        if got is None or got[0] is not sched:
            lc = self.p.at(c.microbatch_size, c.recompute)
            held = min(self.facts.held(sched, ("B", "I")))
            per_rank = sched.num_stages // c.pp
            weights = sched.chains * self.axes.bytes_per_param(c.dp, c.pp) * float(lc.params.sum())
            got = memo[key] = (sched, (weights + held * sched.chains * float(lc.act.sum())
                                       / per_rank) / c.pp)
        return got[1]
