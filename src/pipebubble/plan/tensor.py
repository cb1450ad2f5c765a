"""How tensor parallelism (and sequence parallelism) is priced, per layer.

Megatron-LM (Shoeybi et al. 2019) splits each block's attention heads and MLP columns over
``t`` ranks of one TP group. Per block, the forward all-reduces the ``T x h`` activations
twice (after attention, after the MLP) and the backward twice more; with sequence
parallelism (Korthikanti et al. 2022) each all-reduce becomes a reduce-scatter and an
all-gather of the same total volume, and the norms, dropout and residuals run on ``T / t``
tokens. The collectives sit on the critical path (they are not overlapped here), so they are
added to F (forward) and I (backward of the input). The GEMMs get ``t`` times thinner, which
:mod:`pipebubble.plan.compute` prices as a lower efficiency. The TP group is innermost
(stride 1): it runs on NVLink when ``t <= gpus_per_node``.

The vocabulary-parallel embedding all-reduces (SP: reduce-scatters) its output once in the
forward; the head's input gradient is all-reduced once in the backward.

>>> from pipebubble.plan.network import Network
>>> net = Network(8, (100e9, 0.0), (10e9, 0.0))
>>> block_tp_comm(tokens=1000, hidden=1000, tp=4, net=net)  # 2 x AR of 2 MB on 4 ranks
(6e-05, 6e-05)
>>> block_tp_comm(1000, 1000, 4, net, sp=True) == block_tp_comm(1000, 1000, 4, net)
True
"""

from __future__ import annotations

from .network import Network, all_gather, allreduce, reduce_scatter

ACT_BYTES = 2  # 16-bit activations


def tp_collective(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False) -> float:
    """One all-reduce of ``tokens x hidden`` activations (SP: a reduce-scatter + an
    all-gather) over the TP group."""
    if tp <= 1:
        return 0.0
    link = net.link(1, tp)
    n = ACT_BYTES * tokens * hidden
    if sp:
        return reduce_scatter(n, tp, link) + all_gather(n, tp, link)
    return allreduce(n, tp, link)


def block_tp_comm(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False
                  ) -> tuple[float, float]:
    """(forward, backward) seconds of one block's TP collectives: two each way."""
    one = tp_collective(tokens, hidden, tp, net, sp)
    return 2 * one, 2 * one
