"""Choose pp, dp, microbatch size, schedule, chunks and recomputation under a memory budget.

The planner is a loop around two exact pieces (DESIGN.md): the min-max partitioner and the
simulator. A *configuration* is (pp, dp = gpus / pp, microbatch size, schedule, chunks,
recompute); the global batch fixes ``m = global_batch / (dp x size)``. For each one:

1. **Cut** the layers into the schedule's stages. When there are at most ``exhaustive_cuts``
   ways to cut, every cut is scored; otherwise (a) the min-max cut of F + I + W per layer
   (:func:`~pipebubble.plan.partition.min_max_partition`); if it does not fit, (b) the same
   with a memory cap per stage (``budget / stages per rank``; a stage's memory bound is its
   weights plus the most microbatches it holds at once times its activation bytes), which
   then fits by construction. When nothing fits, the error names the least budget at which
   either cut of some configuration fits (bisection on the cap for (b)).
2. **Price** it: per stage F, I (recomputation included), W, activation bytes M_B and M_W;
   P2P time per hop = bytes sent / ``p2p_bandwidth`` + ``latency``; the data-parallel ring
   all-reduce of each stage's gradients, ``2 (D-1)/D x bytes / allreduce_bandwidth +
   2 (D-1) x latency`` (:mod:`pipebubble.sim.dataparallel`), after the rank's last action.
3. **Simulate** it (:func:`pipebubble.sim.simulate`): step time = ``max_r (end_r +
   all-reduce of r's stages)``; peak memory per rank = its weights, gradients and optimizer
   state (``bytes_per_param`` x parameters) + the simulated activation peak + what
   recomputation re-materialises during one layer's backward. It fits if every rank's peak
   is within ``gpu_memory``.

Closed forms only prune, and only with true lower bounds: no configuration can take less
than ``m x (F + I + W of the whole model) / pp`` plus its share of the all-reduce
(configurations are visited in that order, and the search stops once the bound passes the
K-th best step found), nor less than its busiest rank's work after the cut.

Four equal layers (F = 1 s, B = 2 s per microbatch, no weights) on 2 GPUs, global batch 4:
pp = 1, dp = 2 runs m = 2 microbatches in 2 x 4 x 3 = 24 s; pp = 2 (1F1B, two layers per
stage, m = 4) takes (m + p - 1)(F + B) = 5 x 6 = 30 s.

>>> from pipebubble.plan.profile import Profile
>>> layer = {"forward": 1, "backward": 2, "params": 0, "activation_bytes": 0, "flops": 0}
>>> prof = Profile.from_dict({"batch": 1, "layers": [{"name": str(i), **layer}
...                                                   for i in range(4)]})
>>> res = search(ProfileSet([prof]), Request(gpus=2, gpu_memory=1, global_batch=4,
...              microbatch_sizes=(1,), schedules=("1f1b",), recompute=("none",), latency=0))
>>> [(p.pp, p.dp, p.microbatches, p.step_time) for p in res.plans]
[(1, 2, 2, 24.0), (2, 1, 4, 30.0)]
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np

from ..costs import CostModel
from ..ir.schedule import Overlap, Schedule, ScheduleError, make_schedule
from ..schedules import get_schedule, lookup, schedule_names
from ..sim.dataparallel import ring_allreduce_time, step_time_with_allreduce
from ..sim.kernel import simulate
from .layercosts import LayerCosts, ProfileSet
from .partition import PartitionError, Ranges, min_max_partition, ranges_from_ends

AUTO = "auto"


@dataclass(frozen=True)
class _Priced:
    ranges: Ranges
    costs: CostModel
    bound: float  # no order of this cut finishes sooner (seconds)
    static: list[float]  # per rank: weights, gradients, optimizer state, transient bytes


class NoPlanFits(ValueError):
    """Nothing fits the memory budget; ``smallest`` is the least peak memory of any plan
    searched (the budget at which that plan would fit) and ``plan`` that plan."""

    def __init__(self, message: str, smallest: float, plan: Plan | None):
        super().__init__(message)
        self.smallest, self.plan = smallest, plan


@dataclass(frozen=True)
class Request:
    """What to search. Bandwidths in bytes/s, latency in seconds, memory in bytes."""

    gpus: int
    gpu_memory: float
    global_batch: int
    microbatch_sizes: tuple[int, ...] = (1, 2, 4)
    schedules: tuple[str, ...] | None = None  # None: every registered one (and auto)
    max_chunks: int = 4
    recompute: tuple[str, ...] | None = None  # None: none and full, if the profile has full
    bytes_per_param: float = 16.0
    grad_bytes: float = 4.0
    p2p_bandwidth: float = 50e9
    allreduce_bandwidth: float = 50e9
    latency: float = 1e-5
    top: int = 5
    exhaustive_cuts: int = 64
    prune: bool = True  # False: bound nothing, simulate every configuration (a baseline)

    def check(self) -> None:
        for name in ("gpus", "global_batch", "max_chunks", "top"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        for name in ("gpu_memory", "p2p_bandwidth", "allreduce_bandwidth", "bytes_per_param"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0, "
                                 f"got {v!r}")
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"--latency must be a finite number >= 0 seconds, got "
                             f"{self.latency!r}")
        if not (self.grad_bytes >= 0 and math.isfinite(self.grad_bytes)):
            raise ValueError(f"--grad-bytes must be >= 0, got {self.grad_bytes!r}")
        if not self.microbatch_sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1
                for s in self.microbatch_sizes):
            raise ValueError(f"--microbatch-size must be integers >= 1, got "
                             f"{list(self.microbatch_sizes)}")


@dataclass(frozen=True)
class Config:
    pp: int
    dp: int
    microbatch_size: int
    microbatches: int
    schedule: str
    chunks: int
    recompute: str
    bound: float  # no cut of this configuration takes less (seconds)


@dataclass
class Plan:
    """One configuration, its cut and what the simulator predicts."""

    config: Config
    ranges: Ranges  # the layers of each stage of one model copy
    stage_to_rank: tuple[int, ...]
    step_time: float  # with the data-parallel all-reduce
    pipeline_time: float  # without it
    bubble_fraction: float
    peak_memory: list[float]  # per pipeline rank: weights + optimizer + activations
    allreduce_time: float  # the largest rank's all-reduce
    comm: float  # seconds per P2P hop
    costs: CostModel = field(repr=False)
    schedule_obj: Schedule = field(repr=False)
    global_batch: int = 0
    budget: float | None = None  # the least budget at which the planner finds this plan

    @property
    def needs(self) -> float:
        """The least --gpu-memory at which the planner finds this plan."""
        return max(max(self.peak_memory), self.budget or 0.0)

    def __getattr__(self, name: str):
        if name in Config.__dataclass_fields__:
            return getattr(self.config, name)
        raise AttributeError(name)

    @property
    def samples_per_second(self) -> float:
        return self.global_batch / self.step_time if self.step_time > 0 else 0.0

    def stages(self) -> list[dict]:
        """One entry per stage: its layers and its rank (both model copies for DualPipe)."""
        n = len(self.ranges)
        return [{"first_layer": self.ranges[s % n][0], "last_layer": self.ranges[s % n][1],
                 "rank": r} for s, r in enumerate(self.stage_to_rank)]

    def as_json(self) -> dict:
        c = self.config
        return {"pp": c.pp, "dp": c.dp, "chunks": c.chunks,
                "schedule": c.schedule, "microbatch_size": c.microbatch_size,
                "microbatches": c.microbatches, "recompute": c.recompute,
                "stages": self.stages(), "predicted_step_time": self.step_time,
                "pipeline_step_time": self.pipeline_time,
                "allreduce_time": self.allreduce_time, "p2p_time": self.comm,
                "samples_per_second": self.samples_per_second,
                "bubble_fraction": self.bubble_fraction, "peak_memory": self.peak_memory}


@dataclass
class Result:
    plans: list[Plan]
    searched: int  # configurations considered (bounded, generated, or simulated)
    simulated: int  # simulations run (one per cut scored)
    seconds: float
    request: Request


# ---- the search -------------------------------------------------------------------------------

def search(profiles: ProfileSet, req: Request) -> Result:
    """The ``req.top`` fastest plans that fit, fastest first (see the module doc)."""
    req.check()
    t0 = time.perf_counter()
    s = _Search(profiles, req)
    configs = sorted(s.configs(), key=lambda c: c.bound)
    if not configs:
        raise ValueError(s.nothing_divides())
    best: list[Plan] = []
    for c in configs:
        full = req.prune and len(best) >= req.top
        if full and c.bound >= best[-1].step_time:
            break  # sorted by bound: nothing after this one can enter the top K
        threshold = best[-1].step_time if full else math.inf
        plan = s.evaluate(c, threshold, req.gpu_memory)
        if plan is not None:
            best.append(plan)
            best.sort(key=_order)
            del best[req.top:]
    if not best:
        raise s.no_fit(configs)
    return Result(best, len(configs), s.simulated, time.perf_counter() - t0, s.req)


def _order(p: Plan) -> tuple:
    c = p.config
    return (p.step_time, max(p.peak_memory), c.pp, c.schedule, c.chunks, c.microbatch_size,
            c.recompute)


def chunk_options(name: str, max_chunks: int) -> list[int]:
    """The chunks (stages per rank) a family accepts, up to ``max_chunks``."""
    if name == AUTO:
        return [1, 2] if max_chunks >= 2 else [1]
    spec = lookup(name)
    if spec.fixed_chunks:
        return [spec.chunks] if spec.chunks <= max(max_chunks, 1) or spec.chunks == 1 else []
    return list(range(spec.min_chunks, max_chunks + 1))


def schedule_list(names: tuple[str, ...] | None) -> list[str]:
    """Registered names (``auto`` when importable) or the given ones, checked."""
    have_auto = AUTO in schedule_names() or _auto_function() is not None
    if names is None:
        out = [n for n in schedule_names() if n != AUTO]
        return out + ([AUTO] if have_auto else [])
    out = []
    for n in names:
        if n.lower() == AUTO:
            if not have_auto:
                raise ValueError("--schedules auto: the automatic scheduler is not available "
                                 f"in this version; valid are {', '.join(schedule_names())}")
            out.append(AUTO)
        else:
            out.append(lookup(n).name)
    return list(dict.fromkeys(out))


def held_per_stage(schedule: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
    """Most microbatches each stage holds activations for at once: from its F to the B, or
    to the W of a split backward (I frees only part): a bound on what the stage keeps. With
    ``until=("B", "I")``: from F to the first backward, when all of M_B is still held.

    >>> held_per_stage(get_schedule("1f1b", ranks=3, microbatches=6))
    [3, 2, 1]
    """
    peak = [0] * schedule.num_stages
    cur = [0] * schedule.num_stages
    for order in schedule.orders:
        for step in order:
            for stage, kind, _ in (step if type(step) is Overlap else (step,)):
                if kind == "F":
                    cur[stage] += 1
                    if cur[stage] > peak[stage]:
                        peak[stage] = cur[stage]
                elif kind in until:
                    cur[stage] -= 1
    return peak


class _Search:
    def __init__(self, profiles: ProfileSet, req: Request):
        self.p, self.req = profiles, req
        self.L = len(profiles)
        self.names = schedule_list(req.schedules)
        modes = profiles.recompute_modes()
        if req.recompute is None:
            req = self.req = replace(req, recompute=("none", "full") if "full" in modes
                                     else ("none",))
        for r in req.recompute:
            if r not in ("none", "selective", "full"):
                raise ValueError(f"unknown --recompute {r!r}; valid are none, selective, full")
            if r not in modes:
                profiles.at(1, r)  # raises the profile's message
        self.simulated = 0
        self._schedules: dict[tuple, Schedule | None] = {}
        self._cuts: dict[tuple, Ranges] = {}
        self._held: dict[tuple, list[int]] = {}
        self.why_not: dict[str, str] = {}  # schedule -> why it could not be generated

    # -- enumeration and bounds --
    def configs(self) -> Iterator[Config]:
        req, L = self.req, self.L
        for pp in (d for d in range(1, req.gpus + 1) if req.gpus % d == 0):
            dp = req.gpus // pp
            for size in req.microbatch_sizes:
                if req.global_batch % (dp * size):
                    continue
                m = req.global_batch // (dp * size)
                for rec in req.recompute:
                    lc = self.p.at(size, rec)
                    work = float(lc.work.sum())
                    ar = self._allreduce_bound(lc, dp)
                    for name in self.names:
                        for v in chunk_options(name, req.max_chunks):
                            if pp * v > L and name not in ("dualpipe",):
                                continue
                            if name == "dualpipe" and pp > L:
                                continue
                            yield Config(pp, dp, size, m, name, v, rec,
                                         (m * work + ar) / pp)

    def _allreduce_bound(self, lc: LayerCosts, dp: int) -> float:
        """The all-reduce of every stage summed is at least that of all parameters at once
        (one latency term), ``ring(bytes) = a x bytes + c``."""
        if dp == 1:
            return 0.0
        r = self.req
        return ring_allreduce_time(float(lc.params.sum()) * r.grad_bytes, dp,
                                   r.allreduce_bandwidth, r.latency)

    def nothing_divides(self) -> str:
        r = self.req
        pairs = sorted({(r.gpus // pp) * s for pp in range(1, r.gpus + 1) if r.gpus % pp == 0
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
        key = (id(sched), until)
        if key not in self._held:
            self._held[key] = held_per_stage(sched, until)
        return self._held[key]

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
        if c.schedule == AUTO:  # not in the no-fit search: its least budget is the families'
            return None if min_memory else self._evaluate_auto(c, lc, threshold, budget)
        sched = self.schedule(c)
        if sched is None:
            return None
        S_c = sched.num_stages // sched.chains
        if S_c > self.L:
            return None
        if min_memory:
            return self._least_memory_plan(c, sched, lc, self.held(sched))
        exhaustive = math.comb(self.L - 1, S_c - 1) <= self.req.exhaustive_cuts
        pa = None if exhaustive else self._price(c, sched, lc, self._time_cut(lc, c, S_c))
        if pa is not None and pa.bound >= threshold and self._fits_surely(pa, sched, lc,
                                                                           budget):
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
        # The plan of c is (a) if it fits, else (b). Bounds may skip simulating (a) only
        # when they decide both; else (a) is simulated with no threshold to learn if it fits.
        cut_b = None
        if pa.bound >= threshold:
            cut_b = self._capped_cut(lc, c, sched, held, budget)
            if cut_b is None or self._price(c, sched, lc, cut_b).bound >= threshold:
                return None
        if max(pa.static) <= budget:
            pa_plan = self._simulate(c, sched, pa.costs, pa.ranges, pa.static, budget,
                                     math.inf)
            if pa_plan is not None:  # (a) fits: it is the plan of c
                return pa_plan if pa_plan.step_time < threshold else None
        if cut_b is None:
            cut_b = self._capped_cut(lc, c, sched, held, budget)
        return None if cut_b is None else self._score(c, sched, lc, cut_b, threshold, budget)

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
        plan = self._score(c, sched, lc, self._time_cut(lc, c, S_c), math.inf, math.inf, held)
        rows = self._memory_rows(lc, sched, held)
        per_rank = sched.num_stages // c.pp
        lo, hi = max(max(r) for r in rows), sum(max(r) for r in zip(*rows, strict=True))
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
        if plan is None or (other is not None and budget < max(plan.peak_memory)):
            return other
        return plan

    def _time_cut(self, lc: LayerCosts, c: Config, stages: int) -> Ranges:
        key = (c.microbatch_size, c.recompute, stages)
        if key not in self._cuts:
            self._cuts[key] = min_max_partition(lc.work, stages)
        return self._cuts[key]

    def _memory_rows(self, lc: LayerCosts, sched: Schedule, held: list[int]) -> list[list]:
        """Per stage of one copy: each layer's memory bound in that stage (worst copy)."""
        S_c = sched.num_stages // sched.chains
        static = self.req.bytes_per_param * lc.params + lc.transient
        rows = [static + held[s] * lc.act for s in range(S_c)]
        for s in range(S_c, sched.num_stages):
            rows[s % S_c] = np.maximum(rows[s % S_c], static + held[s] * lc.act)
        return [list(r) for r in rows]

    def _capped_cut(self, lc, c, sched, held, budget) -> Ranges | None:
        S_c = sched.num_stages // sched.chains
        per_rank = sched.num_stages // c.pp
        try:
            return min_max_partition(lc.work, S_c, memory=self._memory_rows(lc, sched, held),
                                     memory_cap=budget / per_rank)
        except PartitionError:
            return None

    def stage_costs(self, c: Config, sched: Schedule, lc: LayerCosts, ranges: Ranges
                    ) -> tuple[CostModel, np.ndarray, np.ndarray]:
        """The per-stage CostModel for a cut, the stages' parameters and transients."""
        req = self.req
        S, S_c = sched.num_stages, sched.num_stages // sched.chains
        idx = [ranges[s % S_c] for s in range(S)]

        def total(arr: np.ndarray) -> list[float]:
            q = np.concatenate(([0.0], np.cumsum(arr)))
            return [float(q[b + 1] - q[a]) for a, b in idx]

        params = np.array(total(lc.params))
        sent = max((float(lc.out[b]) for k, (a, b) in enumerate(ranges) if k < S_c - 1),
                   default=0.0)
        comm = sent / req.p2p_bandwidth + req.latency if S > 1 else 0.0
        ar = [ring_allreduce_time(p * req.grad_bytes, c.dp, req.allreduce_bandwidth,
                                  req.latency) for p in params]
        f, i, w = total(lc.f), total(lc.i), total(lc.w)
        act, act_w = total(lc.act), total(lc.act_w)
        costs = CostModel(f=f, b=[x + y for x, y in zip(i, w, strict=True)], w=w, comm=comm,
                          activation_memory=act, weight_memory=[min(x, y) for x, y in
                                                                zip(act_w, act, strict=True)],
                          allreduce=ar)
        transient = np.array([float(lc.transient[a:b + 1].max()) for a, b in idx])
        return costs, params, transient

    def _price(self, c, sched, lc, ranges) -> _Priced:
        """A cut's costs and what is known before simulating: a lower bound on its step
        (rank r starts no sooner than the forwards of microbatch 0 before its first stage,
        then works ``busy_r`` and all-reduces) and each rank's static memory."""
        costs, params, transient = self.stage_costs(c, sched, lc, ranges)
        p, M = c.pp, sched.num_microbatches
        busy, ar, static, trans = [0.0] * p, [0.0] * p, [0.0] * p, [0.0] * p
        head, before = [math.inf] * p, 0.0
        for s, r in enumerate(sched.stage_to_rank):
            before = 0.0 if sched.first_stage(s) else before + costs.f[s - 1] + costs.comm
            head[r] = min(head[r], before)
            busy[r] += M * (costs.f[s] + costs.b[s])
            ar[r] += costs.allreduce[s]
            static[r] += self.req.bytes_per_param * params[s]
            trans[r] = max(trans[r], transient[s])
        bound = max(h + b + a for h, b, a in zip(head, busy, ar, strict=True))
        return _Priced(ranges, costs, bound, [x + t for x, t in zip(static, trans, strict=True)])

    def _score(self, c, sched, lc, ranges, threshold, budget, held=None) -> Plan | None:
        """The cut's plan if it fits ``budget`` and beats ``threshold``, else None."""
        pr = self._price(c, sched, lc, ranges)
        if pr.bound >= threshold or max(pr.static) > budget:
            return None
        return self._simulate(c, sched, pr.costs, ranges, pr.static, budget, threshold)

    def _fits_surely(self, pr: _Priced, sched: Schedule, lc: LayerCosts, budget: float) -> bool:
        """Whether the cut fits without simulating: every rank's static memory plus, for each
        of its stages, the most microbatches it holds times M_B, is within budget."""
        held = self.held(sched)
        act = pr.costs.activation_memory
        need = list(pr.static)
        for s, r in enumerate(sched.stage_to_rank):
            need[r] += held[s] * act[s]
        return max(need) <= budget

    def _simulate(self, c, sched, costs, ranges, static, budget, threshold) -> Plan | None:
        self.simulated += 1
        tl = simulate(sched, costs)
        step = step_time_with_allreduce(tl, costs, c.dp)
        peaks = [float(x + st.peak_memory) for x, st in zip(static, tl.rank_stats(),
                                                             strict=True)]
        if step >= threshold or max(peaks) > budget * (1 + 1e-12):
            return None
        ar = max((sum(costs.allreduce[s] for s, r in enumerate(sched.stage_to_rank) if r == k)
                  for k in range(c.pp)), default=0.0) if c.dp > 1 else 0.0
        return Plan(c, ranges, tuple(sched.stage_to_rank), step, tl.step_time,
                    tl.bubble_fraction, peaks, ar, costs.comm, costs, sched,
                    self.req.global_batch)

    def _evaluate_auto(self, c, lc, threshold, budget) -> Plan | None:
        """``auto``: the automatic scheduler's order (``schedules.auto.auto_schedule``) for the
        min-max cut into ``pp`` stages (loop placement, chunks 1) or ``2 pp`` (V placement,
        chunks 2), given each rank's memory left after weights, gradients, optimizer state
        and the recomputation transient."""
        fn = _auto_function()
        placement = "loop" if c.chunks == 1 else "v"
        S = c.pp * c.chunks
        if fn is None or S > self.L:
            return None
        shape = make_schedule("auto", [()] * c.pp, S, c.microbatches, placement=placement)
        pr = self._price(c, shape, lc, self._time_cut(lc, c, S))
        if pr.bound >= threshold or max(pr.static) > budget:
            return None
        left = [budget - x for x in pr.static]
        try:
            sched = fn(c.pp, c.microbatches, pr.costs, memory_limit=left, placement=placement)
        except (ScheduleError, ValueError):
            return None  # no order fits the memory left
        if tuple(sched.stage_to_rank) != tuple(shape.stage_to_rank):
            return None
        return self._simulate(c, sched, pr.costs, pr.ranges, pr.static, budget, threshold)

    # -- nothing fits --
    def no_fit(self, configs: list[Config]) -> NoPlanFits:
        """The least peak memory of any plan (cuts (a) and (c)), as a one-line error."""
        best: Plan | None = None
        for c in sorted(configs, key=lambda c: self._memory_bound(c)):
            if best is not None and self._memory_bound(c) >= best.needs:
                break
            p = self.evaluate(c, math.inf, math.inf, min_memory=True)
            if p is not None and (best is None or p.needs < best.needs):
                best = p
        r = self.req
        if best is None:
            why = "; ".join(f"{k}: {v}" for k, v in list(self.why_not.items())[-2:])
            return NoPlanFits(f"no configuration can be built for --gpus {r.gpus}, "
                              f"--global-batch {r.global_batch} and {self.L} layers"
                              + (f" ({why})" if why else ""), math.inf, None)
        need = best.needs
        c = best.config
        return NoPlanFits(
            f"nothing fits in --gpu-memory {fmt_gib(r.gpu_memory)} per GPU: the smallest "
            f"peak of any plan is {fmt_gib(need, up=True)} (pp={c.pp}, dp={c.dp}, "
            f"{c.schedule}, microbatch size {c.microbatch_size}, recompute {c.recompute}); "
            f"use --gpu-memory {fmt_gib(need, up=True)} or more, or more --gpus",
            need, best)

    def _memory_bound(self, c: Config) -> float:
        """No cut holds less than its weights spread evenly (two copies for DualPipe)."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        copies = 2 if c.schedule == "dualpipe" else 1
        return copies * self.req.bytes_per_param * float(lc.params.sum()) / c.pp

    def memory_bound(self, c: Config, sched: Schedule) -> float:
        """No cut's busiest rank holds less: ``(weights of every stage + sum over stages of
        held_s x M_B(s)) / pp``, where ``held_s`` counts microbatches from F to their first
        backward (all of M_B is held then, and the rank holds at least that stage's share at
        its peak), bounded below by ``min_s held_s x`` (activation bytes of the model)."""
        lc = self.p.at(c.microbatch_size, c.recompute)
        held = min(self.held(sched, ("B", "I")))
        per_rank = sched.num_stages // c.pp
        weights = sched.chains * self.req.bytes_per_param * float(lc.params.sum())
        return (weights + held * sched.chains * float(lc.act.sum()) / per_rank) / c.pp


def _auto_function():
    try:
        from ..schedules.auto import auto_schedule  # written beside this planner
    except ImportError:
        return None
    return auto_schedule


def fmt_gib(n: float, up: bool = False) -> str:
    """Bytes as GiB with 2 decimals; ``up``: rounded up, so the value shown always fits."""
    g = n / 2**30
    g = math.ceil(g * 100 - 1e-9) / 100 if up else round(g, 2)
    return f"{g:.2f}GiB"
