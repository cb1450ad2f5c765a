"""What each data-parallel sharding is: :class:`Sharding`, whose members carry their facts.

A sharding says which model states the ``N`` ranks of the data-parallel group share instead
of each holding them (Rajbhandari et al. 2020, ZeRO), how it splits ``dp`` into replicas x
shards (:class:`~pipebubble.plan.dims.ParallelDims`) and what it communicates:

=========  ======  =====  =========  ===========================================  ===========
 member    params  grads  optimizer   communicated                                 dp split
=========  ======  =====  =========  ===========================================  ===========
 ``ddp``    --      --     --         all-reduce of the gradients, once a step     replicas
 ``zero1``  --      --     sharded    reduce-scatter, gather of the updated        shards
                                      weights, once a step
 ``zero2``  --      shard  sharded    the same                                     shards
 ``fsdp``   shard   shard  sharded    per microbatch (reshard ``always``) or once  shards
                                      a step (``never``): :mod:`.sharding`
 ``hsdp``   shard   shard  sharded    fsdp over a shard group inside a node, the   both
                                      replicas' all-reduce across
=========  ======  =====  =========  ===========================================  ===========

How the traffic is priced lives in :mod:`pipebubble.plan.sharding` (:class:`~pipebubble.
plan.sharding.Sync`), the bytes in :mod:`pipebubble.plan.memory`; both ask the member, never
its name. Members are strings (``Sharding.FSDP == "fsdp"``), so the JSON and the flags show
them as the user typed them.

>>> Sharding.of("ZeRO2").sharded(), Sharding.FSDP.sharded(keep=True)
((False, True, True), (False, False, True))
>>> Sharding.HSDP.split_dp(16, model_parallel=2, gpus_per_node=8)  # 4 shards a node, 4 copies
(4, 4)
>>> Sharding.ZERO1.state_bytes(8)  # 2 + 2 + 12 / 8
5.5
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import UserError, param

# name: (params, grads, optimizer sharded, hybrid, label, Megatron-FSDP strategy)
_FACTS = {
    "ddp": (False, False, False, False, "DDP", None),
    "zero1": (False, False, True, False, "ZeRO-1", None),
    "zero2": (False, True, True, False, "ZeRO-2", "optim_grads"),
    "fsdp": (True, True, True, False, "FSDP", "optim_grads_params"),
    "hsdp": (True, True, True, True, "HSDP", None),
}


class Sharding(StrEnum):
    """A data-parallel sharding (module doc)."""

    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    FSDP = "fsdp"
    HSDP = "hsdp"

    @classmethod
    def of(cls, name: str, flag: str = param("sharding")) -> Sharding:
        """The member named ``name`` (any case), or one line listing the valid ones."""
        if isinstance(name, cls):
            return name
        key = name.strip().lower() if isinstance(name, str) else name
        try:
            return cls(key)
        except ValueError:
            raise UserError(f"unknown {flag} {name!r}; valid are "
                            f"{', '.join(m.value for m in cls)}") from None

    # ---- what is sharded ------------------------------------------------------------------
    @property
    def shards_params(self) -> bool:
        """Weights sharded between steps (ZeRO-3 / FSDP): the reshard policy applies."""
        return _FACTS[self.value][0]

    @property
    def shards_grads(self) -> bool:
        return _FACTS[self.value][1]

    @property
    def shards_optimizer(self) -> bool:
        """Optimizer states sharded: every member but ddp. A sharding over one rank is ddp's
        plan, so the search shows it once."""
        return _FACTS[self.value][2]

    @property
    def hybrid(self) -> bool:
        """Sharded inside a shard group, replicated across groups (HSDP)."""
        return _FACTS[self.value][3]

    @property
    def label(self) -> str:
        """As the frameworks' documents write it: ``ZeRO-1``, ``FSDP`` ..."""
        return _FACTS[self.value][4]

    @property
    def megatron_fsdp_strategy(self) -> str | None:
        """Megatron-FSDP's ``--data-parallel-sharding-strategy`` for this sharding (None:
        plain DDP or the distributed optimizer, or no Megatron form)."""
        return _FACTS[self.value][5]

    def sharded(self, keep: bool = False) -> tuple[bool, bool, bool]:
        """Which of (weights, gradients, optimizer state) a rank holds ``1 / N`` of during
        the step; ``keep``: fsdp / hsdp holding the gathered weights and the unsharded
        gradients across the microbatches (reshard ``never``)."""
        if keep and self.shards_params:
            return False, False, True
        return self.shards_params, self.shards_grads, self.shards_optimizer

    def state_bytes(self, n: int, weight: float = 2.0, grad: float = 2.0,
                    optimizer: float = 12.0, keep: bool = False) -> float:
        """Bytes per local parameter over ``n`` sharing ranks (:mod:`~pipebubble.plan.
        memory`'s table): ``w + g + o`` with each sharded term divided by ``n``."""
        if keep and self.shards_params:
            return weight + grad + optimizer / n
        if self.shards_params:
            return (weight + grad + optimizer) / n
        if self.shards_grads:
            return weight + (grad + optimizer) / n
        if self.shards_optimizer:
            return weight + grad + optimizer / n
        return weight + grad + optimizer

    def updated_share(self, shard: int) -> float:
        """The fraction of a rank's local parameters its optimizer step updates."""
        return 1.0 / max(shard, 1) if self.shards_optimizer else 1.0

    # ---- how dp splits, what moves ---------------------------------------------------------
    def split_dp(self, dp: int, model_parallel: int, gpus_per_node: int) -> tuple[int, int]:
        """``(dp_replicate, dp_shard)`` of ``dp`` data-parallel ranks: ddp replicates, zero
        and fsdp shard over all of ``dp``, hsdp shards over its group in a node
        (:func:`hsdp_shard`) and replicates the rest (no such group: replicated, as ddp)."""
        if not self.shards_optimizer:
            return dp, 1
        if self.hybrid:
            s = hsdp_shard(dp, model_parallel, gpus_per_node)
            return (dp // s, s) if s else (dp, 1)
        return 1, dp

    def per_microbatch(self, reshard: str) -> bool:
        """Whether the weights are gathered and the gradients reduced every microbatch:
        weights sharded and resharded ``always`` (:mod:`~pipebubble.plan.sharding`)."""
        return self.shards_params and reshard == "always"

    @property
    def gathers(self) -> bool:
        """Whether the weights are all-gathered after the step (every member but ddp: the
        updated shards of zero1/2, the sharded weights of fsdp)."""
        return self.shards_optimizer


def hsdp_shard(dp: int, model_parallel: int, gpus_per_node: int) -> int:
    """HSDP's shard group: the most data-parallel ranks that fit in one node with their TP
    and CP groups (``model_parallel = tp x cp`` ranks each; a divisor of ``dp``); 0 when
    that is 1 or all of ``dp`` (then it is plain DDP or FSDP)."""
    room = max(gpus_per_node // model_parallel, 1)
    s = max(d for d in range(1, min(dp, room) + 1) if dp % d == 0)
    return s if 1 < s < dp else 0


SHARDINGS = tuple(m.value for m in Sharding)
