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
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory import model_state_bytes
from .network import Link, Network, allreduce
from .optimizer import step_time
from .sharding import Sync, hsdp_shard, resolve_reshard


@dataclass(frozen=True)
class Point:
    tp: int = 1
    sp: bool = False
    cp: int = 1
    sharding: str = "ddp"


@dataclass(frozen=True)
class Axes:
    point: Point
    net: Network
    state_bytes: tuple[float, float, float] = (2.0, 2.0, 12.0)  # weights, grads, optimizer
    grad_bytes: float = 4.0
    p2p: Link | None = None  # one link for every hop (no --gpu); None: the network's
    hbm: float = 0.0  # HBM bytes/s for the optimizer step; 0: not priced
    reshard: str = "auto"  # fsdp / hsdp: always, never or auto (plan --fsdp-reshard)

    def keeps_weights(self, pp: int) -> bool:
        """Whether fsdp / hsdp hold the gathered weights across microbatches at ``pp``."""
        return (self.point.sharding in ("fsdp", "hsdp")
                and resolve_reshard(self.reshard, pp) == "never")

    def shard(self, dp: int) -> int:
        """Ranks sharing the model states: ``dp x cp`` (hsdp: its shard group, 0 if none)."""
        pt = self.point
        if pt.sharding == "hsdp":
            return hsdp_shard(dp, pt.cp, pt.tp, self.net.gpus_per_node)
        return dp * pt.cp

    def bytes_per_param(self, dp: int, pp: int = 1) -> float:
        n = self.shard(dp)
        return model_state_bytes(self.point.sharding, max(n, 1), *self.state_bytes,
                                 keep=self.keeps_weights(pp))

    def sync(self, dp: int, pp: int = 1) -> Sync:
        pt = self.point
        return Sync(pt.sharding, self.net, dp * pt.cp, self.grad_bytes, stride=pt.tp,
                    shard=self.shard(dp) if pt.sharding == "hsdp" else 0,
                    reshard=resolve_reshard(self.reshard, pp))

    def hop(self, dp: int) -> Link:
        if self.p2p is not None:
            return self.p2p
        pt = self.point
        return self.net.hop(pt.tp * pt.cp * dp)

    def optimizer_time(self, dp: int, params: float) -> float:
        """Seconds of the optimizer step of a rank with ``params`` local parameters."""
        pt = self.point
        n = self.shard(dp)
        return step_time(params, "ddp" if pt.sharding == "hsdp" and n == 0 else pt.sharding,
                         n, self.state_bytes, self.hbm)

    def tied_allreduce(self, dp: int, pp: int, params: float) -> float:
        """The all-reduce of a tied embedding's ``params`` gradients between the first and
        the last of ``pp`` stages (Megatron-LM's embedding group, after the data-parallel
        reduction and not overlapped), ``tp x cp x dp x (pp - 1)`` ranks apart."""
        if params <= 0 or pp <= 1:
            return 0.0
        pt = self.point
        link = self.p2p or self.net.hop(pt.tp * pt.cp * dp * (pp - 1))
        return allreduce(self.grad_bytes * params, 2, link)
