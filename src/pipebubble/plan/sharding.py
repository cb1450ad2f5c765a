"""How data parallelism is priced: what each sharding communicates, and what stays exposed.

The data-parallel group of a rank has ``N = dp x cp`` members (context-parallel ranks hold
the same weights and reduce gradients together, as in Megatron-LM); it sits outside TP and
CP (stride ``tp``, size ``cp x dp`` in :mod:`pipebubble.plan.network`). For ``P`` local
parameters (this rank's stages, after TP), ``g`` gradient bytes on the wire (4: fp32) and
16-bit weights, **once a step**:

=========  ===============================================  =========================
 sharding   after the last backward (overlapped with it)     before the first forward
=========  ===============================================  =========================
 ddp        all-reduce ``g P``                               --
 zero1/2    reduce-scatter ``g P`` (Megatron's distributed   all-gather ``2 P`` (the
            optimizer: during the last microbatch's          updated weights, behind
            backward, ``--overlap-grad-reduce``)             the next forward)
 fsdp       reduce-scatter ``g P`` (``never``, below)        all-gather ``2 P``
            -- (``always``: per microbatch, below)           --
 hsdp       fsdp over ``S`` ranks in a node, then an
            all-reduce of ``g P / S`` over ``N / S``         all-gather ``2 P`` over S
=========  ===============================================  =========================

**FSDP / ZeRO-3 under gradient accumulation: the reshard policy** (``plan --fsdp-reshard``):

- ``always`` (FSDP2 ``reshard_after_forward=True``, DeepSpeed ZeRO-3): every microbatch
  all-gathers each layer's ``2 P_l`` weight bytes in its forward and again in its backward
  and reduce-scatters its ``g P_l`` gradient bytes: ``2 x gather + 1 x reduce-scatter`` a
  layer a microbatch. With per-layer prefetch layer ``l+1``'s gather runs behind layer
  ``l``'s compute, so a stage's forward over layers ``a..b`` exposes
  ``AG_a + sum_{l=a+1..b} max(0, AG_l - F_{l-1})`` (the first gather, and what a gather
  exceeds of the compute it hides behind) and its backward (layers ``b..a``) exposes
  ``AG_b + sum_{l=a..b-1} max(0, AG_l + RS_{l+1} - B_{l+1}) + RS_a`` (the last
  reduce-scatter has nothing left to hide behind): :meth:`Sync.layer_traffic` and
  :func:`prefetch_exposed`, added to each stage's F and B by
  :mod:`pipebubble.plan.cut_price`, so the pipeline simulation carries it. Each exposure is
  at least the traffic it does not hide, so a rank's work is at least ``m x (2 AG + RS)`` of
  its parameters. Memory: the states sharded ``(w + g + o) / N``, plus the gathered layers
  in flight: the layer computing and the one prefetched, weights and unsharded gradients,
  ``(w + g) max_l (P_l + P_{l+1})`` (:func:`gathered_bytes`).
- ``never`` (torchtitan under PP: "do not reshard after forward to avoid per-microbatch
  all-gathers"; PyTorch's pipelining defers the gradient reduction to the last backward):
  one gather a step before the first forward, one reduce-scatter after the last backward;
  the unsharded weights and gradients are held across microbatches: ``w + g + o / N``
  bytes a parameter (:func:`~pipebubble.plan.memory.model_state_bytes` with ``keep``).
- ``auto``: torchtitan's default, ``never`` under pipeline parallelism, ``always`` without.

HSDP is priced the same way over its shard group, its replicas' all-reduce of ``g P / S``
joining each reduce-scatter (per microbatch under ``always``).

**Overlap of the once-a-step traffic.** Frameworks launch it in buckets while compute goes
on (DDP and Megatron's ``--overlap-grad-reduce`` during the backward, Megatron's
``--overlap-param-gather`` during the next forward). Gradients are final only in the last
microbatch's backward, so the reduction hides behind the backward of one microbatch on the
rank (``B_r``), the gathers behind one microbatch's forward (``F_r``); one bucket of
``BUCKET`` parameters (Megatron's 40 M) can never hide:

    exposed_r = max(bucket_r, after_r - B_r) + max(bucket_r', before_r - F_r)

Without that overlap (``overlap`` off, ``plan --dp-overlap off``: DeepSpeed's pipeline
engine reduces after the flush, ``enable_backward_allreduce = False``, and gathers the
updated weights inside its optimizer step) all of it shows: ``exposed_r = before_r +
after_r``. The per-microbatch traffic of ``always`` keeps its per-layer prefetch either way.

>>> from pipebubble.plan.network import Network
>>> net = Network.flat(1e9, 0.0)
>>> sync = Sync("ddp", net, n=2, grad_bytes=4)
>>> sync.times(1e6, pp=2)                       # 4 MB all-reduced over 2: 4 ms, no gather
(0.0, 0.004)
>>> sync.exposed((0.0, 0.004), forward=1.0, backward=1.0)   # hides but for one bucket
0.004
>>> fsdp = Sync("fsdp", net, n=2, grad_bytes=4, reshard="always")
>>> fsdp.times(1e6, pp=1), fsdp.layer_traffic(1e6)   # per microbatch: gather 1, scatter 2 ms
((0.0, 0.0), (0.001, 0.002))
>>> prefetch_exposed([0.001, 0.001, 0.001], [0.0005, 0.0005, 0.0005])  # 1 + 0.5 + 0.5 ms
0.002
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError, param
from .network import Network, all_gather, allreduce, reduce_scatter
from .shardings import Sharding

BUCKET = 40e6  # parameters per gradient bucket (Megatron-LM's default bucket size)
RESHARDS = ("always", "never", "auto")  # plan --fsdp-reshard


def check_reshard(policy: str) -> str:
    """``policy`` lower-cased, or a one-line :class:`~pipebubble.errors.UserError`."""
    key = policy.strip().lower() if isinstance(policy, str) else policy
    if key not in RESHARDS:
        raise UserError(f"unknown {param('fsdp_reshard')} {policy!r}; valid are "
                        f"{', '.join(RESHARDS)}")
    return key


def resolve_reshard(policy: str, pp: int) -> str:
    """``always`` or ``never``: ``auto`` is torchtitan's default (``never`` under PP)."""
    if policy == "auto":
        return "never" if pp > 1 else "always"
    return check_reshard(policy)


def prefetch_exposed(comm, compute) -> float:
    """Exposed seconds of a chain of layers whose ``comm[j]`` must finish before layer j
    computes and may run behind the compute of layer ``j-1`` (one layer of prefetch):
    ``comm[0] + sum_{j>=1} max(0, comm[j] - compute[j-1])``."""
    total = float(comm[0]) if len(comm) else 0.0
    for j in range(1, len(comm)):
        total += max(0.0, float(comm[j]) - float(compute[j - 1]))
    return total


def gathered_bytes(layer_params, weight: float, grad: float) -> float:
    """Under ``always``: the most that the gathered layers of a stage (``layer_params``, in
    order) hold at once, the computing and the prefetched layer's unsharded weights and
    gradients, ``(w + g) max_l (P_l + P_{l+1})`` (``(w + g) P`` for a stage of one layer)."""
    P = [float(p) for p in layer_params]
    pair = max((a + b for a, b in zip(P[:-1], P[1:], strict=True)), default=P[0] if P else 0.0)
    return (weight + grad) * pair


@dataclass(frozen=True)
class Sync:
    """The data-parallel traffic of one sharding over ``n`` ranks (``shard`` for hsdp)."""

    sharding: Sharding  # or its name
    net: Network
    n: int
    grad_bytes: float = 4.0
    stride: int = 1  # tp: the DP x CP group is ``stride`` ranks apart
    shard: int = 0  # hsdp: ranks per shard group (inside a node)
    reshard: str = "never"  # fsdp / hsdp: always or never (resolved, module doc)
    overlap: bool = True  # the once-a-step traffic behind the last backward / first forward

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", Sharding.of(self.sharding))

    @property
    def per_microbatch(self) -> bool:
        """Whether the traffic runs every microbatch (fsdp / hsdp resharded ``always``)."""
        return self.sharding.per_microbatch(self.reshard) and self.n > 1

    def layer_traffic(self, params: float) -> tuple[float, float]:
        """(one all-gather of the weights, one reduce-scatter of the gradients) seconds for
        a layer of ``params`` (hsdp: over the shard group, the replicas' all-reduce joining
        the reduce-scatter)."""
        n, g = self.n, self.grad_bytes
        if n <= 1:
            return 0.0, 0.0
        if self.sharding.hybrid:
            s = self.shard
            inner = self.net.link(self.stride, s)
            across = self.net.link(self.stride * s, n // s)  # one member a shard group apart
            return (all_gather(2 * params, s, inner), reduce_scatter(g * params, s, inner)
                    + allreduce(g * params / s, n // s, across))
        link = self.net.link(self.stride, n)
        return all_gather(2 * params, n, link), reduce_scatter(g * params, n, link)

    def times(self, params: float, pp: int) -> tuple[float, float]:
        """(before the first forward, after the last backward) seconds for ``params``, the
        traffic that runs once a step (none for ``always``: see :meth:`layer_traffic`)."""
        n, g = self.n, self.grad_bytes
        if n <= 1 or self.per_microbatch:
            return 0.0, 0.0
        link = self.net.link(self.stride, n)
        if not self.sharding.gathers:
            return 0.0, allreduce(g * params, n, link)
        if not self.sharding.hybrid:
            return all_gather(2 * params, n, link), reduce_scatter(g * params, n, link)
        return self.layer_traffic(params)  # hsdp kept: once, over its shard group

    def exposed(self, times: tuple[float, float], forward: float, backward: float,
                params: float = 0.0) -> float:
        """What shows in the step of a rank whose one-microbatch forward and backward take
        ``forward`` and ``backward`` seconds (module doc)."""
        before, after = times
        if not self.overlap:
            return before + after
        share = min(1.0, BUCKET / params) if params > 0 else 1.0
        return (max(after * share, after - backward)
                + max(before * share, before - forward))
