"""The two-level network and the collectives the planner prices.

**Where each axis lives.** Ranks are numbered as Megatron-LM and torchtitan build their
process grid: tensor parallel innermost (neighbouring ranks), then context parallel, then
data parallel (replicas or FSDP shards), pipeline outermost. A group of an axis is ``size``
ranks ``stride`` apart (TP: stride 1; CP: stride tp; DP: stride tp x cp; PP: stride
tp x cp x dp). It stays inside one node when ``stride x size <= gpus_per_node`` and then
runs over NVLink; otherwise it crosses nodes.

**A group that crosses nodes** moves as NCCL moves it: its rings (one per channel) leave a
node through every NIC its members there drive. A group with ``k`` members in each node
(``k = min(size, gpus_per_node / stride)``, 1 when ``stride >= gpus_per_node``) runs ``k``
rings side by side, each through its own NIC, so its bus bandwidth is

    min(NVLink, k x nics_per_node / gpus_per_node x NIC rate)

(``nics_per_node / gpus_per_node``: a GPU's share of the node's NICs, since every GPU of the
node runs such a group at the same time; 1 on DGX/HGX nodes, one NIC per GPU). A TP-8 x DP
group (one member a node) gets one NIC; pure FSDP over 8-GPU nodes gets all eight, capped by
NVLink: 8 A100 with 4 x HDR reach 84.8-96 GB/s of a theoretical 100 (nccl-tests issue 119).
Latency is per hop of the ring: a ring step waits for its slowest hop, the NIC's when the
ring crosses nodes, the NVLink's when it does not.

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
>>> net.link(stride=1, size=16)  # FSDP over 2 nodes: 8 NICs a node, capped by NVLink
(80000000000.0, 0.0)
>>> net.link(stride=4, size=4)  # TP-4 x DP: 2 members a node drive 2 NICs
(20000000000.0, 0.0)
>>> allreduce(1e9, 4, (100e9, 0.0))
0.015
"""

from __future__ import annotations

from dataclasses import dataclass

Link = tuple[float, float]  # (bytes/s, seconds per message)


@dataclass(frozen=True)
class Network:
    """Two levels: ``intra`` inside a node of ``gpus_per_node`` GPUs, ``inter`` across
    (``inter``: one NIC's rate, bus fraction applied; ``nics_per_node`` of them a node, 0:
    one per GPU)."""

    gpus_per_node: int
    intra: Link
    inter: Link
    tp_overlap: bool = True  # backward TP collectives behind weight gradients (tensor.py)
    nics_per_node: int = 0
    tp_comm_overlap: bool = False  # TP collectives pipelined with their GEMMs (tensor.py)

    def members_per_node(self, stride: int, size: int) -> int:
        """Members a group of ``size`` ranks ``stride`` apart has in each node it spans."""
        G = self.gpus_per_node
        return 1 if stride >= G else max(1, min(size, G // stride))

    def nic_share(self) -> float:
        """NICs per GPU of a node (1 with one NIC per GPU)."""
        return (self.nics_per_node or self.gpus_per_node) / self.gpus_per_node

    def link(self, stride: int, size: int) -> Link:
        """The link a group of ``size`` ranks ``stride`` apart runs on (module doc): NVLink
        inside a node; across nodes ``min(NVLink, k x NIC share x NIC rate)`` for ``k``
        members a node, at the NIC's latency a hop."""
        if stride * size <= self.gpus_per_node:
            return self.intra
        k = self.members_per_node(stride, size)
        return (min(self.intra[0], k * self.nic_share() * self.inter[0]), self.inter[1])

    def hop(self, stride: int) -> Link:
        """The link between two ranks ``stride`` apart (a pipeline hop: stride tp cp dp;
        every GPU of a node sends at once, so each gets its share of the NICs)."""
        if stride < self.gpus_per_node:
            return self.intra
        return (min(self.intra[0], self.nic_share() * self.inter[0]), self.inter[1])

    @classmethod
    def of(cls, hw) -> Network:
        """From a :class:`~pipebubble.plan.hardware.Hardware`, bus fraction applied."""
        f = hw.bus_fraction
        return cls(hw.gpus_per_node, (hw.nvlink_bandwidth * f, hw.nvlink_latency),
                   (hw.inter_node_bandwidth * f, hw.inter_node_latency), hw.tp_overlap,
                   hw.nics_per_node, hw.tp_comm_overlap)

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
