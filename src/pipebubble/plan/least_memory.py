"""When nothing fits: the least ``--gpu-memory`` at which some configuration has a plan.

Per configuration, the least budget of its plan (:meth:`LeastMemory.plan_of`):
over every cut when there are few; else cut (a) (the planner takes whichever fits) and cut
(b) at the least cap at which (b) exists, found by bisection (it then fits by construction:
each rank's peak is at most the sum of its stages' bounds, each within budget / stages per
rank). ``auto`` at :meth:`~pipebubble.plan.auto_plans.AutoPlans.least_budget`, run only
for the configuration that needs least. Configurations are visited by their weights'
share of memory (:meth:`~pipebubble.plan.memory_bounds.MemoryBounds.weight_bound`), and
the visit stops where no configuration from there on can need less. The error names the
budget and the plan, so planning again with it finds a plan.
"""

from __future__ import annotations

import math
from itertools import combinations

from ..costs import fit_bound
from ..errors import param
from ..schedules import lookup
from .auto_plans import AutoPlans
from .cut_score import CutScorer
from .cuts import Cuts
from .layercosts import ProfileSet
from .memory_bounds import MemoryBounds
from .partition import ranges_from_ends
from .plans import Config, NoPlanFits, Plan, Request, fmt_gib
from .schedule_facts import ScheduleFacts


class LeastMemory:
    """The least budget (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``req`` (the budget and batch its error names), the ``profiles``, and the
    parts it calls: the schedules' ``facts`` (generated schedules, microbatches held, why a
    family has none), ``cuts`` (cuts (a) and (b), the memory rows), ``memory`` (the weights'
    bound it visits by), ``scorer`` (a cut's plan) and ``autos`` (auto's least budget)."""

    def __init__(self, req: Request, profiles: ProfileSet, facts: ScheduleFacts, cuts: Cuts,
                 memory: MemoryBounds, scorer: CutScorer, autos: AutoPlans):
        self.req, self.p, self.L = req, profiles, len(profiles)
        self.facts, self.cuts, self.memory = facts, cuts, memory
        self.scorer, self.autos = scorer, autos

    def least_plan(self, c: Config) -> Plan | None:
        """The plan of family configuration ``c`` that fits the smallest budget (None when
        the family has no schedule here or its stages outnumber the layers)."""
        sched = self.facts.schedule(c)
        if sched is None or sched.num_stages // sched.chains > self.L:
            return None
        return self.plan_of(c, sched, self.p.at(c.microbatch_size, c.recompute),
                            self.facts.held(sched))

    def plan_of(self, c, sched, lc, held) -> Plan | None:
        """The plan of ``c`` that fits the smallest budget: cut (a), or cut (b) at the least
        budget at which (b) exists (it then fits by construction: each rank's peak is at most
        the sum of its stages' bounds, each within budget / stages per rank)."""
        S_c = sched.num_stages // sched.chains
        if math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts:
            plans = [self.scorer.score(c, sched, lc, ranges_from_ends([*ends, self.L]),
                                       math.inf, math.inf)
                     for ends in combinations(range(1, self.L), S_c - 1)]
            return min((p for p in plans if p is not None), key=lambda p: p.needs,
                       default=None)
        # Every (a) cut: the planner takes whichever fits (the faster if both do).
        plans = [self.scorer.score(c, sched, lc, cut, math.inf, math.inf) for cut in
                 self.cuts.time_cuts(lc, c, S_c, sched.num_microbatches, sched.stage_to_rank)]
        plan = min((p for p in plans if p is not None), key=lambda p: max(p.peak_memory),
                   default=None)
        if plan is not None:
            plan.cut_search = "min-max"
        rows = self.cuts.memory_rows(lc, c, sched, held)
        per_rank = sched.num_stages // c.pp
        # hi: every layer at its worst stage's bound, all in one stage (a cap that always
        # exists); lo: 0. (Not the largest single-layer bound: a layer's bound depends on
        # its stage, and the cut need not put it where that bound is largest.)
        lo, hi = 0.0, sum(max(r) for r in zip(*rows, strict=True))
        if plan is not None:
            hi = min(hi, max(plan.peak_memory) / per_rank)
        if self.cuts.capped_cut(lc, c, sched, held, hi * per_rank) is None:
            return plan
        while hi - lo > 1e-4 * hi:
            mid = (lo + hi) / 2
            if self.cuts.capped_cut(lc, c, sched, held, mid * per_rank) is None:
                lo = mid
            else:
                hi = mid
        budget = hi * per_rank
        other = self.scorer.score(c, sched, lc,
                                  self.cuts.capped_cut(lc, c, sched, held, budget),
                                  math.inf, budget)
        if other is not None:
            other.budget = fit_bound(budget)  # at this budget (b) exists again
            other.cut_search = "min-max-capped"
        if plan is None or (other is not None and budget < max(plan.peak_memory)):
            return other
        return plan

    def no_fit(self, configs: list[Config]) -> NoPlanFits:
        """The least ``--gpu-memory`` at which any configuration has a plan, as a one-line
        error: over the families (cuts (a) and (b), or every cut) and ``auto`` (at its least
        budget, :meth:`~pipebubble.plan.auto_plans.AutoPlans.least_budget`), so planning
        again with it finds a plan."""
        skip: set[Config] = set()
        while True:
            need, best, plan = math.inf, None, None
            for c in sorted(configs, key=lambda c: self.memory.weight_bound(c)):
                if self.memory.weight_bound(c) >= need:
                    break  # no configuration from here on needs less
                if c in skip:
                    continue
                if lookup(c.schedule).searched:  # cheap: searched for the winner only
                    least = self.autos.least_budget(c)
                    if least is not None and least < need:
                        need, best, plan = least, c, None
                    continue
                p = self.least_plan(c)
                if p is not None and p.needs < need:
                    need, best, plan = p.needs, c, p
            if best is None or plan is not None:
                break
            plan = self.autos.plan_at(best, need)
            if plan is not None:
                break
            skip.add(best)  # not expected (bounds.min_limits is feasible): the next one
        r = self.req
        if plan is None:
            why = "; ".join(f"{k}: {v}" for k, v in list(self.facts.why_not.items())[-2:])
            return NoPlanFits(f"no configuration can be built for {param('gpus')} {r.gpus}, "
                              f"{param('global_batch')} {r.global_batch} and {self.L} layers"
                              + (f" ({why})" if why else ""), math.inf, None)
        c = plan.config
        what = f"{c.schedule} v={c.chunks}" if lookup(c.schedule).searched else c.schedule
        return NoPlanFits(
            f"nothing fits in {param('gpu_memory')} {fmt_gib(r.gpu_memory)} per GPU: the least "
            f"memory any plan needs is {fmt_gib(need, up=True)} (pp={c.pp}, dp={c.dp}, {what}, "
            f"microbatch size {c.microbatch_size}, recompute {c.recompute}); "
            f"use {param('gpu_memory')} {fmt_gib(need, up=True)} or more, or more {param('gpus')}",
            need, plan)
