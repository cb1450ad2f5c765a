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
each I carries both collectives in full. :func:`block_tp_hidden` gives, as ``hidden``, what a
fused B hides (the backward with the overlap off, less with it on); the planner adds it to
every I of a split schedule (``CostModel.i_extra``) and leaves B as it is. The GEMMs get ``t``
times thinner, which :mod:`pipebubble.plan.compute` prices as a lower efficiency. The TP
group is innermost (stride 1): it runs on NVLink when ``t <= gpus_per_node``.

**The backward with sequence parallelism is not the backward without it.** Without SP each
row-parallel GEMM's forward all-reduce has an identity backward, and each column-parallel
GEMM's identity forward an all-reduce backward: the two collectives above. With SP
(Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` and
``_ReduceScatterToSequenceParallelRegion``) the backward has three kinds, per block two of
each: the all-gather of the gradient of each row-parallel output (the backward of the
forward's reduce-scatter; O's and the MLP down-projection's data gradient need it, so it is
exposed), the reduce-scatter of each column-parallel input gradient (behind that GEMM's
weight gradient, as above) and the all-gather of each column-parallel input again (SP keeps
only its ``1 / t`` shard; the weight gradient needs all of it), which Megatron-LM launches
before the data gradient and runs behind it. So SP's backward adds ``2 x all-gather -
what the data gradients hide`` to the no-SP form: on Korthikanti et al.'s 22B block (TP 8,
A100) their Table 4 has SP saving 0.5 ms of the forward and 0.1 of the backward, where
pricing SP's backward as the no-SP one saves 1.3 (``bench/bench_recompute.py``).

**Communication pipelined with the GEMMs** (``Network.tp_comm_overlap``, ``plan --tp-overlap
on``: Megatron-LM's ``--tp-comm-overlap``, TransformerEngine's userbuffers; torchtitan's
AsyncTP, ``enable_async_tensor_parallel``; both need sequence parallelism). Each all-gather
before a column-parallel GEMM and each reduce-scatter after a row-parallel one is split into
``t`` chunks that run while the GEMM computes the others, so of a collective ``c`` next to a
GEMM ``g`` only ``max(c / t, c - g)`` shows: one chunk, or what the GEMM cannot cover. In the
forward these are the four collectives of the block (QKV and up-projection after their
all-gathers, O and down-projection before their reduce-scatters, ``fwd_gemms``); in the
backward the two gradient all-gathers, each before the data gradient of O or the
down-projection (``dgrad_rows``). Without SP (or with ``tp_comm_overlap`` off) nothing
changes.

The vocabulary-parallel embedding all-reduces (SP: reduce-scatters) its output once in the
forward; the head's input gradient is all-reduced once in the backward.

>>> from pipebubble.plan.network import Network
>>> net = Network(8, (100e9, 0.0), (10e9, 0.0))
>>> block_tp_comm(tokens=1000, hidden=1000, tp=4, net=net)  # 2 x AR of 2 MB on 4 ranks
(6e-05, 6e-05)
>>> f, b = block_tp_comm(1000, 1000, 4, net, sp=True)  # RS, AG 1.5e-5 each: nothing hidden
>>> f, round(b, 12)                            # the same forward; the backward 2 AG + 2 RS + 2 AG
(6e-05, 9e-05)
>>> f, b = block_tp_comm(1000, 1000, 4, net, sp=True, hide=(1.0, 1.0), hide_dgrad=(1.0, 1.0))
>>> round(b, 12)                               # the gradient all-gathers are never hidden
3e-05
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


def _sp_parts(tokens: float, hidden: int, tp: int, net: Network) -> tuple[float, float]:
    """(one reduce-scatter, one all-gather) of ``tokens x hidden`` over the TP group."""
    link = net.link(1, tp)
    n = ACT_BYTES * tokens * hidden
    return reduce_scatter(n, tp, link), all_gather(n, tp, link)


def pipelined(comm: float, gemm: float, tp: int) -> float:
    """Exposed seconds of a collective split into ``tp`` chunks behind a GEMM of ``gemm``
    seconds (module doc): ``max(comm / tp, comm - gemm)``.

    >>> pipelined(8.0, 4.0, 4), pipelined(8.0, 100.0, 4)
    (4.0, 2.0)
    """
    return max(comm / tp, comm - gemm)


def block_tp_comm(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False,
                  hide: tuple[float, float] = (0.0, 0.0),
                  hide_dgrad: tuple[float, float] = (0.0, 0.0),
                  fwd_gemms: tuple[float, ...] = (), dgrad_rows: tuple[float, ...] = (),
                  ) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one block's TP collectives: two each way
    without SP; ``hide`` = the weight-gradient seconds of the QKV and MLP up-projection GEMMs,
    behind which the backward's input-gradient collectives run, ``hide_dgrad`` their
    data-gradient seconds, behind which SP's re-gather of their inputs runs; with
    ``net.tp_comm_overlap`` and SP, ``fwd_gemms`` (QKV, O, up, down forward seconds) and
    ``dgrad_rows`` (O's and the down-projection's data gradient) the GEMMs the collectives
    are pipelined with (module doc)."""
    one = tp_collective(tokens, hidden, tp, net, sp)
    if tp <= 1:
        return 0.0, 0.0
    if sp and net.tp_comm_overlap and len(fwd_gemms) == 4 and len(dgrad_rows) == 2:
        rs, ag = _sp_parts(tokens, hidden, tp, net)
        fwd = sum(pipelined(c, g, tp) for c, g in zip((ag, rs, ag, rs), fwd_gemms,
                                                        strict=True))
        grad_ag = sum(pipelined(ag, d, tp) for d in dgrad_rows)
        rest = (sum(max(0.0, rs - w) for w in hide) + sum(max(0.0, ag - d) for d in hide_dgrad)
                if net.tp_overlap else 2 * rs + 2 * ag)
        return fwd, grad_ag + rest
    if not sp:
        if not net.tp_overlap:
            return 2 * one, 2 * one
        return 2 * one, sum(max(0.0, one - w) for w in hide)
    rs, ag = _sp_parts(tokens, hidden, tp, net)
    if not net.tp_overlap:
        return 2 * one, 2 * ag + 2 * rs + 2 * ag
    return 2 * one, (2 * ag + sum(max(0.0, rs - w) for w in hide)
                     + sum(max(0.0, ag - d) for d in hide_dgrad))


def sp_collective(tokens: float, hidden: int, tp: int, net: Network, hide: float = 0.0,
                  hide_dgrad: float = 0.0) -> tuple[float, float, float]:
    """(forward, backward, hidden by a fused B) seconds of one sequence-parallel
    collective pair over ``tp`` consecutive ranks: the forward's all-gather and
    reduce-scatter, the backward's gradient all-gather (exposed), the input gradient's
    reduce-scatter behind ``hide`` (its GEMM's weight gradient) and the input's re-gather
    behind ``hide_dgrad`` (module doc; nothing hidden with ``net.tp_overlap`` off). Half of
    :func:`block_tp_comm` with SP, for one of its two pairs."""
    if tp <= 1:
        return 0.0, 0.0, 0.0
    rs, ag = _sp_parts(tokens, hidden, tp, net)
    if not net.tp_overlap:
        return rs + ag, ag + rs + ag, 0.0
    return (rs + ag, ag + max(0.0, rs - hide) + max(0.0, ag - hide_dgrad),
            min(rs, hide) + min(ag, hide_dgrad))


def pipelined_pair(tokens: float, hidden: int, tp: int, net: Network, hide: float,
                   hide_dgrad: float, gemms: tuple[float, float], dgrad_row: float
                   ) -> tuple[float, float, float]:
    """:func:`sp_collective` with the all-gather and the reduce-scatter pipelined with their
    GEMMs (``net.tp_comm_overlap``, TransformerEngine's userbuffers; :func:`pipelined`): the
    forward's all-gather behind the column-parallel GEMM ``gemms[0]``, its reduce-scatter
    behind the row-parallel ``gemms[1]``, the backward's gradient all-gather behind the
    row-parallel data gradient ``dgrad_row``; the input gradient's reduce-scatter and the
    re-gather as :func:`sp_collective` prices them (behind ``hide`` and ``hide_dgrad``, all
    exposed with ``net.tp_overlap`` off), as :func:`block_tp_comm` prices a dense block's
    pairs (an MoE block's pairs one at a time: :mod:`~pipebubble.plan.expert`)."""
    if tp <= 1:
        return 0.0, 0.0, 0.0
    rs, ag = _sp_parts(tokens, hidden, tp, net)
    f = pipelined(ag, gemms[0], tp) + pipelined(rs, gemms[1], tp)
    grad_ag = pipelined(ag, dgrad_row, tp)
    if not net.tp_overlap:
        return f, grad_ag + rs + ag, 0.0
    return (f, grad_ag + max(0.0, rs - hide) + max(0.0, ag - hide_dgrad),
            min(rs, hide) + min(ag, hide_dgrad))


def block_tp_hidden(tokens: float, hidden: int, tp: int, net: Network, sp: bool = False,
                    hide: tuple[float, float] = (0.0, 0.0),
                    hide_dgrad: tuple[float, float] = (0.0, 0.0)) -> float:
    """Seconds of the backward's TP collectives that a fused B hides (behind the weight
    gradients ``hide``; SP's input re-gather behind the data gradients ``hide_dgrad``) and an
    I without its W exposes, as every collective of a split backward is (module doc): B's
    exposed part plus this is the backward with ``tp_overlap`` off; 0 with it off."""
    if not net.tp_overlap or tp <= 1:
        return 0.0
    if not sp:
        one = tp_collective(tokens, hidden, tp, net)
        return sum(min(one, w) for w in hide)
    rs, ag = _sp_parts(tokens, hidden, tp, net)
    return sum(min(rs, w) for w in hide) + sum(min(ag, d) for d in hide_dgrad)
