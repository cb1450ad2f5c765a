"""A cut, scored: simulated, and made a :class:`~pipebubble.plan.plans.Plan`.

:class:`CutScorer` runs a priced cut (:class:`~pipebubble.plan.plans.Priced`) through the
pipeline (:func:`~pipebubble.plan.pipeline_axis.run_pipeline`, once per schedule and stage
costs: points that differ in sharding alone share the run) and adds what follows the
pipeline on each rank::

    step = max_r (end_r + exposed data-parallel traffic_r + optimizer step_r)
    peak_r = static_r + simulated activation peak_r

:meth:`CutScorer.score` is the whole way from a cut to its plan, with the cheap refusals
first: the price's bound cannot beat the threshold, the static memory alone does not fit,
or the order's activation peak does not fit (:meth:`MemoryBounds.fits
<pipebubble.plan.memory_bounds.MemoryBounds.fits>`, what the simulation would report).
"""

from __future__ import annotations

import math

from ..costs import fits_limit
from ..ir.schedule import Schedule
from .axes import Axes
from .cut_price import Pricing
from .layercosts import ProfileSet
from .memory_bounds import MemoryBounds
from .partition import Ranges
from .pipeline_axis import run_pipeline
from .plans import Config, Plan, Priced, Request
from .search_cache import SearchCache

FLOOR_FROM = 2**14  # actions (about): a shorter order is simulated without its floor


class CutScorer:
    """Simulate priced cuts into plans (module doc): a part of
    :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``profiles`` (FSDP's gathered layers), the ``req`` (its global batch, which
    a plan reports), the point's ``axes`` (model-state bytes), the search's ``cache`` (its
    pipeline runs, shared by every point), and the parts it calls: ``pricing`` (the cut's
    price, each rank's optimizer step) and ``memory`` (whether the order fits).
    :attr:`simulated` counts the pipeline runs it did."""

    def __init__(self, profiles: ProfileSet, req: Request, axes: Axes, pricing: Pricing,
                 memory: MemoryBounds, cache: SearchCache | None = None):
        self.p, self.req, self.axes = profiles, req, axes
        self.pricing, self.memory = pricing, memory
        self._runs: dict[tuple, tuple[Schedule, object]] = (
            SearchCache() if cache is None else cache).runs
        self._floors: dict[tuple, tuple] = {}  # per (order, priced cut): its order floor
        self.simulated = 0

    def score(self, c: Config, sched: Schedule, lc, ranges: Ranges, threshold: float,
              budget: float) -> Plan | None:
        """The cut's plan if it fits ``budget`` and beats ``threshold``, else None."""
        pr = self.pricing.price(c, sched, lc, ranges)
        if (pr.bound >= threshold or not fits_limit(max(pr.static), budget)
                or not self.memory.fits(pr, sched, budget)
                or self.bound(c, sched, pr, threshold) >= threshold):
            return None
        return self.simulate(c, sched, pr, budget, threshold)

    def bound(self, c: Config, sched: Schedule, pr: Priced, threshold: float) -> float:
        """A step the plan of this order on this cut cannot beat: the price's bound (true
        for every order of the cut) and, where that alone does not reach a finite
        ``threshold`` and the order is long (over :data:`FLOOR_FROM` actions, where a
        simulation costs far more than the bound), the larger of it and the order's own
        floor (:meth:`order_floor`)."""
        if (pr.bound >= threshold or threshold == math.inf
                or 3 * sched.num_stages * sched.num_microbatches < FLOOR_FROM):
            return pr.bound
        held = self.memory.facts.trip_counts(sched)
        if held is None:
            return pr.bound
        return max(pr.bound, self.order_floor(c, sched, pr, held))

    def order_floor(self, c: Config, sched: Schedule, pr: Priced, held: list[int]) -> float:
        """The automatic scheduler's bound on this very order (its microbatches held per
        stage, ``held``, give each stage's round trips: :func:`~pipebubble.schedules.auto.
        bounds.bound`) plus the least a rank adds after the pipeline (its exposed
        data-parallel traffic and optimizer step, as :meth:`step` adds them): the plan's
        step is ``max_r (end_r + those_r)``, at least the pipeline's end plus their least.
        V-Min's round trips put it near its simulated step where the price's bound,
        order-free, is 20 % below (LLaMA-3 405B unfused on 2,048 H100s)."""
        key = (id(sched), id(pr))
        got = self._floors.get(key)
        if got is not None and got[0] is sched and got[1] is pr:
            return got[2]
        from ..schedules.auto.bounds import bound

        sc = pr.costs.resolve(sched.num_stages, sched.chunks)
        lb = bound(sc, tuple(sched.stage_to_rank), sched.num_microbatches, held=held).value
        opt = self.rank_optimizers(c, pr)
        after = min(x + o for x, o in zip(pr.exposed, opt, strict=True))
        floor = (lb + after) * (1 - 1e-9)  # a true bound, rounding aside
        self._floors[key] = (sched, pr, floor)
        return floor

    def rank_optimizers(self, c: Config, pr: Priced) -> list[float]:
        """Each rank's optimizer step on the cut (optimizer.py; experts' sharded apart)."""
        return [self.pricing.rank_optimizer(c, P, E) for P, E in zip(
            pr.rank_params, pr.rank_expert or [0.0] * len(pr.rank_params), strict=True)]

    def step(self, c: Config, sched: Schedule, pr: Priced) -> tuple[object, list, float]:
        """The cut's pipeline run (simulated once per schedule and stage costs), each rank's
        optimizer step and the plan's step time (:meth:`simulate`), memory aside."""
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
        opt = self.rank_optimizers(c, pr)
        step = float(max(e + x + o for e, x, o in zip(run.rank_end, pr.exposed, opt,
                                                       strict=True)))
        return run, opt, step

    def simulate(self, c: Config, sched: Schedule, pr: Priced, budget: float,
                 threshold: float) -> Plan | None:
        """Simulate the cut (module doc): its plan, with each rank's memory by kind, or None
        unless it fits ``budget`` and beats ``threshold``."""
        run, opt, step = self.step(c, sched, pr)
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
        plan.moe = pr.rank_expert is not None  # routed experts priced (plan/expert.py)
        w, g, o = self.axes.state_bytes
        n = max(self.axes.shard(c.dp), 1)
        keep = self.axes.keeps_weights(c.pp)
        sh_w, sh_g, sh_o = c.sharding.sharded(keep)  # shardings.Sharding: 1 / n of these
        fsdp = sh_w  # weights sharded: gathered per microbatch, the layers in flight
        if c.sharding.shards_params:
            plan.fsdp_reshard = "never" if keep else "always"
        gathered = self.pricing.gathered(c, self.p.at(c.microbatch_size, c.recompute), sched,
                                         pr.ranges) if fsdp else None
        n_e = max(self.axes.expert_shard(c.dp, c.pp), 1)  # efsdp under hsdp (plan/axes.py)
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
