"""The network as NCCL uses it (plan/network.py): a group that crosses nodes drives as many
of a node's NICs as it has members there, capped by NVLink; one inside a node runs on NVLink.

Every number below is worked by hand from the presets: bus fraction 0.8, A100 NVLink 300 GB/s
and 8 x 25 GB/s HDR NICs a node, H100 NVLink 450 GB/s and 8 x 50 GB/s NDR, latency 2 us inside
a node and 5 us across.
"""

import json

import pytest

from pipebubble.cli import main
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.network import Network, all_gather, allreduce
from pipebubble.plan.sharding import Sync

A100 = Network.of(get_hardware("a100-80gb"))


def test_tp8_dp_group_gets_one_nic_and_pure_fsdp_gets_the_node():
    """TP 8 x DP 16 on 128 A100: the DP group holds one GPU a node (stride 8), so its ring
    leaves each node through one NIC: 25 x 0.8 = 20 GB/s. Pure FSDP over the same 128 GPUs
    holds all 8 GPUs of each node: 8 rings through 8 NICs, 160 GB/s, under NVLink's 240."""
    assert A100.link(stride=8, size=16) == (20e9, 5e-6)
    assert A100.link(stride=1, size=128) == (160e9, 5e-6)
    # the same 2 GB of bf16 weights all-gathered, by hand: (n-1)/n x bytes / bw + (n-1) lat
    tp_dp = Sync("fsdp", A100, n=16, stride=8).layer_traffic(1e9)[0]
    fsdp = Sync("fsdp", A100, n=128, stride=1).layer_traffic(1e9)[0]
    assert tp_dp == pytest.approx(15 / 16 * 2e9 / 20e9 + 15 * 5e-6)
    assert fsdp == pytest.approx(127 / 128 * 2e9 / 160e9 + 127 * 5e-6)
    assert tp_dp / fsdp > 7  # per byte, 8x the bandwidth; latency of 127 hops vs 15


def test_inside_a_node_is_nvlink():
    assert A100.link(stride=1, size=8) == (240e9, 2e-6)
    assert A100.link(stride=2, size=4) == (240e9, 2e-6)
    assert allreduce(1e9, 8, A100.link(1, 8)) == pytest.approx(
        2 * 7 / 8 * 1e9 / 240e9 + 2 * 7 * 2e-6)


def test_members_per_node_between_the_extremes():
    """TP 2 x DP 32: 4 DP members a node, 4 NICs: 80 GB/s; TP 4: 2 members, 40 GB/s."""
    assert A100.members_per_node(2, 32) == 4
    assert A100.link(2, 32) == (80e9, 5e-6)
    assert A100.link(4, 16) == (40e9, 5e-6)


def test_nvlink_caps_the_node_aggregate():
    """H100: 8 x 40 GB/s of NICs = 320, under NVLink's 360; with NVLink lowered to 200 GB/s
    (160 at the bus fraction) the node's rings are NVLink-bound."""
    h100 = Network.of(get_hardware("h100-sxm"))
    assert h100.link(1, 64) == (320e9, 5e-6)
    slow = Network.of(get_hardware("h100-sxm", nvlink_bandwidth=200e9))
    assert slow.link(1, 64) == (160e9, 5e-6)


def test_fewer_nics_than_gpus_share_them():
    """8 A100 with 4 x HDR a node (nccl-tests issue 119, "theoretical 100 GB/s (200G x 4 /
    8)", measured 84.8-96): pure FSDP gets 4 NICs' worth, 100 x 0.8 = 80 GB/s; a TP-8 x DP
    group's member shares its NIC with another GPU: 12.5 x 0.8 = 10 GB/s. A pipeline hop
    too."""
    net = Network.of(get_hardware("a100-80gb", nics_per_node=4))
    assert net.link(1, 16) == (80e9, 5e-6)
    assert net.link(8, 2) == (10e9, 5e-6)
    assert net.hop(8) == (10e9, 5e-6)
    assert Network.of(get_hardware("a100-80gb")).hop(8) == (20e9, 5e-6)


def test_hsdp_replicas_reduce_over_one_nic():
    """HSDP over 16 A100, shard group 8 (a node): the reduce-scatter of 4 GB of fp32
    gradients runs on NVLink; each shard's replica all-reduce (2 ranks, one a node) of its
    eighth on one NIC, 20 GB/s, not the 160 the 16-member group would get."""
    sync = Sync("hsdp", A100, n=16, grad_bytes=4, stride=1, shard=8)
    gather, scatter = sync.layer_traffic(1e9)
    assert gather == pytest.approx(all_gather(2e9, 8, (240e9, 2e-6)))
    assert scatter == pytest.approx(7 / 8 * 4e9 / 240e9 + 7 * 2e-6
                                    + 2 * 1 / 2 * 0.5e9 / 20e9 + 2 * 5e-6)


def test_a_flat_network_is_one_link():
    net = Network.flat(50e9, 1e-5)
    assert net.link(1, 64) == net.link(8, 8) == net.hop(1) == (50e9, 1e-5)


def test_nics_per_node_follows_gpus_per_node():
    assert get_hardware("h100-sxm", gpus_per_node=4).nics_per_node == 4
    assert get_hardware("h100-sxm", gpus_per_node=4, nics_per_node=2).nics_per_node == 2


def test_bus_fraction_scales_every_link():
    """--bus-fraction X: a ring reaches X of each link's rate (nccl-tests' bus bandwidth over
    the link rate). At 0.4 instead of 0.8 every link runs at half its preset rate."""
    half = Network.of(get_hardware("a100-80gb", bus_fraction=0.4))
    assert half.link(stride=8, size=16) == (10e9, 5e-6)  # one 25 GB/s NIC x 0.4
    assert half.link(stride=1, size=128) == (80e9, 5e-6)  # 8 NICs x 25 x 0.4


def test_bus_fraction_flag_slows_the_data_parallel_sync(tmp_path, capsys):
    """The same plan (zero2 over 16 A100s, two nodes) at a bus fraction 8x lower: its
    data-parallel traffic takes up to 8x longer (the latency part does not scale)."""
    path = tmp_path / "p.json"
    analytic_profile(layers=4, hidden=1024, ffn=4096, heads=8, vocab=1000, seq=512, batch=1,
                     tflops=100, mfu=0.5).save(path)
    sync = {}
    for x in ("0.8", "0.1"):
        out = tmp_path / f"plan{x}.json"
        rc = main(["plan", "--profile", str(path), "--gpus", "16", "--global-batch", "16",
                   "--gpu", "a100-80gb", "--pp", "1", "--dp", "16", "--sharding", "zero2",
                   "--microbatch-size", "1", "--bus-fraction", x,
                   "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        sync[x] = json.loads(out.read_text())["plans"][0]["allreduce_time"]
    assert 7 < sync["0.1"] / sync["0.8"] <= 8


@pytest.mark.parametrize("flag,value", [("--nics-per-node", "0"), ("--nics-per-node", "-2"),
                                        ("--nics-per-node", "x"), ("--bus-fraction", "0"),
                                        ("--bus-fraction", "1.5"), ("--bus-fraction", "nan")])
def test_bad_network_flag_is_one_line(tmp_path, capsys, flag, value):
    path = tmp_path / "p.json"
    analytic_profile(layers=2, hidden=64, ffn=256, heads=4, vocab=100, seq=64, batch=1,
                     tflops=100, mfu=0.5).save(path)
    rc = main(["plan", "--profile", str(path), "--gpus", "8", "--global-batch", "8",
               "--gpu", "a100-80gb", flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and err.count("\n") == 1
