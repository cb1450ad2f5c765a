"""The planner's vocabulary: what it is asked (Request), what it tries (Config), what it
returns (Plan, Result), and the error when nothing fits (NoPlanFits).

See :mod:`pipebubble.plan.planner` for the search itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import limits
from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import Schedule
from .partition import Ranges

AUTO = "auto"
CUT_SEARCH = {
    "exhaustive": "every cut scored: the fastest cut that fits (exact)",
    "min-max": "the min-max cut of the per-rank work, or its rank-balanced refinement "
               "(the faster that fits); other cuts are not scored",
    "min-max-capped": "the min-max cut under per-stage memory caps (no min-max cut fits); "
                      "other cuts are not scored",
}
"""What a plan's ``cut_search`` says about its cut (:mod:`pipebubble.plan.planner`)."""


@dataclass(frozen=True)
class Priced:
    ranges: Ranges
    costs: CostModel
    bound: float  # no order of this cut finishes sooner (seconds)
    static: list[float]  # per rank: weights, gradients, optimizer state, transient bytes


class NoPlanFits(UserError):
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
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        limits.check_plan(self.gpus, self.global_batch, self.microbatch_sizes)  # the bounds
        limits.check_count(self.max_chunks, "--max-chunks", 1, limits.MAX_CHUNKS)
        limits.check_count(self.exhaustive_cuts, "--exhaustive-cuts", 0,
                           limits.MAX_EXHAUSTIVE_CUTS)
        for name in ("gpu_memory", "p2p_bandwidth", "allreduce_bandwidth", "bytes_per_param"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise UserError(f"--{name.replace('_', '-')} must be a finite number > 0, "
                                 f"got {v!r}")
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise UserError(f"--latency must be a finite number >= 0 seconds, got "
                             f"{self.latency!r}")
        if not (self.grad_bytes >= 0 and math.isfinite(self.grad_bytes)):
            raise UserError(f"--grad-bytes must be >= 0, got {self.grad_bytes!r}")
        if not self.microbatch_sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1
                for s in self.microbatch_sizes):
            raise UserError(f"--microbatch-size must be integers >= 1, got "
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
    cut_search: str = "exhaustive"  # how its cut was chosen: CUT_SEARCH

    @property
    def needs(self) -> float:
        """The least --gpu-memory at which the planner finds this plan."""
        return max(max(self.peak_memory), self.budget or 0.0)

    # The configuration's fields, read through the plan.
    pp = property(lambda self: self.config.pp)
    dp = property(lambda self: self.config.dp)
    schedule = property(lambda self: self.config.schedule)
    chunks = property(lambda self: self.config.chunks)
    microbatch_size = property(lambda self: self.config.microbatch_size)
    microbatches = property(lambda self: self.config.microbatches)
    recompute = property(lambda self: self.config.recompute)

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
                "bubble_fraction": self.bubble_fraction, "peak_memory": self.peak_memory,
                "cut_search": self.cut_search}


@dataclass
class Result:
    plans: list[Plan]
    searched: int  # configurations considered (bounded, generated, or simulated)
    simulated: int  # simulations run (one per cut scored)
    seconds: float
    request: Request



def fmt_gib(n: float, up: bool = False) -> str:
    """Bytes as GiB with 2 decimals; ``up``: rounded up, so the value shown always fits."""
    g = n / 2**30
    g = math.ceil(g * 100 - 1e-9) / 100 if up else round(g, 2)
    return f"{g:.2f}GiB"
