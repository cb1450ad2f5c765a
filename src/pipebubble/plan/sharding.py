"""How data parallelism is priced: what each sharding communicates, and what stays exposed.

The data-parallel group of a rank has ``N = dp x cp`` members (context-parallel ranks hold
the same weights and reduce gradients together, as in Megatron-LM); it sits outside TP and
CP (stride ``tp``, size ``cp x dp`` in :mod:`pipebubble.plan.network`). For ``P`` local
parameters (this rank's stages, after TP), ``g`` gradient bytes on the wire (4: fp32) and
16-bit weights:

=========  ===============================================  =========================
 sharding   after the last backward (overlapped with it)     before the first forward
=========  ===============================================  =========================
 ddp        all-reduce ``g P``                               --
 zero1/2    reduce-scatter ``g P``                           all-gather ``2 P`` (the
                                                             updated weights)
 fsdp       reduce-scatter ``g P`` (+ all-gather ``2 P``     all-gather ``2 P``
            again when pp = 1: resharded after forward)
 hsdp       fsdp over ``S`` ranks in a node, then an
            all-reduce of ``g P / S`` over ``N / S``         all-gather ``2 P`` over S
=========  ===============================================  =========================

**Overlap.** Frameworks launch these in buckets while compute goes on (DDP and Megatron's
``--overlap-grad-reduce`` during the backward, FSDP's prefetch, Megatron's
``--overlap-param-gather`` during the next forward). Gradients are final only in the last
microbatch's backward, so the reduction hides behind the backward of one microbatch on the
rank (``B_r``), the gathers behind one microbatch's forward (``F_r``); one bucket of
``BUCKET`` parameters (Megatron's 40 M) can never hide:

    exposed_r = max(bucket_r, after_r - B_r) + max(bucket_r', before_r - F_r)

>>> from pipebubble.plan.network import Network
>>> net = Network.flat(1e9, 0.0)
>>> sync = Sync("ddp", net, n=2, grad_bytes=4)
>>> sync.times(1e6, pp=2)                       # 4 MB all-reduced over 2: 4 ms, no gather
(0.0, 0.004)
>>> sync.exposed((0.0, 0.004), forward=1.0, backward=1.0)   # hides but for one bucket
0.004
"""

from __future__ import annotations

from dataclasses import dataclass

from .network import Network, all_gather, allreduce, reduce_scatter

BUCKET = 40e6  # parameters per gradient bucket (Megatron-LM's default bucket size)


@dataclass(frozen=True)
class Sync:
    """The data-parallel traffic of one sharding over ``n`` ranks (``shard`` for hsdp)."""

    sharding: str
    net: Network
    n: int
    grad_bytes: float = 4.0
    stride: int = 1  # tp: the DP x CP group is ``stride`` ranks apart
    shard: int = 0  # hsdp: ranks per shard group (inside a node)

    def times(self, params: float, pp: int) -> tuple[float, float]:
        """(before the first forward, after the last backward) seconds for ``params``."""
        n, g = self.n, self.grad_bytes
        if n <= 1:
            return 0.0, 0.0
        link = self.net.link(self.stride, n)
        if self.sharding == "ddp":
            return 0.0, allreduce(g * params, n, link)
        if self.sharding in ("zero1", "zero2"):
            return all_gather(2 * params, n, link), reduce_scatter(g * params, n, link)
        if self.sharding == "fsdp":
            gather = all_gather(2 * params, n, link)
            return gather, reduce_scatter(g * params, n, link) + (gather if pp == 1 else 0.0)
        s = self.shard  # hsdp
        inner = self.net.link(self.stride, s)
        gather = all_gather(2 * params, s, inner)
        after = reduce_scatter(g * params, s, inner) + (gather if pp == 1 else 0.0)
        return gather, after + allreduce(g * params / s, n // s, link)

    def exposed(self, times: tuple[float, float], forward: float, backward: float,
                params: float = 0.0) -> float:
        """What shows in the step of a rank whose one-microbatch forward and backward take
        ``forward`` and ``backward`` seconds (module doc)."""
        before, after = times
        share = min(1.0, BUCKET / params) if params > 0 else 1.0
        return (max(after * share, after - backward)
                + max(before * share, before - forward))


def hsdp_shard(dp: int, cp: int, tp: int, gpus_per_node: int) -> int:
    """HSDP's shard group: the most data-parallel ranks that fit in one node with their TP
    and CP groups (a divisor of ``dp``); 0 when that is 1 or all of ``dp`` (then it is
    plain DDP or FSDP)."""
    room = max(gpus_per_node // (tp * cp), 1)
    s = max(d for d in range(1, min(dp, room) + 1) if dp % d == 0)
    return s if 1 < s < dp else 0
