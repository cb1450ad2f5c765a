"""Score one configuration of the planner: enumerate, bound, cut, price, simulate.

:class:`Searcher` holds what one search shares (the profile, the request, generated
schedules, cuts) and answers for a :class:`~pipebubble.plan.plans.Config` the fastest plan
that fits (:meth:`Searcher.evaluate`), using the rules of :mod:`pipebubble.plan.planner`:
every cut when there are few; else cuts (a), the min-max cut of what each layer adds to its
rank's step and (ranks holding several stages) its rank-balanced refinement, or (b) the
min-max cut under per-stage memory caps when no (a) cut fits. A plan is scored by the
simulator; lower bounds (:meth:`Searcher._price`) only skip what cannot enter the top K.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from itertools import combinations

import numpy as np

from .. import limits
from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import (
    Schedule,
    ScheduleError,
    loop_placement,
    make_schedule,
    v_placement,
)
from ..schedules import get_schedule
from .axes import Axes, Point
from .families import _auto_function, _held_both, chunk_options, schedule_list
from .layercosts import LayerCosts, ProfileSet
from .network import Network, p2p
from .partition import (
    PartitionError,
    Ranges,
    balance_ranks,
    min_max_partition,
    ranges_from_ends,
)
from .pipeline_axis import run_pipeline
from .plans import AUTO, Config, NoPlanFits, Plan, Priced, Request, fmt_gib


class Searcher:
    """One search: the configurations of a request, and the plan of each (module doc)."""

    def __init__(self, profiles: ProfileSet, req: Request, axes: Axes | None = None,
                 shared: dict | None = None):
        self.p, self.req = profiles, req
        self.axes = axes or legacy_axes(req, Point())
        self.point = self.axes.point
        self.gpus = req.gpus // (self.point.tp * self.point.cp)  # pipeline x data parallel
        self.L = len(profiles)
        self.names = schedule_list(req.schedules)
        modes = profiles.recompute_modes()
        if req.recompute is None:
            req = self.req = replace(req, recompute=("none", "full") if "full" in modes
                                     else ("none",))
        for r in req.recompute:
            if r not in ("none", "selective", "full"):
                raise UserError(f"unknown --recompute {r!r}; valid are none, selective, full")
            if r not in modes:
                profiles.at(1, r)  # raises the profile's message
        self.simulated = 0
        # Shared by the searchers of one search (one per point): schedules do not depend on
        # the point.
        shared = {} if shared is None else shared
        self._schedules: dict[tuple, Schedule | None] = shared.setdefault("schedules", {})
        self._held: dict[int, tuple[Schedule, tuple[list[int], list[int]]]] = shared.setdefault(
            "held", {})
        self._split: dict[int, tuple[Schedule, bool]] = shared.setdefault("split", {})
        self.why_not: dict[str, str] = shared.setdefault("why_not", {})
        # The pipeline's timeline depends on the schedule and the stage costs only: points
        # that differ in sharding alone (same layers, same cut) share their simulations.
        self._runs: dict[tuple, tuple[Schedule, object]] = shared.setdefault("runs", {})
        # Cuts (a) depend on the layer costs only: shared by the shardings of one (tp, sp, cp).
        self._cuts: dict[tuple, Ranges] = shared.setdefault("cuts", {}).setdefault(
            id(profiles), {})

    # -- enumeration and bounds --
    def configs(self) -> Iterator[Config]:
        """Every (pp, dp, microbatch size, recompute, schedule, chunks) of this point, with
        the bound ``m x (F + I + W of the model) / pp`` (the busiest rank works at least the
        mean; the data-parallel traffic may all hide)."""
        req, L, pt, G = self.req, self.L, self.point, self.gpus
        for pp in limits.divisors(G):  # O(sqrt N), not N
            dp = G // pp
            if (req.pp is not None and pp not in req.pp) or (
                    req.dp is not None and dp not in req.dp):
                continue
            if pt.sharding != "ddp" and dp * pt.cp == 1:
                continue  # nothing to shard: the same plan as ddp, shown once
            if pt.sharding == "hsdp" and not self.axes.shard(dp):
                continue  # the shard group would be 1 or all of dp: ddp or fsdp
            for size in req.microbatch_sizes:
                if req.global_batch % (dp * size):
                    continue
                m = req.global_batch // (dp * size)
                if not limits.plan_microbatches_ok(m):  # bounded work per configuration
                    continue
                for rec in req.recompute:
                    work = float(self.p.at(size, rec).work.sum())
                    for name in self.names:
                        if pp == 1 and name not in req.pp1_schedules(self.names):
                            continue  # one rank: every schedule is the same plan
                        for v in chunk_options(name, req.max_chunks):
                            if req.chunks is not None and v not in req.chunks:
                                continue
                            if pp * v > L and name not in ("dualpipe",):
                                continue
                            if name == "dualpipe" and pp > L:
                                continue
                            if pp == 1 and v > 1:
                                continue
                            yield Config(pp, dp, size, m, name, v, rec, m * work / pp,
                                         pt.tp, pt.sp, pt.cp, pt.sharding)

    def nothing_divides(self) -> str:
        r, G = self.req, self.gpus
        pairs = sorted({(G // pp) * s for pp in limits.divisors(G)
                        for s in r.microbatch_sizes})
        B = r.global_batch
        below = max((B // d * d for d in pairs if B // d), default=None)
        above = min((B // d + 1) * d for d in pairs)
        near = f"{below} or {above}" if below else str(above)
        return (f"--global-batch {B} cannot be split into microbatches: it must be a multiple "
                f"of dp x microbatch size for some dp dividing --gpus {r.gpus} and "
                f"--microbatch-size {','.join(map(str, r.microbatch_sizes))}, i.e. of one of "
                f"{', '.join(map(str, pairs))} (nearest: {near})")

    # -- one configuration --
    def held(self, sched: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
        """:func:`held_per_stage`, both kinds computed once per schedule."""
        got = self._held.get(id(sched))
        if got is None or got[0] is not sched:  # an id is reused once its object is gone
            got = self._held[id(sched)] = (sched, _held_both(sched))
        return got[1][0 if until == ("B", "W") else 1]

    def schedule(self, c: Config) -> Schedule | None:
        key = (c.schedule, c.pp, c.microbatches, c.chunks)
        if key not in self._schedules:
            try:
                self._schedules[key] = get_schedule(c.schedule, c.pp, c.microbatches, c.chunks)
            except ScheduleError as exc:
                self._schedules[key] = None
                self.why_not.setdefault(f"{c.schedule} pp={c.pp}", str(exc))
        return self._schedules[key]

    def evaluate(self, c: Config, threshold: float, budget: float,
                 min_memory: bool = False) -> Plan | None:
        """The fastest fitting plan of ``c`` below ``threshold`` (None if none). With
        ``min_memory``: the plan that fits the least budget, whatever ``budget`` is."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        if c.schedule == AUTO:
            if min_memory:
                least = self.least_auto_budget(c)
                return None if least is None else self.auto_plan_at(c, least)
            return self._evaluate_auto(c, lc, threshold, budget)
        sched = self.schedule(c)
        if sched is None:
            return None
        S_c = sched.num_stages // sched.chains
        if S_c > self.L:
            return None
        if min_memory:
            return self._least_memory_plan(c, sched, lc, self.held(sched))
        exhaustive = math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts
        pas = [] if exhaustive else [self._price(c, sched, lc, cut) for cut in self._time_cuts(
            lc, c, S_c, sched.num_microbatches, sched.stage_to_rank)]
        if pas and all(pa.bound >= threshold and self._fits_surely(pa, sched, lc, budget)
                       for pa in pas):
            return None  # (a) is the plan of c, and it cannot enter the top K
        if self.memory_bound(c, sched) > budget:
            return None
        held = self.held(sched)
        if exhaustive:
            best = None
            for ends in combinations(range(1, self.L), S_c - 1):
                p = self._score(c, sched, lc, ranges_from_ends([*ends, self.L]), threshold,
                                budget, held)
                if p is not None and (best is None or p.step_time < best.step_time):
                    best, threshold = p, min(threshold, p.step_time)
            return best
        # The plan of c is the faster of the (a) cuts that fit, else (b). Bounds may skip
        # simulating (a) only when they decide both; else the (a) cuts are simulated with no
        # threshold to learn whether they fit.
        cut_b = None
        if all(pa.bound >= threshold for pa in pas):
            cut_b = self._capped_cut(lc, c, sched, held, budget)
            if cut_b is None or self._price(c, sched, lc, cut_b).bound >= threshold:
                return None
        fits = [p for p in (self._simulate(c, sched, pa, budget, math.inf)
                            for pa in pas if max(pa.static) <= budget)
                if p is not None]
        if fits:  # (a) fits: it is the plan of c
            best = min(fits, key=lambda p: p.step_time)
            best.cut_search = "min-max"
            return best if best.step_time < threshold else None
        if cut_b is None:
            cut_b = self._capped_cut(lc, c, sched, held, budget)
        plan = None if cut_b is None else self._score(c, sched, lc, cut_b, threshold, budget)
        if plan is not None:
            plan.cut_search = "min-max-capped"
        return plan

    def _least_memory_plan(self, c, sched, lc, held) -> Plan | None:
        """The plan of ``c`` that fits the smallest budget: cut (a), or cut (b) at the least
        budget at which (b) exists (it then fits by construction: each rank's peak is at most
        the sum of its stages' bounds, each within budget / stages per rank)."""
        S_c = sched.num_stages // sched.chains
        if math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts:
            plans = [self._score(c, sched, lc, ranges_from_ends([*ends, self.L]), math.inf,
                                 math.inf, held)
                     for ends in combinations(range(1, self.L), S_c - 1)]
            return min((p for p in plans if p is not None), key=lambda p: p.needs,
                       default=None)
        # Every (a) cut: the planner takes whichever fits (the faster if both do).
        plans = [self._score(c, sched, lc, cut, math.inf, math.inf, held) for cut in
                 self._time_cuts(lc, c, S_c, sched.num_microbatches, sched.stage_to_rank)]
        plan = min((p for p in plans if p is not None), key=lambda p: max(p.peak_memory),
                   default=None)
        if plan is not None:
            plan.cut_search = "min-max"
        rows = self._memory_rows(lc, c, sched, held)
        per_rank = sched.num_stages // c.pp
        # hi: every layer at its worst stage's bound, all in one stage (a cap that always
        # exists); lo: 0. (Not the largest single-layer bound: a layer's bound depends on
        # its stage, and the cut need not put it where that bound is largest.)
        lo, hi = 0.0, sum(max(r) for r in zip(*rows, strict=True))
        if plan is not None:
            hi = min(hi, max(plan.peak_memory) / per_rank)
        if self._capped_cut(lc, c, sched, held, hi * per_rank) is None:
            return plan
        while hi - lo > 1e-4 * hi:
            mid = (lo + hi) / 2
            if self._capped_cut(lc, c, sched, held, mid * per_rank) is None:
                lo = mid
            else:
                hi = mid
        budget = hi * per_rank
        other = self._score(c, sched, lc, self._capped_cut(lc, c, sched, held, budget),
                            math.inf, budget, held)
        if other is not None:
            other.budget = budget * (1 + 1e-9)  # at this budget (b) exists again
            other.cut_search = "min-max-capped"
        if plan is None or (other is not None and budget < max(plan.peak_memory)):
            return other
        return plan

    def cut_costs(self, lc: LayerCosts, c: Config, microbatches: int) -> np.ndarray:
        """What a layer adds to its rank's step: ``m x (F + I + W)`` (the data-parallel
        traffic mostly hides behind the backward, so it is left out of the cut: a rule, not
        a bound; the sharding then never changes the cut, and points that differ only in it
        share their simulations)."""
        return microbatches * lc.work

    def _time_cuts(self, lc: LayerCosts, c: Config, stages: int, microbatches: int,
                   where: tuple[int, ...]) -> list[Ranges]:
        """Cuts (a): the min-max cut of :meth:`cut_costs` and, when ranks hold several stages
        (``where``: stage -> rank), its refinement by :func:`balance_ranks` if different."""
        costs = self.cut_costs(lc, c, microbatches)
        # The cut depends on the costs up to scale: key on the all-reduce share per unit work.
        ratio = float((costs - microbatches * lc.work).sum()) / microbatches
        key = (c.microbatch_size, c.recompute, stages, ratio, where)
        if key not in self._cuts:
            cuts = [min_max_partition(costs, stages)]
            if len(where) > len(set(where)):
                other = balance_ranks(costs, cuts[0], where)
                if other != cuts[0]:
                    cuts.append(other)
            self._cuts[key] = cuts
        return self._cuts[key]

    def _memory_rows(self, lc: LayerCosts, c: Config, sched: Schedule, held: list[int]
                     ) -> list[list]:
        """Per stage of one copy: each layer's memory bound in that stage (worst copy)."""
        S_c = sched.num_stages // sched.chains
        static = self.axes.bytes_per_param(c.dp) * lc.params + lc.transient
        rows = [static + held[s] * lc.act for s in range(S_c)]
        for s in range(S_c, sched.num_stages):
            rows[s % S_c] = np.maximum(rows[s % S_c], static + held[s] * lc.act)
        return [list(r) for r in rows]

    def _capped_cut(self, lc, c, sched, held, budget) -> Ranges | None:
        S_c = sched.num_stages // sched.chains
        per_rank = sched.num_stages // c.pp
        try:
            return min_max_partition(self.cut_costs(lc, c, sched.num_microbatches), S_c,
                                     memory=self._memory_rows(lc, c, sched, held),
                                     memory_cap=budget / per_rank)
        except PartitionError:
            return None

    def stage_costs(self, c: Config, sched: Schedule, lc: LayerCosts, ranges: Ranges
                    ) -> tuple[CostModel, np.ndarray, np.ndarray]:
        """The per-stage CostModel for a cut, the stages' parameters and transients."""
        S, S_c = sched.num_stages, sched.num_stages // sched.chains
        idx = [ranges[s % S_c] for s in range(S)]

        def total(arr: np.ndarray) -> list[float]:
            q = np.concatenate(([0.0], np.cumsum(arr)))
            return [float(q[b + 1] - q[a]) for a, b in idx]

        params = np.array(total(lc.params))
        sent = max((float(lc.out[b]) for k, (a, b) in enumerate(ranges) if k < S_c - 1),
                   default=0.0)
        comm = p2p(sent, self.axes.hop(c.dp)) if S > 1 else 0.0
        sync = self.axes.sync(c.dp)
        ar = [sum(sync.times(p, c.pp)) for p in params]
        f, i, w = total(lc.f), total(lc.i), total(lc.w)
        act, act_w = total(lc.act), total(lc.act_w)
        costs = CostModel(f=f, b=[x + y for x, y in zip(i, w, strict=True)], w=w, comm=comm,
                          activation_memory=act, weight_memory=[min(x, y) for x, y in
                                                                zip(act_w, act, strict=True)],
                          allreduce=ar)
        transient = np.array([float(lc.transient[a:b + 1].max()) for a, b in idx])
        return costs, params, transient

    def _price(self, c, sched, lc, ranges, split: bool | None = None) -> Priced:
        """A cut's costs and what is known before simulating: each rank's static memory and
        a lower bound on the step. Rank r starts no sooner than ``head_r``, the forwards of
        microbatch 0 through the stages before its first one (and the hops between ranks);
        then works ``busy_r`` and all-reduces. Its last backward of an input gradient (I or
        B) comes no sooner than ``head_r + busy_r - W_r`` (every W may follow it), and the
        gradient still has to reach its chain's first stage: ``tail_r``, the I (or B) of every
        stage before r's stage, and the hops. ``split``: whether W is split from the
        backward (None: ask the schedule)."""
        costs, params, transient = self.stage_costs(c, sched, lc, ranges)
        p, M = c.pp, sched.num_microbatches
        where = sched.stage_to_rank
        if split is None:
            split = self.split(sched)
        busy, static, trans, rank_params = [0.0] * p, [0.0] * p, [0.0] * p, [0.0] * p
        bpp = self.axes.bytes_per_param(c.dp)
        late = [0.0] * p  # work that may follow the rank's last input-gradient action
        head, tail = [math.inf] * p, [math.inf] * p
        before = after = 0.0
        for s, r in enumerate(where):
            if sched.first_stage(s):
                before = after = 0.0
            else:
                hop = costs.comm if where[s - 1] != r else 0.0
                before += costs.f[s - 1] + hop
                after += costs.b[s - 1] - (costs.w[s - 1] if split else 0.0) + hop
            head[r] = min(head[r], before)
            tail[r] = min(tail[r], after)
            busy[r] += M * (costs.f[s] + costs.b[s])
            late[r] += M * costs.w[s] if split else 0.0
            static[r] += bpp * params[s]
            rank_params[r] += params[s]
            trans[r] = max(trans[r], transient[s])
        ar = self.exposed(c, sched, costs, params)
        bound = max(max(h + b + a, h + b - w + t) for h, b, a, w, t in
                    zip(head, busy, ar, late, tail, strict=True))
        return Priced(ranges, costs, bound, [x + t for x, t in zip(static, trans, strict=True)],
                      ar, rank_params)

    def exposed(self, c: Config, sched: Schedule, costs: CostModel, stage_params
                ) -> list[float]:
        """Per rank: the data-parallel traffic of its stages that does not hide behind one
        microbatch's forward and backward on it (:meth:`~pipebubble.plan.sharding.Sync.exposed`;
        it depends on the costs only, so the bounds use it exactly)."""
        p = c.pp
        if c.dp * c.cp == 1:
            return [0.0] * p
        sync = self.axes.sync(c.dp)
        params, fwd, bwd = [0.0] * p, [0.0] * p, [0.0] * p
        for s, r in enumerate(sched.stage_to_rank):
            params[r] += stage_params[s]
            fwd[r] += costs.f[s]
            bwd[r] += costs.b[s]
        return [sync.exposed(sync.times(params[r], c.pp), fwd[r], bwd[r], params[r])
                for r in range(p)]

    def split(self, sched: Schedule) -> bool:
        got = self._split.get(id(sched))
        if got is None or got[0] is not sched:  # as in held(): the id alone is not enough
            got = self._split[id(sched)] = (sched, sched.uses_split_backward())
        return got[1]

    def _score(self, c, sched, lc, ranges, threshold, budget, held=None) -> Plan | None:
        """The cut's plan if it fits ``budget`` and beats ``threshold``, else None."""
        pr = self._price(c, sched, lc, ranges)
        if pr.bound >= threshold or max(pr.static) > budget:
            return None
        return self._simulate(c, sched, pr, budget, threshold)

    def _fits_surely(self, pr: Priced, sched: Schedule, lc: LayerCosts, budget: float) -> bool:
        """Whether the cut fits without simulating: every rank's static memory plus, for each
        of its stages, the most microbatches it holds times M_B, is within budget."""
        held = self.held(sched)
        act = pr.costs.activation_memory
        need = list(pr.static)
        for s, r in enumerate(sched.stage_to_rank):
            need[r] += held[s] * act[s]
        return max(need) <= budget

    def _simulate(self, c: Config, sched: Schedule, pr: Priced, budget: float,
                  threshold: float) -> Plan | None:
        """Simulate the cut (:func:`~pipebubble.plan.pipeline_axis.run_pipeline`): step time =
        ``max_r (end_r + exposed data-parallel traffic_r)``, peak per rank = static + the
        simulated activation peak. None unless it fits ``budget`` and beats ``threshold``."""
        co = pr.costs
        key = (id(sched), tuple(co.f), tuple(co.b), tuple(co.w), co.comm,
               tuple(co.activation_memory), tuple(co.weight_memory))
        got = self._runs.get(key)
        if got is None or got[0] is not sched:
            self.simulated += 1
            got = self._runs[key] = (sched, run_pipeline(sched, co))
        run = got[1]
        step = float(max(e + x for e, x in zip(run.rank_end, pr.exposed, strict=True)))
        peaks = [float(x + a) for x, a in zip(pr.static, run.peak_activations, strict=True)]
        if step >= threshold or max(peaks) > budget * (1 + 1e-12):
            return None
        where = sched.stage_to_rank
        ar = max((sum(pr.costs.allreduce[s] for s, r in enumerate(where) if r == k)
                  for k in range(c.pp)), default=0.0) if c.dp * c.cp > 1 else 0.0
        plan = Plan(c, pr.ranges, tuple(where), step, run.step_time, run.bubble_fraction,
                    peaks, ar, pr.costs.comm, pr.costs, sched, self.req.global_batch)
        plan.dp_exposed = max(pr.exposed, default=0.0)
        plan.static = list(pr.static)
        w, g, o = self.axes.state_bytes
        n = max(self.axes.shard(c.dp), 1)
        sh = c.sharding
        for r in range(c.pp):
            P = pr.rank_params[r]
            states = {"weights": w * P / (n if sh in ("fsdp", "hsdp") else 1),
                      "gradients": g * P / (n if sh in ("zero2", "fsdp", "hsdp") else 1),
                      "optimizer": o * P / (n if sh != "ddp" else 1)}
            states["recompute_transient"] = pr.static[r] - sum(states.values())
            states["activations"] = run.peak_activations[r]
            plan.memory.append({k: float(v) for k, v in states.items()})
        return plan

    def _auto_cut(self, c: Config, lc: LayerCosts) -> Priced | None:
        """The cut ``auto`` is searched on (the min-max cut into ``pp x chunks`` stages of its
        placement), priced; None when there are too few layers or no automatic scheduler."""
        if _auto_function() is None or c.pp * c.chunks > self.L:
            return None
        placement = "loop" if c.chunks == 1 else "v"
        shape = make_schedule("auto", [()] * c.pp, c.pp * c.chunks, c.microbatches,
                              placement=placement)
        cut = self._time_cuts(lc, c, c.pp * c.chunks, c.microbatches, shape.stage_to_rank)[0]
        return self._price(c, shape, lc, cut, split=True)  # the order may split W

    def least_auto_budget(self, c: Config) -> float | None:
        """The least ``--gpu-memory`` at which :meth:`_evaluate_auto` finds an order for
        ``c``: its cut does not depend on the budget, and the automatic scheduler finds an
        order exactly when each rank's memory left after its static bytes is at least
        :func:`~pipebubble.schedules.auto.bounds.min_limits` (every stage holding one
        microbatch; below it no order exists). So it is ``max_r (static_r + need_r)``."""
        from ..schedules.auto.bounds import min_limits

        lc = self.p.at(c.microbatch_size, c.recompute)
        pr = self._auto_cut(c, lc)
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

    def auto_plan_at(self, c: Config, budget: float) -> Plan | None:
        """The auto plan of ``c`` at ``budget``, marked as found from that budget on."""
        plan = self._evaluate_auto(c, self.p.at(c.microbatch_size, c.recompute), math.inf,
                                   budget)
        if plan is not None:
            plan.budget = budget
        return plan

    def _evaluate_auto(self, c, lc, threshold, budget) -> Plan | None:
        """``auto``: the automatic scheduler's order (``schedules.auto.auto_schedule``) for the
        min-max cut into ``pp`` stages (loop placement, chunks 1) or ``2 pp`` (V placement,
        chunks 2), given each rank's memory left after weights, gradients, optimizer state
        and the recomputation transient."""
        fn = _auto_function()
        pr = self._auto_cut(c, lc)
        if fn is None or pr is None or pr.bound >= threshold or max(pr.static) > budget:
            return None
        placement = "loop" if c.chunks == 1 else "v"
        left = [budget - x for x in pr.static]
        try:
            sched = fn(c.pp, c.microbatches, pr.costs, memory_limit=left, placement=placement)
        except (ScheduleError, ValueError):
            return None  # no order fits the memory left
        if tuple(sched.stage_to_rank) != _auto_where(c):
            return None
        plan = self._simulate(c, sched, pr, budget, threshold)
        if plan is not None:
            plan.cut_search = "min-max"  # auto's order is searched for the min-max cut only
        return plan

    # -- nothing fits --
    def no_fit(self, configs: list[Config]) -> NoPlanFits:
        """The least ``--gpu-memory`` at which any configuration has a plan, as a one-line
        error: over the families (cuts (a) and (b), or every cut) and ``auto`` (at its least
        budget, :meth:`least_auto_budget`), so planning again with it finds a plan."""
        skip: set[Config] = set()
        while True:
            need, best, plan = math.inf, None, None
            for c in sorted(configs, key=lambda c: self._memory_bound(c)):
                if self._memory_bound(c) >= need:
                    break  # no configuration from here on needs less
                if c in skip:
                    continue
                if c.schedule == AUTO:  # cheap: the order is searched for the winner only
                    least = self.least_auto_budget(c)
                    if least is not None and least < need:
                        need, best, plan = least, c, None
                    continue
                p = self.evaluate(c, math.inf, math.inf, min_memory=True)
                if p is not None and p.needs < need:
                    need, best, plan = p.needs, c, p
            if best is None or plan is not None:
                break
            plan = self.auto_plan_at(best, need)
            if plan is not None:
                break
            skip.add(best)  # not expected (bounds.min_limits is feasible): the next one
        r = self.req
        if plan is None:
            why = "; ".join(f"{k}: {v}" for k, v in list(self.why_not.items())[-2:])
            return NoPlanFits(f"no configuration can be built for --gpus {r.gpus}, "
                              f"--global-batch {r.global_batch} and {self.L} layers"
                              + (f" ({why})" if why else ""), math.inf, None)
        c = plan.config
        what = f"{c.schedule} v={c.chunks}" if c.schedule == AUTO else c.schedule
        return NoPlanFits(
            f"nothing fits in --gpu-memory {fmt_gib(r.gpu_memory)} per GPU: the least memory "
            f"any plan needs is {fmt_gib(need, up=True)} (pp={c.pp}, dp={c.dp}, {what}, "
            f"microbatch size {c.microbatch_size}, recompute {c.recompute}); "
            f"use --gpu-memory {fmt_gib(need, up=True)} or more, or more --gpus",
            need, plan)

    def _memory_bound(self, c: Config) -> float:
        """No cut holds less than its weights spread evenly (two copies for DualPipe)."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        copies = 2 if c.schedule == "dualpipe" else 1
        return copies * self.axes.bytes_per_param(c.dp) * float(lc.params.sum()) / c.pp

    def memory_bound(self, c: Config, sched: Schedule) -> float:
        """No cut's busiest rank holds less: ``(weights of every stage + sum over stages of
        held_s x M_B(s)) / pp``, where ``held_s`` counts microbatches from F to their first
        backward (all of M_B is held then, and the rank holds at least that stage's share at
        its peak), bounded below by ``min_s held_s x`` (activation bytes of the model)."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        held = min(self.held(sched, ("B", "I")))
        per_rank = sched.num_stages // c.pp
        weights = sched.chains * self.axes.bytes_per_param(c.dp) * float(lc.params.sum())
        return (weights + held * sched.chains * float(lc.act.sum()) / per_rank) / c.pp


def _auto_where(c: Config) -> tuple[int, ...]:
    """Stage -> rank of an ``auto`` configuration: loop placement (chunks 1) or V (2)."""
    return loop_placement(c.pp, c.pp) if c.chunks == 1 else v_placement(c.pp)


def legacy_axes(req: Request, point: Point) -> Axes:
    """The axes without ``--gpu``: one-level network (``--allreduce-bandwidth``), every hop on
    ``--p2p-bandwidth``; model states split as 2 : 2 : 12 of ``--bytes-per-param``."""
    bpp = req.bytes_per_param
    return Axes(point, Network.flat(req.allreduce_bandwidth, req.latency),
                (bpp / 8, bpp / 8, bpp * 3 / 4), req.grad_bytes,
                p2p=(req.p2p_bandwidth, req.latency))
