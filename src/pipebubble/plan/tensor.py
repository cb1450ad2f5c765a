"""How tensor parallelism (and sequence parallelism) is priced, per layer.

Megatron-LM (Shoeybi et al. 2019) splits each block's attention heads and MLP columns over
``t`` ranks of one TP group. Per block, the forward all-reduces the ``T x h`` activations
twice (after attention, after the MLP) and the backward twice more; with sequence
parallelism (Korthikanti et al. 2022) each all-reduce becomes a reduce-scatter and an
all-gather of the same total volume, and the norms, dropout and residuals run on ``T / t``
tokens. The forward's two collectives (after the row-parallel O projection and MLP
down-projection) sit on the critical path: their result is the next op's input, so they are
added to F whole. The backward's two (at the inputs of the column-parallel QKV and MLP
up-projections) are not needed by the weight gradient of the same GEMM, so Megatron-LM
(since September 2021) launches them asynchronously and computes that weight gradient
meanwhile (Korthikanti et al. 2022 name this overlap as why full recomputation costs 39 %
and not the 50 % a second forward would; their Table 4 has the backward at 1.55 forwards on
the 22B model, TP 8, where pricing the collectives exposed gives 1.8). So each backward
collective adds to I only what the weight gradient it overlaps does not hide:
``max(0, collective - W of that GEMM)`` (both exposed with ``Network.tp_overlap`` off:
Megatron-LM before September 2021). That overlap needs the weight gradient in the same
pass: a schedule that splits the backward into I and a later W (the zero-bubble family,
DualPipe's split actions, ``auto`` with split backward) runs the data gradient, then the
norm's backward that needs the collective's result, with no GEMM left to hide it behind, so
each I carries both collectives in full. :func:`block_tp_comm` gives, as ``hidden``, what a
fused B hides (``2 x collective - exposed``); the planner adds it to every I of a split
schedule (``CostModel.i_extra``) and leaves B as it is. The GEMMs get ``t``
times thinner, which :mod:`pipebubble.plan.compute` prices as a lower efficiency. The TP
group is innermost (stride 1): it runs on NVLink when ``t <= gpus_per_node``.

The vocabulary-parallel embedding all-reduces (SP: reduce-scatters) its output once in the
forward; the head's input gradient is all-reduced once in the backward.

>>> from pipebubble.plan.network import Network
>>> net = Network(8, (100e9, 0.0), (10e9, 0.0))
>>> block_tp_comm(tokens=1000, hidden=1000, tp=4, net=net)  # 2 x AR of 2 MB on 4 ranks
(6e-05, 6e-05)
>>> block_tp_comm(1000, 1000, 4, net, sp=True) == block_tp_comm(1000, 1000, 4, net)
True
>>> f, b = block_tp_comm(1000, 1000, 4, net, hide=(2e-5, 1.0))  # 3e-5 each, 2e-5 hidden
>>> round(b, 12)                                                 # 1e-5 + 0 exposed
1e-05
>>> round(block_tp_hidden(1000, 1000, 4, net, hide=(2e-5, 1.0)), 12)  # 2e-5 + 3e-5 hidden
5e-05
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


def block_tp_comm(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False,
                  hide: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one block's TP collectives: two each way;
    ``hide`` = the weight-gradient seconds of the QKV and MLP up-projection GEMMs, behind
    which the backward's two collectives run (module doc)."""
    one = tp_collective(tokens, hidden, tp, net, sp)
    if not net.tp_overlap:
        return 2 * one, 2 * one
    return 2 * one, sum(max(0.0, one - w) for w in hide)


def block_tp_hidden(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False,
                    hide: tuple[float, float] = (0.0, 0.0)) -> float:
    """Seconds of the backward's two TP collectives that a fused B hides behind the weight
    gradients ``hide`` and an I without its W exposes (module doc); 0 with
    ``tp_overlap`` off (both are exposed in B too)."""
    if not net.tp_overlap:
        return 0.0
    one = tp_collective(tokens, hidden, tp, net, sp)
    return 2 * one - block_tp_comm(tokens, hidden, tp, net, sp, hide)[1]
