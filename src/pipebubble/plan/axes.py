"""One point of the axes around the pipeline, and what the pipeline search asks about it.

A :class:`Point` is (tp, sp, cp, sharding); the pipeline search
(:class:`~pipebubble.plan.scoring.Searcher`) then chooses pp, dp = GPUs / (tp cp pp),
the microbatch size, schedule, chunks and recompute. What it needs from the point:

- :meth:`Axes.bytes_per_param`: model-state bytes per local parameter
  (:func:`~pipebubble.plan.memory.model_state_bytes`, over ``dp x cp`` ranks; FSDP's under
  its reshard policy at the plan's pp, :attr:`Axes.reshard`);
- :meth:`Axes.sync`: the data-parallel traffic and its overlap (:mod:`~pipebubble.plan.sharding`);
- :meth:`Axes.hop`: the link between consecutive pipeline stages, ``tp x cp x dp`` ranks apart
  (:mod:`~pipebubble.plan.network`: TP innermost, then CP, DP, PP outermost);
- :meth:`Axes.optimizer_time`: the Adam step of a rank's parameters under the sharding, at
  ``hbm`` bytes/s (:mod:`~pipebubble.plan.optimizer`; 0 without ``--gpu`` or under ``--mfu``);
- :meth:`Axes.tied_allreduce`: a tied embedding's gradient all-reduce between the first and
  the last pipeline stage (when they are on different ranks).

Without ``--gpu`` (a measured profile, or an analytic one at a fixed rate) the point is
tp = cp = 1 and the network one level: ``--allreduce-bandwidth`` for the data-parallel
collectives, ``--p2p-bandwidth`` between stages.

**The four degrees are chosen together** (:func:`splits`): tp x cp x pp x dp must equal the
GPUs, so the default list of every axis not given is what ``--gpus`` and the given axes leave
(``--gpus 2 --tp 1`` tries cp 1 and 2, never 4); a request that leaves nothing is one line
naming the flags given (``--tp``, ``--config tp=``), never a default value nobody asked for.

>>> class Req:  # the fields of a planner Request that splits reads
...     gpus, tp, cp, pp, dp, config = 2, (1,), None, None, None, ()
>>> sorted({(tp, cp) for tp, cp, _, _ in splits(Req(), tp=(1, 2, 4, 8), cp=(1, 2, 4, 8))})
[(1, 1), (1, 2)]
>>> Req.pp = (4,)
>>> try:
...     splits(Req(), tp=(1, 2), cp=(1, 2))
... except UserError as exc:
...     print(exc)
tp 1 x pp 4 = 4 GPUs does not divide gpus 2; tp x cp x pp x dp must equal gpus
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..errors import UserError, param
from ..limits import divisors
from .dims import ParallelDims
from .memory import model_state_bytes
from .network import Link, Network, allreduce
from .optimizer import step_time
from .sharding import Sync, resolve_reshard
from .shardings import Sharding


@dataclass(frozen=True)
class Point:
    """The degrees inside a pipeline stage (``dims``: tp, sp, cp; its pp and dp are the
    pipeline search's, 1 here) and the sharding."""

    dims: ParallelDims = ParallelDims()
    sharding: Sharding = Sharding.DDP  # or its name
    ep: int = 1  # expert parallel (MoE): set in dims once dp is known (plan/expert.py)
    etp: int | None = None  # expert tensor parallel (MoE; None: tp), with ep

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", Sharding.of(self.sharding))
        if self.etp is None:
            object.__setattr__(self, "etp", self.dims.tp)

    tp = property(lambda self: self.dims.tp)
    sp = property(lambda self: self.dims.sp)
    cp = property(lambda self: self.dims.cp)


@dataclass(frozen=True)
class Axes:
    point: Point
    net: Network
    state_bytes: tuple[float, float, float] = (2.0, 2.0, 12.0)  # weights, grads, optimizer
    grad_bytes: float = 4.0
    p2p: Link | None = None  # one link for every hop (no --gpu); None: the network's
    hbm: float = 0.0  # HBM bytes/s for the optimizer step; 0: not priced
    reshard: str = "auto"  # fsdp / hsdp: always, never or auto (plan --fsdp-reshard)
    dp_overlap: bool = True  # the once-a-step traffic behind compute (plan --dp-overlap)
    _dims: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    _syncs: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def keeps_weights(self, pp: int) -> bool:
        """Whether fsdp / hsdp hold the gathered weights across microbatches at ``pp``."""
        return (self.point.sharding.shards_params
                and resolve_reshard(self.reshard, pp) == "never")

    def dims(self, dp: int, pp: int = 1) -> ParallelDims:
        """The plan's degrees at ``dp`` and ``pp``: the point's, with ``dp`` split into
        replicas x shards as the sharding splits it (:meth:`~pipebubble.plan.shardings.
        Sharding.split_dp`)."""
        got = self._dims.get((dp, pp))
        if got is None:  # asked for in the hot loop: made (and validated) once
            pt = self.point
            replicate, shard = pt.sharding.split_dp(dp, pt.dims.model_parallel,
                                                    self.net.gpus_per_node)
            got = self._dims[(dp, pp)] = pt.dims.with_split(pp, replicate, shard, pt.ep,
                                                                   pt.etp)
        return got

    def ep_fits(self, dp: int) -> bool:
        """Whether the point's ``ep`` fits ``dp`` data-parallel ranks split by its sharding
        (EP is carved out of ``dp x cp``, or ``dp_shard x cp`` under torchtitan's rule and
        under HSDP: :class:`~pipebubble.plan.dims.ParallelDims` ``ep_from`` and
        ``hybrid``)."""
        pt = self.point
        if pt.ep == 1 and pt.etp == pt.dims.tp:
            return True
        replicate, shard = pt.sharding.split_dp(dp, pt.dims.model_parallel,
                                                self.net.gpus_per_node)
        return pt.dims.ep_fits(pt.ep, pt.dims.ep_data(replicate, shard), pt.etp)

    # -- the experts (MoE): sharded over EP, their states over the expert-data-parallel group
    def expert_shard(self, dp: int, pp: int = 1) -> int:
        """Ranks sharing the experts' states: the expert-data-parallel group, ``tp x cp x
        dp / (etp x ep)`` ranks; under hsdp torchtitan's ``efsdp``, ``tp x cp x dp_shard /
        (etp x ep)`` of them, the experts replicated over ``dp_replicate``
        (:attr:`~pipebubble.plan.dims.ParallelDims.efsdp`)."""
        return self.dims(dp, pp).efsdp

    def expert_bytes_per_param(self, dp: int, pp: int = 1) -> float:
        """Model-state bytes per local expert parameter: the sharding over the
        expert-data-parallel group (``tp x cp x dp / (etp x ep)`` ranks), not ``dp x cp``:
        replicated over it under ddp (EP over plain data-parallel ranks, Megatron-Core's
        folding), sharded under zero1/2 and fsdp (Megatron-Core's distributed optimizer
        shards expert states over its expert-data-parallel group), sharded over ``efsdp``
        under hsdp (:meth:`expert_shard`: ``(w + g + o) / efsdp``, ``w + g + o / efsdp``
        resharded ``never``)."""
        return model_state_bytes(self.point.sharding, max(self.expert_shard(dp, pp), 1),
                                 *self.state_bytes, keep=self.keeps_weights(pp))

    def expert_sync(self, dp: int, pp: int = 1) -> Sync:
        """The experts' gradient reduction (and gather) over their expert-data-parallel
        group, ``etp x ep`` ranks apart (``ParallelDims.group("edp")``). Under hsdp it is
        HSDP's over the experts' own mesh (torchtitan's ``edp_mesh`` ``["dp_replicate",
        "efsdp"]``): gathers and a reduce-scatter over ``efsdp`` (``etp x ep`` apart,
        inside the shard group's node), then an all-reduce of ``1 / efsdp`` of the
        gradient over ``dp_replicate`` (``tp x cp x dp_shard`` apart, one member a shard
        group: across nodes), per microbatch when the weights are resharded ``always``
        (:class:`~pipebubble.plan.sharding.Sync` with ``shard = efsdp``)."""
        key = ("experts", dp, pp)
        got = self._syncs.get(key)
        if got is None:
            d = self.dims(dp, pp)
            stride, n = d.group("edp")
            hybrid = self.point.sharding.hybrid and d.hybrid
            got = self._syncs[key] = Sync(self.point.sharding, self.net, n,
                                          self.grad_bytes, stride=stride,
                                          shard=d.efsdp if hybrid else 0,
                                          reshard=resolve_reshard(self.reshard, pp))
        return got

    def expert_optimizer_time(self, dp: int, params: float) -> float:
        """Seconds of the optimizer step of ``params`` local expert parameters (their shard
        of the expert-data-parallel group, of ``efsdp`` under hsdp)."""
        return step_time(params, self.point.sharding, max(self.expert_shard(dp), 1),
                         self.state_bytes, self.hbm)

    def shard(self, dp: int) -> int:
        """Ranks sharing the model states: ``dp x cp`` (hsdp: its shard group, ``dp_shard x
        cp`` as torchtitan shards, :attr:`~pipebubble.plan.dims.ParallelDims.shard_group`;
        0 if none)."""
        d = self.dims(dp)
        if self.point.sharding.hybrid:
            return d.shard_group if d.hybrid else 0
        return d.data_context

    def bytes_per_param(self, dp: int, pp: int = 1) -> float:
        n = self.shard(dp)
        return model_state_bytes(self.point.sharding, max(n, 1), *self.state_bytes,
                                 keep=self.keeps_weights(pp))

    def sync(self, dp: int, pp: int = 1) -> Sync:
        got = self._syncs.get((dp, pp))
        if got is None:  # asked for per cut priced: made once
            pt = self.point
            stride, n = self.dims(dp).group("dp_cp")
            got = self._syncs[(dp, pp)] = Sync(
                pt.sharding, self.net, n, self.grad_bytes, stride=stride,
                shard=self.shard(dp) if pt.sharding.hybrid else 0,
                reshard=resolve_reshard(self.reshard, pp), overlap=self.dp_overlap)
        return got

    def hop(self, dp: int, stages: int = 1) -> Link:
        """The link between a rank and the rank ``stages`` pipeline stages away (``tp x cp
        x dp`` ranks a stage; ``p2p`` when one link serves every hop)."""
        if self.p2p is not None:
            return self.p2p
        return self.net.hop(self.dims(dp).stage_distance(stages))

    def optimizer_time(self, dp: int, params: float) -> float:
        """Seconds of the optimizer step of a rank with ``params`` local parameters."""
        pt = self.point
        n = self.shard(dp)
        return step_time(params, Sharding.DDP if pt.sharding.hybrid and n == 0 else pt.sharding,
                         n, self.state_bytes, self.hbm)

    def tied_allreduce(self, dp: int, pp: int, params: float) -> float:
        """The all-reduce of a tied embedding's ``params`` gradients between the first and
        the last of ``pp`` stages (Megatron-LM's embedding group, after the data-parallel
        reduction and not overlapped), ``tp x cp x dp x (pp - 1)`` ranks apart."""
        if params <= 0 or pp <= 1:
            return 0.0
        return allreduce(self.grad_bytes * params, 2, self.hop(dp, pp - 1))

    def copy_allreduce(self, dp: int, pp: int, distance: int, params: float,
                       expert_params: float = 0.0) -> float:
        """The sum of two model copies' gradients (DualPipe's two chains) between a rank
        with ``params`` local parameters (``expert_params`` of them experts) and its partner
        ``distance`` stages away, after the data-parallel reduction and not overlapped.
        Each rank then holds its shard of the reduced gradient (``1 / (dp x cp)`` of it,
        the experts' ``1 / (dp x cp / ep)``; hsdp's shard group's and ``efsdp``'s shares;
        the whole gradient without data parallelism),
        and the two partners all-reduce that shard: what folding the partner into the
        reduction group (``2 x dp`` members instead of ``dp``) adds to a ring, too.

        >>> from pipebubble.plan.hardware import get_hardware
        >>> ax = Axes(Point(), Network.of(get_hardware("a100-80gb")))
        >>> t = ax.copy_allreduce(dp=8, pp=4, distance=3, params=1e9)  # 4 GB of fp32 grads
        >>> round(t * 1e3, 3)  # 4e9 / 8 bytes over one 25 GB/s NIC x 0.8, + 2 x 5 us
        25.01
        """
        if distance <= 0 or params <= 0:
            return 0.0
        d = self.dims(dp, pp)
        shard = self.shard(dp) if self.point.sharding.hybrid else d.data_context
        dense = (params - expert_params) / max(shard, 1)
        experts = expert_params / max(self.expert_shard(dp, pp), 1)
        return allreduce(self.grad_bytes * (dense + experts), 2, self.hop(dp, distance))


# ---- the degrees, chosen together -------------------------------------------------------------
AXIS_NAMES = ("tp", "cp", "pp", "dp")


def axis_flag(req, axis: str, values) -> str:
    """How the user gave ``axis``: ``--tp 1,2``, or ``--config tp=2`` when it came from
    ``--config`` (``req.config`` names the axes that did)."""
    text = ",".join(map(str, values))
    return (f"{param('config')} {axis}={text}" if axis in getattr(req, "config", ()) else
            f"{param(axis)} {text}")


def splits(req, tp: tuple[int, ...], cp: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Every ``(tp, cp, pp, dp)`` whose product is ``req.gpus``, each degree from its list:
    the given one (``req.tp`` ... ``req.dp``), else the default (``tp``, ``cp`` here: the
    degrees the model allows; pp and dp: every divisor). Raises one line naming only the
    given axes when none is left (see :func:`_nothing_left`)."""
    gpus = req.gpus
    lists = {"tp": req.tp or tp, "cp": req.cp or cp, "pp": req.pp, "dp": req.dp}
    every = divisors(gpus)
    out = []
    for a, b, c in itertools.product(lists["tp"], lists["cp"], lists["pp"] or every):
        if gpus % (a * b * c):
            continue
        d = gpus // (a * b * c)
        if lists["dp"] is None or d in lists["dp"]:
            out.append((a, b, c, d))
    if not out:
        raise UserError(_nothing_left(req, lists))
    return out


def _nothing_left(req, lists: dict) -> str:
    """Why no split is left: the given degrees alone do not divide the GPUs, or (pp and dp
    both given) what they leave for tp x cp is no product of the model's degrees."""
    given = [a for a in AXIS_NAMES if getattr(req, a)]
    shown = " x ".join(axis_flag(req, a, lists[a]) for a in given)
    single = all(len(lists[a]) == 1 for a in given)
    if not any(req.gpus % math.prod(c) == 0 for c in itertools.product(*(lists[a]
                                                                          for a in given))):
        if single:
            prod = math.prod(lists[a][0] for a in given)
            what = (f"{shown} does not divide {param('gpus')} {req.gpus}" if len(given) == 1 else
                    f"{shown} = {prod} GPUs does not divide {param('gpus')} {req.gpus}")
        else:
            what = f"no {shown} divides {param('gpus')} {req.gpus}"
        return f"{what}; tp x cp x pp x dp must equal {param('gpus')}"
    free = [a for a in ("tp", "cp") if a not in given]
    left = sorted({req.gpus // math.prod(c) for c in itertools.product(*(lists[a] for a in given))
                   if req.gpus % math.prod(c) == 0})
    if not free:
        return (f"{shown} leave{'s' if len(given) == 1 else ''} {','.join(map(str, left))} "
                f"of {param('gpus')} {req.gpus} unused; tp x cp x pp x dp must equal "
                f"{param('gpus')}")
    made = ", ".join(f"{a} {','.join(map(str, lists[a]))}" for a in free)
    return (f"{shown} leave{'s' if len(given) == 1 else ''} {','.join(map(str, left))} of "
            f"{param('gpus')} {req.gpus} for {' x '.join(free)}, which the model's degrees "
            f"({made}) "
            f"cannot make; tp x cp x pp x dp must equal {param('gpus')}")
