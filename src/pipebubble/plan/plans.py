"""The planner's vocabulary: what it is asked (Request), what it tries (Config), what it
returns (Plan, Result), and the error when nothing fits (NoPlanFits).

See :mod:`pipebubble.plan.planner` for the search itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from .. import limits
from ..costs import CostModel
from ..errors import UserError, param
from ..ir.schedule import Schedule
from ..params import check_real
from .dims import ParallelDims
from .partition import Ranges
from .shardings import Sharding

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
    exposed: list[float]  # per rank: data-parallel traffic that does not hide (seconds)
    rank_params: list[float]  # per rank: parameters of its stages (local, after TP)
    rank_expert: list[float] | None = None  # per rank: of those, routed experts' (MoE)


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
    bytes_per_param: float = 16.0  # weights + gradients + optimizer, split 1/8 : 1/8 : 3/4
    grad_bytes: float = 4.0  # bytes of a gradient ON THE WIRE (plan --grad-wire-bytes)
    # (weights, gradients, optimizer: master + moments) bytes per parameter, instead of the
    # bytes_per_param split (plan --param-bytes, --grad-bytes, --optimizer-bytes; memory.py)
    state_bytes: tuple[float, float, float] | None = None
    precision: str = "bf16"  # bf16 or fp8: the blocks' GEMMs, and an FP8 weight copy
    p2p_bandwidth: float = 50e9
    allreduce_bandwidth: float = 50e9
    latency: float = 1e-5
    top: int = 5
    exhaustive_cuts: int = 64
    prune: bool = True  # False: bound nothing, simulate every configuration (a baseline)
    # The axes around the pipeline (None: search every value that divides).
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    sp: tuple[bool, ...] | None = None
    shardings: tuple[str, ...] | None = None  # None: ddp, zero1, zero2, fsdp (+ hsdp)
    fsdp_reshard: str = "auto"  # always, never, auto (plan.sharding: torchtitan's default)
    dp_overlap: bool = True  # data-parallel traffic behind compute (plan --dp-overlap)
    chunks: tuple[int, ...] | None = None  # None: every count up to max_chunks
    ep: tuple[int, ...] | None = None  # expert parallel (MoE; None: powers of 2, plan/expert)
    etp: tuple[int, ...] | None = None  # expert tensor parallel (MoE; None: 1 and tp)
    ep_from: str = "dp"  # the data-parallel ranks EP takes: dp (Megatron-Core), dp_shard
    # (torchtitan): plan/dims.py ParallelDims.ep_from, set by plan/frameworks.apply
    moe_imbalance: float | None = None  # busiest EP rank's tokens / mean (None: router's)
    moe_recipe: object = None  # plan.expert.MoERecipe: FP8 dispatch, casts, ... (None: off)
    config: tuple[str, ...] = ()  # the axes (and sharding) --config gave: errors name it
    # worker processes of the search (plan/search_pool.py): the same plans at any count;
    # 1 searches in this process
    jobs: int = 1

    def pp1_schedules(self, names: list[str], microbatches: int,
                      split_apart: bool = True) -> list[str]:
        """The schedules tried at pp = 1 with ``microbatches`` microbatches: one family per
        distinct order of the one rank (:func:`one_rank_order`), the standard family (1F1B)
        first, then in ``names``' order. Families whose orders are equal price equally
        (step and memory) and are shown once; the others are priced apart: GPipe holds every
        microbatch's activations (m > 1); ZB-H1 and ZB-H2 split each backward into I and W,
        which prices apart only where a backward hides something behind its W (TP's
        collectives: ``split_apart``); else I then W is B, and they are 1F1B's plan.
        A family that searches orders (``auto``) or has no one-stage schedule (interleaved,
        V placements: two stages a rank at least) only when no other one-chain family is
        (it then says why it has no plan)."""
        from ..schedules import STANDARD, lookup

        one = sorted((n for n in names if lookup(n).chains == 1), key=lambda n: n != STANDARD)
        out, seen = [], set()
        for n in one:
            if lookup(n).searched:
                continue
            key = one_rank_order(n, microbatches, split_apart)
            if key is not None and key not in seen:  # None: no one-stage schedule at all
                seen.add(key)
                out.append(n)
        return out or one[:1]

    def model_states(self) -> tuple[float, float, float]:
        """``(w, g, o)`` bytes per parameter (:func:`~pipebubble.plan.memory.model_states`):
        ``state_bytes``, else ``bytes_per_param`` split 1/8 : 1/8 : 3/4; the FP8 weight copy
        in ``w`` under ``precision`` fp8."""
        from .memory import model_states

        b = self.bytes_per_param
        w, g, o = self.state_bytes if self.state_bytes is not None else (b / 8, b / 8,
                                                                          b * 3 / 4)
        return model_states(w, g, o, self.precision)

    def check(self) -> None:
        for name in ("gpus", "global_batch", "max_chunks", "top", "jobs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{param(name)} must be an integer >= 1, got {v!r}")
        limits.check_plan(self.gpus, self.global_batch, self.microbatch_sizes)  # the bounds
        limits.check_count(self.max_chunks, "max_chunks", 1, limits.MAX_CHUNKS)
        limits.check_count(self.exhaustive_cuts, "exhaustive_cuts", 0,
                           limits.MAX_EXHAUSTIVE_CUTS)
        for name in ("p2p_bandwidth", "allreduce_bandwidth", "bytes_per_param", "latency"):
            check_real(getattr(self, name), name)  # params.REALS
        if not (self.gpu_memory > 0 and math.isfinite(self.gpu_memory)):  # after --reserve
            raise UserError(f"{param('gpu_memory')} must be a finite number > 0, got "
                             f"{self.gpu_memory!r}")
        from .sharding import check_reshard

        check_reshard(self.fsdp_reshard)
        if not isinstance(self.dp_overlap, bool):
            raise UserError(f"{param('dp_overlap')} must be on or off, got {self.dp_overlap!r}")
        if not (self.grad_bytes >= 0 and math.isfinite(self.grad_bytes)):
            raise UserError(f"{param('grad_bytes')} must be >= 0, got {self.grad_bytes!r}")
        self.model_states()  # each state's bytes > 0 and finite, the precision known
        if not self.microbatch_sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1
                for s in self.microbatch_sizes):
            raise UserError(f"{param('microbatch_sizes')} must be integers >= 1, got "
                             f"{list(self.microbatch_sizes)}")


@dataclass(frozen=True)
class Config:
    """One configuration the search tries: its degrees (:class:`~pipebubble.plan.dims.
    ParallelDims`: tp, sp, cp, pp and dp split into replicas x shards by the sharding), the
    sharding, and the pipeline's microbatching, schedule and recomputation."""

    dims: ParallelDims
    microbatch_size: int
    microbatches: int
    schedule: str
    chunks: int
    recompute: str
    bound: float  # no cut of this configuration takes less (seconds)
    sharding: Sharding = Sharding.DDP  # or its name

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", Sharding.of(self.sharding))

    # The degrees, read through the dims.
    pp = property(lambda self: self.dims.pp)
    dp = property(lambda self: self.dims.dp)
    tp = property(lambda self: self.dims.tp)
    sp = property(lambda self: self.dims.sp)
    cp = property(lambda self: self.dims.cp)


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
    dp_exposed: float = 0.0  # the data-parallel traffic that shows in the step (largest rank)
    optimizer_time: float = 0.0  # the optimizer step (plan/optimizer.py; largest rank)
    static: list[float] = field(default_factory=list)  # per rank: model states + transient
    memory: list[dict] = field(default_factory=list)  # per rank: the peak's breakdown (bytes)
    fsdp_reshard: str = ""  # fsdp / hsdp: always or never, as priced (plan.sharding)
    moe: bool = False  # a mixture-of-experts model's plan (routed experts priced)

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
    tp = property(lambda self: self.config.tp)
    sp = property(lambda self: self.config.sp)
    cp = property(lambda self: self.config.cp)
    sharding = property(lambda self: self.config.sharding)
    dims = property(lambda self: self.config.dims)

    @property
    def gpus(self) -> int:
        return self.config.dims.world

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
        return {**c.dims.as_json(), "sharding": str(c.sharding), "chunks": c.chunks,
                "placement": placement_name(self.stage_to_rank, c.pp),
                "schedule": c.schedule, "microbatch_size": c.microbatch_size,
                "microbatches": c.microbatches, "recompute": c.recompute,
                "stages": self.stages(), "predicted_step_time": self.step_time,
                "pipeline_step_time": self.pipeline_time,
                "allreduce_time": self.allreduce_time, "dp_exposed_time": self.dp_exposed,
                "optimizer_time": self.optimizer_time,
                "p2p_time": self.comm,
                "samples_per_second": self.samples_per_second,
                "bubble_fraction": self.bubble_fraction, "peak_memory": self.peak_memory,
                "memory": self.memory, "cut_search": self.cut_search,
                **({"fsdp_reshard": self.fsdp_reshard} if self.fsdp_reshard else {})}


@dataclass
class Result:
    plans: list[Plan]
    searched: int  # configurations considered (bounded, generated, or simulated)
    simulated: int  # simulations run (one per cut scored)
    seconds: float
    request: Request
    auto_runs: int = 0  # searches of the automatic scheduler (``auto``)
    auto_seconds: float = 0.0  # the time they took
    sides: dict = field(default_factory=dict)  # a side's name -> its fastest plan or None



def placement_name(stage_to_rank: tuple[int, ...], ranks: int) -> str:
    """``loop`` (stage s on rank s mod p), ``v`` (rank r holds r and 2p-1-r, ...) or
    ``custom``."""
    S = len(stage_to_rank)
    if all(r == s % ranks for s, r in enumerate(stage_to_rank)):
        return "loop"
    v = [s % ranks if (s // ranks) % 2 == 0 else ranks - 1 - s % ranks for s in range(S)]
    return "v" if list(stage_to_rank) == v else "custom"


def fmt_gib(n: float, up: bool = False) -> str:
    """Bytes as GiB with 2 decimals; ``up``: rounded up, so the value shown always fits."""
    g = n / 2**30
    g = math.ceil(g * 100 - 1e-9) / 100 if up else round(g, 2)
    return f"{g:.2f}GiB"


@lru_cache(maxsize=1024)
def one_rank_order(name: str, microbatches: int, split_apart: bool = True
                   ) -> tuple[str, ...] | None:
    """The family's order at pp = 1 (one stage, ``microbatches`` microbatches) as its actions
    in turn (``0F0 0B0 0F1 ...``), None where the family has no such schedule. Equal orders
    are the same plan: :meth:`Request.pp1_schedules` tries one family of each. Without
    ``split_apart`` (a backward hides nothing behind its W) an I followed at once by its W
    is written as the B it adds up to.

    >>> one_rank_order("1f1b", 2), one_rank_order("gpipe", 2)
    (('0F0', '0B0', '0F1', '0B1'), ('0F0', '0F1', '0B0', '0B1'))
    >>> one_rank_order("gpipe", 1) == one_rank_order("1f1b", 1)
    True
    >>> one_rank_order("zb-h1", 1), one_rank_order("zb-h1", 1, split_apart=False)
    (('0F0', '0I0', '0W0'), ('0F0', '0B0'))
    """
    from ..ir.schedule import ScheduleError, step_actions
    from ..schedules import get_schedule

    try:
        sched = get_schedule(name, 1, microbatches, 1)
    except ScheduleError:
        return None
    out: list = []
    for a in (a for o in sched.orders for st in o for a in step_actions(st)):
        if not split_apart and a.kind == "W" and out and out[-1] == a._replace(kind="I"):
            out[-1] = a._replace(kind="B")  # I then its W: the B they add up to
        else:
            out.append(a)
    return tuple(map(str, out))
