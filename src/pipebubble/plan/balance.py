"""Balance pipeline stages: cut a profiled model by a method, score each cut by simulation.

Methods (what each layer weighs when cutting):

- ``uniform``: 1 per layer (equal layer counts, what a naive config does);
- ``params``: parameter count (equal memory for weights, *not* equal work: an embedding has
  many parameters and almost no compute);
- ``flops``: forward + backward FLOPs from the profile;
- ``time``: measured forward + backward seconds.

Every method uses the exact min-max partitioner (:mod:`pipebubble.plan.partition`) on its own
weights; memory caps apply to all of them. The extra first/last-stage costs are seconds and
apply to ``time`` (and to ``flops`` converted at the profile's FLOPs per second); when a cut
is scored they are added to its first/last stage, one third to F and two thirds to B.

A cut is then *scored* the same way for every method: its stages' measured forward and
backward times become a per-stage :class:`~pipebubble.costs.CostModel`, the chosen schedule
is simulated, and the plan reports step time, bubble and per-rank peak memory (weights at
``bytes_per_param`` plus the simulated activation peak). With ``top > 0`` the ``time+sim``
plan simulates a few optimal and near-optimal time cuts and keeps the fastest step: the
slowest stage sets the steady state, but fill and drain depend on the others too.

Stage memory for caps: ``bytes_per_param x params + in-flight x activation_bytes``, where
in-flight is the most microbatches the schedule keeps on that stage at once (1F1B: p - r on
rank r; GPipe: m). Default 16 bytes per parameter: fp32 weights, gradients, two Adam moments.

>>> from pipebubble.plan.profile import LayerProfile, Profile
>>> prof = Profile([LayerProfile(str(i), f, 2 * f, n, 0, 0) for i, (f, n) in
...                 enumerate([(0.0, 100), (1.0, 10), (1.0, 10), (1.0, 10), (2.0, 50)])])
>>> plans = balance(prof, Options(ranks=2, microbatches=4), methods=("params", "time"))
>>> [(p.method, p.ranges, p.bottleneck) for p in plans]
[('params', [(0, 0), (1, 4)], 15.0), ('time', [(0, 2), (3, 4)], 9.0)]
>>> [p.predicted_step_time for p in plans]   # 1F1B, m=4: (m - 1) x 9 + 6 + 9 = 42
[60.0, 42.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import median

from ..costs import CostModel
from ..cut_rule import Cut
from ..errors import marked
from ..ir.schedule import Schedule, step_actions
from ..schedules import STANDARD, get_schedule
from ..sim.kernel import simulate
from ..timeline import Timeline
from .calibrate import stage_times
from .partition import PartitionError, Ranges, check_stage_count, min_max_partition
from .profile import LayerProfile, Profile

METHODS = ("uniform", "params", "flops", "time")
SIM_METHOD = "time+sim"


@dataclass(frozen=True)
class Options:
    """How to cut and how to score. ``memory_cap``: bytes, a scalar or one per stage."""

    ranks: int
    chunks: int = 1
    schedule: str = STANDARD
    microbatches: int = 8
    memory_cap: float | Sequence[float] | None = None
    bytes_per_param: float = 16.0
    first_extra: float = 0.0
    last_extra: float = 0.0
    comm: float = 0.0
    w_fraction: float = 0.5

    @property
    def stages(self) -> int:
        return self.ranks * self.chunks


@dataclass(frozen=True)
class Stage:
    index: int
    rank: int
    first_layer: int
    last_layer: int
    forward: float  # seconds per microbatch, first/last-stage extras included
    backward: float
    params: int
    flops: float
    activation_bytes: float
    inflight: int
    memory: float  # bytes: bytes_per_param x params + inflight x activation_bytes

    @property
    def time(self) -> float:
        return self.forward + self.backward

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.last_layer + 1)

    def as_json(self) -> dict:
        return {"first_layer": self.first_layer, "last_layer": self.last_layer,
                "time": self.time, "params": self.params, "memory": self.memory,
                "rank": self.rank, "forward": self.forward, "backward": self.backward,
                "flops": self.flops, "activation_bytes": self.activation_bytes}


@dataclass
class Plan:
    """One cut of the model and what the simulator predicts for it."""

    method: str
    stages: list[Stage]
    options: Options
    timeline: Timeline | None = field(default=None, repr=False)
    peak_memory: list[float] = field(default_factory=list)  # per rank, bytes
    chains: int = 1  # model copies (DualPipe: 2, each cut the same way)

    @property
    def ranges(self) -> Ranges:
        """The cut of one model copy (``stages`` lists every copy's stages)."""
        return [(s.first_layer, s.last_layer)
                for s in self.stages[:len(self.stages) // self.chains]]

    @property
    def bottleneck(self) -> float:
        """The slowest stage's forward + backward time."""
        return max(s.time for s in self.stages)

    @property
    def predicted_step_time(self) -> float | None:
        return None if self.timeline is None else self.timeline.step_time

    @property
    def bubble_fraction(self) -> float | None:
        return None if self.timeline is None else self.timeline.bubble_fraction

    def cost_model(self) -> CostModel:
        """Per-stage costs: F and B measured, W a fraction of B, activation bytes as M_B."""
        o = self.options
        return CostModel(
            f=[s.forward for s in self.stages], b=[s.backward for s in self.stages],
            w=[o.w_fraction * s.backward for s in self.stages], comm=o.comm,
            activation_memory=[s.activation_bytes for s in self.stages],
        )

    def as_json(self) -> dict:
        o = self.options
        return {
            "method": self.method,
            "boundaries": Cut.of_ranges(self.ranges, self.method).boundaries,  # run's flag
            "stages": [s.as_json() for s in self.stages],
            "bottleneck": self.bottleneck,
            "predicted_step_time": self.predicted_step_time,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory": self.peak_memory,
            "schedule": o.schedule, "ranks": o.ranks, "chunks": o.chunks,
            "microbatches": o.microbatches,
        }


def inflight_per_stage(schedule: Schedule) -> list[int]:
    """Most microbatches each stage holds at once (F done, backward not yet freed them).

    >>> inflight_per_stage(get_schedule("1f1b", ranks=4, microbatches=8))
    [4, 3, 2, 1]
    """
    peak = [0] * schedule.num_stages
    cur = [0] * schedule.num_stages
    for r in range(schedule.num_ranks):
        for step in schedule.orders[r]:
            for a in step_actions(step):
                if a.kind == "F":
                    cur[a.stage] += 1
                    peak[a.stage] = max(peak[a.stage], cur[a.stage])
                elif a.kind in ("B", "I"):
                    cur[a.stage] -= 1
    return peak


def layer_weights(profile: Profile, method: str) -> list[float]:
    """What each layer weighs for ``method``."""
    if method == "uniform":
        return [1.0] * len(profile)
    if method == "params":
        return profile.column("params")
    if method == "flops":
        return profile.column("flops")
    if method in ("time", SIM_METHOD):
        return profile.column("time")
    raise PartitionError(f"unknown method {method!r}; valid are {', '.join(METHODS)}")


def cut(profile: Profile, method: str, options: Options, schedule: Schedule | None = None,
        tie_break: str = "balanced", slack: float = 0.0) -> Ranges:
    """Cut ``profile`` into ``options.stages`` stages by ``method`` (exact min-max)."""
    weights = layer_weights(profile, method)
    first = last = 0.0
    if method in ("time", SIM_METHOD):
        first, last = options.first_extra, options.last_extra
    elif method == "flops":
        total_time = sum(profile.column("time"))
        rate = sum(weights) / total_time if total_time > 0 else 0.0
        first, last = options.first_extra * rate, options.last_extra * rate
    memory = None
    if options.memory_cap is not None:
        schedule = schedule or make_schedule(options)
        inflight = inflight_per_stage(schedule)
        bpp = options.bytes_per_param
        memory = [[bpp * layer.params + k * layer.activation_bytes for layer in profile.layers]
                  for k in inflight]
    try:
        return min_max_partition(weights, options.stages, first_extra=first, last_extra=last,
                                 memory=memory, memory_cap=options.memory_cap,
                                 tie_break=tie_break, slack=slack)
    except PartitionError as exc:
        if memory is None:
            raise
        raise PartitionError(f"{method}: {marked(exc)} (memory in bytes, at "
                             f"{options.bytes_per_param:g} bytes per parameter plus in-flight "
                             "activations)") from None


def make_schedule(options: Options) -> Schedule:
    chunks = options.chunks if options.chunks > 1 else None
    return get_schedule(options.schedule, options.ranks, options.microbatches, chunks)


def make_plan(profile: Profile, ranges: Ranges, method: str, options: Options,
              schedule: Schedule | None = None, score: bool = True) -> Plan:
    """Stage statistics for a cut, and (``score``) the simulated step of ``schedule``."""
    schedule = schedule or make_schedule(options)
    if schedule.chains > 1 and len(ranges) * schedule.chains == schedule.num_stages:
        ranges = list(ranges) * schedule.chains  # DualPipe: each chain is a whole model copy
    if schedule.num_stages != len(ranges):
        raise PartitionError(f"schedule {schedule.name} has {schedule.num_stages} stages, "
                             f"the cut has {len(ranges)}")
    inflight = inflight_per_stage(schedule)
    stages = []
    for k, (a, b) in enumerate(ranges):
        layers: list[LayerProfile] = profile.layers[a:b + 1]
        extra = (options.first_extra if k == 0 else 0.0) + (
            options.last_extra if k == len(ranges) - 1 else 0.0)
        params = sum(x.params for x in layers)
        act = sum(x.activation_bytes for x in layers)
        stages.append(Stage(
            k, schedule.stage_to_rank[k], a, b,
            sum(x.forward for x in layers) + extra / 3, sum(x.backward for x in layers)
            + 2 * extra / 3, params, sum(x.flops for x in layers), act, inflight[k],
            options.bytes_per_param * params + inflight[k] * act,
        ))
    plan = Plan(method, stages, options, chains=schedule.chains)
    if score:
        plan.timeline = simulate(schedule, plan.cost_model())
        weights = [0.0] * options.ranks
        for s in stages:
            weights[s.rank] += options.bytes_per_param * s.params
        plan.peak_memory = [w + st.peak_memory for w, st in
                            zip(weights, plan.timeline.rank_stats(), strict=True)]
    return plan


def balance(profile: Profile, options: Options, methods: Sequence[str] = METHODS,
            top: int = 0, schedule: Schedule | None = None) -> list[Plan]:
    """One scored plan per method; with ``top > 0`` also ``time+sim`` (see module doc).

    ``schedule`` overrides the one ``options`` names (any Schedule with ranks x chunks
    stages, e.g. one built by hand or imported).
    """
    for m in methods:
        layer_weights(profile, m)  # reject unknown methods before any work
    check_stage_count(len(profile), options.stages)  # the one line of every command
    schedule = schedule or make_schedule(options)
    plans = [make_plan(profile, cut(profile, m, options, schedule), m, options, schedule)
             for m in methods if m != SIM_METHOD]
    if top > 0 or SIM_METHOD in methods:
        plans.append(best_by_simulation(profile, options, schedule, top or 6))
    return plans


def best_by_simulation(profile: Profile, options: Options, schedule: Schedule | None = None,
                       top: int = 6) -> Plan:
    """Simulate up to ``top`` distinct optimal or near-optimal time cuts; keep the fastest.

    Candidates: the optimal bottleneck with each tie-break (balanced, early, late), then the
    balanced cut allowing 1%, 2%, 5%, 10% more bottleneck. Ties go to the smaller bottleneck.
    """
    schedule = schedule or make_schedule(options)
    seen, plans = set(), []
    for slack, tie in [(0.0, "balanced"), (0.0, "early"), (0.0, "late"), (0.01, "balanced"),
                       (0.02, "balanced"), (0.05, "balanced"), (0.1, "balanced")]:
        ranges = cut(profile, "time", options, schedule, tie_break=tie, slack=slack)
        if tuple(ranges) in seen:
            continue
        seen.add(tuple(ranges))
        plans.append(make_plan(profile, ranges, SIM_METHOD, options, schedule))
        if len(plans) >= top:
            break
    return min(plans, key=lambda p: (p.predicted_step_time, p.bottleneck))


def calibrate_profile(profile: Profile, ranges: Ranges,
                      timeline: Timeline | Sequence[Timeline]) -> Profile:
    """Spread each stage's measured F and B over its layers, in proportion to the profile.

    The result has the measured stage totals exactly (so simulating the old cut reproduces
    the measured stage times) and the profile's shape within each stage (equal shares where
    the profile has zero). Re-cutting it by ``time`` is a rebalance from a measured run.
    Several timelines (repeated steps) give the median over them of each stage's median.
    """
    timelines = [timeline] if isinstance(timeline, Timeline) else list(timeline)
    if not timelines:
        raise PartitionError("no measured timeline to calibrate from")
    for tl in timelines:
        if tl.num_stages != len(ranges):
            raise PartitionError(f"timeline has {tl.num_stages} stages, the cut has "
                                 f"{len(ranges)}")
    per_run = [_measured_f_b(tl) for tl in timelines]
    if all(not x for f, b_ in per_run for x in f + b_):  # every action took 0 s (or none ran)
        raise PartitionError("the measured timeline's actions all take 0 s (end == start): "
                             "there is no time to rebalance; measure a real run")
    layers = list(profile.layers)
    for k, (a, b) in enumerate(ranges):
        fs_k = [f[k] for f, _ in per_run if f[k] is not None]
        bs_k = [b_[k] for _, b_ in per_run if b_[k] is not None]
        if not fs_k or not bs_k:
            raise PartitionError(f"timeline has no forward or backward for stage {k}")
        fs = _spread(median(fs_k), [x.forward for x in layers[a:b + 1]])
        bs = _spread(median(bs_k), [x.backward for x in layers[a:b + 1]])
        for i, (fi, bi) in enumerate(zip(fs, bs, strict=True)):
            layers[a + i] = replace(layers[a + i], forward=fi, backward=bi)
    src = timelines[0]
    meta = {**profile.metadata,
            "calibrated_from": f"{len(timelines)} {src.source} {src.schedule} run(s)"}
    return Profile(layers, meta)


def _measured_f_b(timeline: Timeline) -> tuple[list[float | None], list[float | None]]:
    """Per stage: median F, and median B (or I + W when the backward was split)."""
    t = stage_times(timeline)
    b = [t["B"][k] if t["B"][k] is not None else
         (None if t["I"][k] is None else t["I"][k] + (t["W"][k] or 0.0))
         for k in range(timeline.num_stages)]
    return t["F"], b


def rebalance(profile: Profile, plan: Plan, timeline: Timeline | Sequence[Timeline],
              top: int = 0, schedule: Schedule | None = None) -> tuple[Profile, Plan, Plan]:
    """Re-cut from measured runs of ``plan``: (calibrated profile, old cut, new cut).

    Both cuts are scored on the calibrated profile, so the old one's predicted step uses the
    measured stage times and the difference is the predicted improvement. The first/last
    extras are dropped: the measured stage times already contain whatever they modelled.
    """
    calibrated = calibrate_profile(profile, plan.ranges, timeline)
    options = replace(plan.options, first_extra=0.0, last_extra=0.0)
    schedule = schedule or make_schedule(options)
    before = make_plan(calibrated, plan.ranges, f"{plan.method} (measured)", options, schedule)
    if top > 0:
        after = best_by_simulation(calibrated, options, schedule, top)
    else:
        after = make_plan(calibrated, cut(calibrated, "time", options, schedule), "time",
                          options, schedule)
    after.method = f"{after.method} (rebalanced)"
    return calibrated, before, after


def _spread(total: float, shares: list[float]) -> list[float]:
    s = sum(shares)
    if s <= 0:
        return [total / len(shares)] * len(shares)
    return [total * x / s for x in shares]
