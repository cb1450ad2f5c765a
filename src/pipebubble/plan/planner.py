"""Choose pp, dp, microbatch size, schedule, chunks and recomputation under a memory budget,
at every point of tp, sp, cp and sharding around the pipeline.

:func:`search` builds the points (:func:`build_points`: per (tp, sp, cp) the layers priced by
the compute model on a GPU preset, :mod:`pipebubble.plan.parallel_costs`, or the profile's own
times without ``--gpu``; per sharding the model states and the data-parallel traffic,
:mod:`pipebubble.plan.axes`) and hands them to the loop in :mod:`pipebubble.plan.search`.
What follows is the pipeline part, the same at every point.

The planner is a loop around two exact pieces (DESIGN.md): the min-max partitioner and the
simulator. A *configuration* is (pp, dp = gpus / pp, microbatch size, schedule, chunks,
recompute); the global batch fixes ``m = global_batch / (dp x size)``. For each one:

1. **Cut** the layers into the schedule's stages. When there are at most ``exhaustive_cuts``
   ways to cut, every cut is scored; otherwise (a) the min-max cut of what each layer adds
   to its rank's step, ``m x (F + I + W)``
   (:func:`~pipebubble.plan.partition.min_max_partition`), and when ranks hold several
   stages its refinement by :func:`~pipebubble.plan.partition.balance_ranks` (the faster that
   fits); if neither fits, (b) the same
   with a memory cap per stage (``budget / stages per rank``; a stage's memory bound is its
   weights plus the most microbatches it holds at once times its activation bytes), which
   then fits by construction. ``auto`` is searched on the min-max cut (a) only. Each plan's
   ``cut_search`` says which it got (``exhaustive``, ``min-max``, ``min-max-capped``). When
   nothing fits, the error names the least budget at which some configuration has a plan:
   the least peak over every cut, or over cut (a) and (b) (bisection on the cap for (b)),
   and for ``auto`` its cut's static bytes plus one microbatch of each stage per rank
   (``schedules.auto.bounds.min_limits``: below it no order exists, at it one does).

What the search claims is exact for its candidates: the K fastest plans over every
configuration, each with the cuts above (every cut up to ``exhaustive_cuts``, the rule
beyond); ``tests/test_plan.py`` checks it against brute force over every configuration and
every cut (small instances) and over every candidate of the rule (beyond 64 cuts). The rule
is not a proof of the best cut: ``bench/bench_plan.py --cut-gap`` measures how far it is.
2. **Price** it: per stage F, I (recomputation included), W, activation bytes M_B and M_W;
   P2P time per hop on the link between the stages' ranks; the data-parallel traffic of the
   sharding (:mod:`pipebubble.plan.sharding`), overlapped with the rank's last backward
   (and first forward, for gathers).
3. **Simulate** it (:func:`pipebubble.plan.pipeline_axis.run_pipeline`): step time =
   ``max_r (end_r + exposed traffic_r)``; peak memory per rank = its weights, gradients and
   optimizer state under the sharding + the simulated activation peak + what
   recomputation re-materialises during one layer's backward. It fits if every rank's peak
   is within ``gpu_memory``.

Closed forms only prune, and only with true lower bounds: no configuration can take less
than its mean rank (``m x (F + I + W of the whole model) / pp``, the fill before each rank's
first stage and the optimizer step of ``1 / pp`` of the parameters) or one microbatch's way
through every layer and back (:mod:`pipebubble.plan.configs`), nor less than the min-max
cut's slowest stage (every cut has a stage at least that slow), nor less than any rank's
work after the cut plus the fill before it and the drain after it, its exposed traffic and
its optimizer step (:mod:`pipebubble.plan.cut_price`; on the family's placement alone, before
its schedule is generated, when every cut is scored). A cut that cannot win on time is ruled
out on memory from its order alone (:mod:`pipebubble.plan.memory_bounds`), never simulated.
Configurations whose bound passes the K-th best step found so far are skipped; a rough
estimate of their step (the mean work and a 1F1B-like bubble) only orders the visit.

Four equal layers (F = 1 s, B = 2 s per microbatch, no weights) on 2 GPUs, global batch 4:
pp = 1, dp = 2 runs m = 2 microbatches in 2 x 4 x 3 = 24 s; pp = 2 (1F1B, two layers per
stage, m = 4) takes (m + p - 1)(F + B) = 5 x 6 = 30 s.

>>> from pipebubble.plan.profile import Profile
>>> layer = {"forward": 1, "backward": 2, "params": 0, "activation_bytes": 0, "flops": 0}
>>> prof = Profile.from_dict({"batch": 1, "layers": [{"name": str(i), **layer}
...                                                   for i in range(4)]})
>>> res = search(ProfileSet([prof]), Request(gpus=2, gpu_memory=1, global_batch=4,
...              microbatch_sizes=(1,), schedules=("1f1b",), recompute=("none",), latency=0,
...              shardings=("ddp",)))
>>> [(p.pp, p.dp, p.microbatches, p.step_time) for p in res.plans]
[(1, 2, 2, 24.0), (2, 1, 4, 30.0)]
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError, marked, param
from .analytic import TransformerShape
from .axes import Axes, Point, axis_flag, splits
from .compute import Rates
from .dims import ParallelDims
from .expert import (
    check_ep_splits,
    check_imbalance,
    ep_options,
    etp_search,
    moe_shape_of,
    point_costs,
)
from .families import _auto_function, chunk_options, held_per_stage, schedule_list
from .hardware import Hardware
from .layercosts import ProfileSet
from .network import Network
from .plans import Config, NoPlanFits, Plan, Request, Result, fmt_gib
from .scoring import Searcher, legacy_axes
from .search import plan_order, search_points
from .shardings import SHARDINGS, Sharding

__all__ = ["Config", "NoPlanFits", "Plan", "Request", "Result", "Searcher",
           "chunk_options", "fmt_gib", "held_per_stage", "plan_order", "schedule_list",
           "search", "_auto_function"]


# ---- the search ----------------------------------------------------------------------------

def search(profiles: ProfileSet, req: Request, hardware: Hardware | None = None,
           efficiency: float | None = None, mfu: float | None = None,
           keep: Callable[[Plan], bool] | None = None, sides: tuple = ()) -> Result:
    """The ``req.top`` fastest plans that fit, fastest first (see the module doc and
    :mod:`pipebubble.plan.search`). With ``hardware``, an analytic or HF profile is priced
    by the compute model at every (tp, sp, cp); without, the profile's own times are used
    (tp = cp = 1). With ``keep``, the fastest of the plans it keeps (e.g. those a
    framework runs). ``sides`` (:class:`~pipebubble.plan.visits.Side`): each one's fastest
    plan too, in ``Result.sides``."""
    req.check()
    return search_points(build_points(profiles, req, hardware, efficiency, mfu), req, keep,
                         sides)


def build_points(profiles, req: Request, hardware: Hardware | None = None,
                 efficiency: float | None = None, mfu: float | None = None) -> list:
    """``(point, layer costs, axes)`` for every (tp, sp, cp, sharding) the request allows,
    and for an MoE profile every ep (:mod:`pipebubble.plan.expert`: its layers, the
    all-to-all and the experts' states at each (tp, sp, cp, ep); docs/moe.md)."""
    shape, seq, flash = model_of(profiles)
    moe = moe_shape_of(profiles)  # an MoE profile: priced by plan/expert.py
    if moe is not None:
        shape, seq, flash = moe, int(profiles.metadata()["seq"]), profiles.metadata().get(
            "attention", "flash") == "flash"
    ep_list = ep_options(req, moe, hardware is not None)
    check_imbalance(req.moe_imbalance)
    shardings = [Sharding.of(s) for s in  # one line for an unknown name
                 req.shardings or (SHARDINGS if hardware is not None else SHARDINGS[:4])]
    if req.precision != "bf16" and (hardware is None or shape is None):
        raise UserError(f"{param('precision')} {req.precision} prices the GEMMs from the model's "
                         f"shape: it needs {param('hardware')} and an analytic or HF-config "
                         "profile (a "
                         "measured profile's times are already in its precision)")
    if hardware is None or shape is None:
        asked = [axis_flag(req, k, v) for k, v in (("tp", req.tp), ("cp", req.cp),
                                                    ("ep", req.ep), ("etp", req.etp))
                 if v is not None and tuple(v) != (1,)]
        if asked:
            why = ("needs --gpu (the compute model prices TP and CP)" if hardware is None
                   else "needs an analytic or --hf-config profile (this one is measured)")
            raise UserError(f"{' and '.join(asked)} {why}")
        if req.sp and True in req.sp:
            raise UserError(f"{param('sp')} 1 needs {param('tp')} > 1 (sequence parallelism "
                            "splits TP's replicated activations)")
        splits(req, (1,), (1,))  # --pp and --dp together with --gpus
        out = []
        for s in shardings:
            pt = Point(ParallelDims(), s)
            axes = legacy_axes(req, pt) if hardware is None else hardware_axes(req, pt,
                                                                               hardware)
            out.append((pt, profiles, axes))
        return out
    rates = Rates.of(hardware, efficiency, req.precision, mfu)
    net = Network.of(hardware)
    check_degrees(req, shape.heads, shape.kv, seq)
    tps = tuple(d for d in range(1, hardware.gpus_per_node + 1)  # powers of two in a node
                if shape.heads % d == 0 and d & (d - 1) == 0 and _kv_even(shape.kv, d))
    cps = tuple(d for d in (1, 2, 4, 8) if seq % d == 0)
    out = []
    points = sorted({(tp, cp) for tp, cp, _, _ in splits(req, tps, cps)})
    stages = {ParallelDims(tp=tp, cp=cp, dp_shard=dp).stage_ranks
              for tp, cp, _, dp in splits(req, tps, cps)}  # Megatron's expert mesh: etp | these
    etp_list = etp_search(req, moe, tuple(sorted({tp for tp, _ in points})),
                          tuple(sorted(stages)))
    check_ep_splits(req, ep_list, splits(req, tps, cps), shardings, hardware.gpus_per_node,
                    etp_list)
    for tp, cp in points:
        sps = req.sp or ((False, True) if tp > 1 else (False,))
        for sp in sps:
            if sp and tp == 1:
                if req.sp == (True,) and req.tp is not None and req.tp == (1,):
                    raise UserError(f"{param('sp')} 1 needs tp > 1 "
                                    f"({axis_flag(req, 'tp', req.tp)})")
                continue
            for ep, etp, costs in point_costs(shape, seq, rates, net, tp, sp, cp, flash,
                                              profiles, ep_list, req.moe_imbalance,
                                              req.moe_recipe, etp_list, bool(req.etp)):
                for s in shardings:  # the stage's dims check etp against the split (Axes)
                    pt = Point(ParallelDims(tp=tp, cp=cp, sp=sp, ep_from=req.ep_from), s,
                               ep=ep, etp=etp)
                    out.append((pt, costs, hardware_axes(req, pt, hardware, mfu is None)))
    if req.etp and not out:  # every given etp differs from its tp > 1 without SP
        raise UserError(f"{axis_flag(req, 'etp', req.etp)} other than tp needs {param('sp')} "
                        "1 (Megatron-Core trains MoE layers with TP only under sequence "
                        "parallelism, each rank dispatching its sequence shard); give an etp "
                        "equal to tp or allow sp 1")
    if not out:  # only --sp 1 empties it: every tp the split leaves is 1
        given = "".join(f", {axis_flag(req, a, getattr(req, a))}"
                        for a in ("tp", "cp", "pp", "dp") if getattr(req, a))
        raise UserError(f"{param('sp')} 1 needs tp > 1, but {param('gpus')} {req.gpus}{given} "
                        f"leave{'' if given else 's'} only tp 1")
    return out


def _kv_even(kv: int, tp: int) -> bool:
    """K/V heads split evenly over ``tp`` ranks, or each replicated on a whole number."""
    return kv % tp == 0 or tp % kv == 0


def check_degrees(req: Request, heads: int, kv: int, seq: int) -> None:
    """Every given tp divides the attention heads (and splits or replicates the K/V heads
    evenly), every given cp the sequence: one line naming the value and what is valid."""
    for tp in req.tp or ():
        if heads % tp or not _kv_even(kv, tp):
            valid = [d for d in range(1, heads + 1)
                     if heads % d == 0 and _kv_even(kv, d) and req.gpus % d == 0]
            what = (f"does not divide the model's {heads} attention heads" if heads % tp else
                    f"neither divides nor is a multiple of the model's {kv} K/V heads")
            raise UserError(f"{axis_flag(req, 'tp', [tp])} {what}; valid are "
                            f"{', '.join(map(str, valid))}")
    for cp in req.cp or ():
        if seq % cp:
            raise UserError(f"{axis_flag(req, 'cp', [cp])} does not divide the sequence length "
                            f"{seq}; valid are divisors of {seq} (1, 2, 4, ...)")


def hardware_axes(req: Request, pt: Point, hw: Hardware, hbm: bool = True) -> Axes:
    """The axes on a GPU preset: the two-level network, the model states
    ``req.model_states()`` (memory.py), the optimizer step on its HBM (not with ``hbm`` off:
    ``--mfu``)."""
    return Axes(pt, Network.of(hw), req.model_states(), req.grad_bytes,
                hbm=hw.hbm_bandwidth if hbm else 0.0, reshard=req.fsdp_reshard,
                dp_overlap=req.dp_overlap)


def model_of(profiles) -> tuple[TransformerShape | None, int | None, bool]:
    """The transformer shape, sequence length and attention kind of an analytic (or HF)
    profile; ``(None, None, True)`` for a measured one."""
    meta = profiles.metadata()
    model = meta.get("model")
    if meta.get("source") != "analytic" or not isinstance(model, dict):
        return None, None, True
    try:
        shape = TransformerShape(**model)
    except TypeError as exc:
        raise UserError(f"the profile's 'model' entry is not a transformer shape ({marked(exc)})"
                        ) from None
    if len(profiles) != shape.layers + 2:
        return None, None, True
    return shape, int(meta["seq"]), meta.get("attention", "flash") == "flash"
