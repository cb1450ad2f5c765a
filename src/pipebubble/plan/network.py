"""The two-level network and the collectives the planner prices.

**Where each axis lives.** Ranks are numbered as Megatron-LM and torchtitan build their
process grid: tensor parallel innermost (neighbouring ranks), then context parallel, then
data parallel (replicas or FSDP shards), pipeline outermost. A group of an axis is ``size``
ranks ``stride`` apart (TP: stride 1; CP: stride tp; DP: stride tp x cp; PP: stride
tp x cp x dp). It stays inside one node when ``stride x size <= gpus_per_node`` and then
runs over NVLink; otherwise it crosses nodes and every ring step is limited by the per-GPU
scale-out link (each GPU has its own NIC, so a ring that crosses nodes moves at that rate).

**Collectives** (ring algorithms, Patarasuk & Yuan 2009; ``n`` bytes per rank, ``k`` ranks,
``bw`` = link rate x ``bus_fraction``, ``lat`` per step):

- all-reduce: ``2 (k-1)/k x n / bw + 2 (k-1) lat``;
- reduce-scatter or all-gather (of a buffer of ``n`` bytes in total): ``(k-1)/k x n / bw +
  (k-1) lat``;
- point-to-point: ``n / bw + lat``.

>>> net = Network(gpus_per_node=8, intra=(100e9, 0.0), inter=(10e9, 0.0))
>>> net.link(stride=1, size=8)  # TP 8 in one node: NVLink
(100000000000.0, 0.0)
>>> net.link(stride=8, size=2)  # DP 2 across nodes
(10000000000.0, 0.0)
>>> allreduce(1e9, 4, (100e9, 0.0))
0.015
"""

from __future__ import annotations

from dataclasses import dataclass

Link = tuple[float, float]  # (bytes/s, seconds per message)


@dataclass(frozen=True)
class Network:
    """Two levels: ``intra`` inside a node of ``gpus_per_node`` GPUs, ``inter`` across."""

    gpus_per_node: int
    intra: Link
    inter: Link
    tp_overlap: bool = True  # backward TP collectives behind weight gradients (tensor.py)

    def link(self, stride: int, size: int) -> Link:
        """The link a group of ``size`` ranks ``stride`` apart runs on."""
        return self.intra if stride * size <= self.gpus_per_node else self.inter

    def hop(self, stride: int) -> Link:
        """The link between two ranks ``stride`` apart (a pipeline hop: stride tp cp dp)."""
        return self.intra if stride < self.gpus_per_node else self.inter

    @classmethod
    def of(cls, hw) -> Network:
        """From a :class:`~pipebubble.plan.hardware.Hardware`, bus fraction applied."""
        f = hw.bus_fraction
        return cls(hw.gpus_per_node, (hw.nvlink_bandwidth * f, hw.nvlink_latency),
                   (hw.inter_node_bandwidth * f, hw.inter_node_latency), hw.tp_overlap)

    @classmethod
    def flat(cls, bandwidth: float, latency: float) -> Network:
        """One level (the planner without ``--gpu``: ``--allreduce-bandwidth``)."""
        return cls(1, (bandwidth, latency), (bandwidth, latency))


def allreduce(nbytes: float, k: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` on each of ``k`` ranks."""
    if k <= 1:
        return 0.0
    bw, lat = link
    return 2 * (k - 1) / k * nbytes / bw + 2 * (k - 1) * lat


def reduce_scatter(nbytes: float, k: int, link: Link) -> float:
    """Ring reduce-scatter of a ``nbytes`` buffer (each rank ends with ``nbytes / k``);
    an all-gather back to ``nbytes`` costs the same."""
    if k <= 1:
        return 0.0
    bw, lat = link
    return (k - 1) / k * nbytes / bw + (k - 1) * lat


all_gather = reduce_scatter


def p2p(nbytes: float, link: Link) -> float:
    """One message of ``nbytes``."""
    bw, lat = link
    return nbytes / bw + lat
