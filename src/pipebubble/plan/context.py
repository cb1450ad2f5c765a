"""How context parallelism is priced, per block.

Ring attention over ``cp`` ranks (Liu et al. 2023; Megatron-LM ``--context-parallel-size``):
each rank holds ``s / cp`` tokens of every sequence. Its queries meet every key block: the K
and V blocks circulate around the ring in ``cp - 1`` steps, each step's transfer overlapped
with the attention of the block already there. So a step costs the longer of the two, and
only the excess of the transfer is exposed:

    exposed_forward  = (cp - 1) x max(0, p2p(K, V of one block) - attention_forward / cp)
    exposed_backward = (cp - 1) x max(0, p2p(K, V, dK, dV) - attention_backward / cp)

Everything else in the block is local (activations and GEMMs on ``s / cp`` tokens). The CP
group sits just outside TP (stride tp): NVLink while ``tp x cp <= gpus_per_node``. CP ranks
hold the same weights, so gradients are reduced over ``dp x cp`` ranks
(:mod:`pipebubble.plan.sharding`).

>>> from pipebubble.plan.network import Network
>>> net = Network(8, (100e9, 0.0), (10e9, 0.0))
>>> block_cp_comm(tokens=4096, kv_width=1024, cp=2, tp=1, net=net, attention=(1.0, 2.5))
(0.0, 0.0)
>>> block_cp_comm(4096, 1024, 2, 1, net, attention=(0.0, 0.0))  # nothing to hide behind
(0.00016777216, 0.00033554432)
"""

from __future__ import annotations

from .network import Network, p2p

ACT_BYTES = 2


def block_cp_comm(tokens: float, kv_width: float, cp: int, tp: int, net: Network,
                  attention: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one block's ring exchange; ``tokens`` local
    tokens, ``kv_width`` = local K/V heads x head size, ``attention`` = the block's attention
    (forward, backward) seconds on this rank."""
    if cp <= 1:
        return 0.0, 0.0
    link = net.link(tp, cp)
    kv = 2 * ACT_BYTES * tokens * kv_width  # K and V of this rank's block
    fwd = (cp - 1) * max(0.0, p2p(kv, link) - attention[0] / cp)
    bwd = (cp - 1) * max(0.0, p2p(2 * kv, link) - attention[1] / cp)
    return fwd, bwd
