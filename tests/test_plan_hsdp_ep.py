"""Expert parallelism under HSDP, as torchtitan 0.3.0 runs it: EP carved out of the shard
group (``dp_shard x cp``, x ``tp / etp``), the experts' states sharded over ``efsdp =
tp x cp x dp_shard / (etp x ep)`` and replicated over ``dp_replicate`` (its sparse mesh
``pp x dp_replicate x efsdp x ep``, ``fsdp.apply_fsdp_to_decoder``'s ``edp_mesh``
``["dp_replicate", "efsdp"]``). Group sizes, bytes and the experts' gradient traffic by hand
on 32 GPUs; a torchtitan search that picks an hsdp + ep plan; its paste; bad ep, one line."""

from __future__ import annotations

import json

import pytest

from pipebubble.errors import UserError
from pipebubble.plan import frameworks as F
from pipebubble.plan.axes import Axes, Point
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.network import Network
from pipebubble.plan.planner import search
from pipebubble.plan.shardings import Sharding
from test_plan_moe import TINY, _plan, _profiles, _request, _write_profile

NET = Network(gpus_per_node=8, intra=(100e9, 0.0), inter=(10e9, 0.0))
EXPERT = 8 * 3 * 64 * 64  # TINY: 8 experts of 3 x 64 x 64 parameters, a MoE layer (3 of 4)
LOCAL = EXPERT // 4  # one rank's routed parameters of a MoE layer at ep 4, etp 1: 24,576


def _axes(ep: int = 4, ep_from: str = "dp") -> Axes:
    return Axes(Point(ParallelDims(ep_from=ep_from), "hsdp", ep=ep), NET,
                state_bytes=(2.0, 2.0, 12.0), grad_bytes=4.0)


def test_groups_by_hand():
    """32 GPUs (4 nodes of 8), tp 1, pp 1, hsdp over dp 32: the shard group is a node's 8
    ranks, 4 replicas. ep 4 takes 4 consecutive ranks of the shard group (0-3), efsdp =
    8 / 4 = 2 ranks 4 apart (0, 4: the same node), dp_replicate 4 ranks 8 apart (0, 8, 16,
    24: one a node). Under either rule: HSDP's EP never takes a replica."""
    for rule in ("dp", "dp_shard"):
        ax = _axes(ep_from=rule)
        assert ax.ep_fits(32)
        d = ax.dims(32)
        assert (d.dp_replicate, d.dp_shard, d.hybrid) == (4, 8, True)
        assert (d.expert_data_parallel, d.efsdp, ax.expert_shard(32)) == (8, 2, 2)
        assert d.group("ep") == (1, 4) and d.group("efsdp") == (4, 2)
        assert d.group("dp_replicate") == (8, 4) and d.group("edp") == (4, 8)
        assert d.members_per_node("ep", 8) == 4
        assert NET.link(*d.group("efsdp")) == NET.intra
        assert NET.link(*d.group("dp_replicate")) == NET.inter  # one NIC a member
        assert not _axes(ep=16, ep_from=rule).ep_fits(32)  # 16 does not divide 8
    # the same 32 ranks under DDP: Megatron-Core's folding lets ep 16 take replicas
    assert Axes(Point(ParallelDims(), "ddp", ep=16), NET).ep_fits(32)


def test_expert_bytes_per_param_by_hand():
    """The experts' states over efsdp 2, the dense ones over the shard group of 8:
    resharded always (pp 1): (2 + 2 + 12) / 2 = 8 B a routed parameter, 16 / 8 = 2 dense;
    resharded never (pp 2, torchtitan under PP): weights and gradients kept whole, 2 + 2 +
    12 / 2 = 10 B (dense 2 + 2 + 12 / 8 = 5.5)."""
    ax = _axes()
    assert ax.expert_bytes_per_param(32, pp=1) == 8.0
    assert ax.bytes_per_param(32, pp=1) == 2.0
    assert ax.expert_bytes_per_param(32, pp=2) == 10.0
    assert ax.bytes_per_param(32, pp=2) == 5.5


def test_expert_gradient_traffic_by_hand():
    """One MoE layer's 24,576 local routed parameters, fp32 gradients, resharded never (pp
    2, once a step): the gather 2 x 24,576 B x 1/2 over NVLink (100 GB/s) = 245.76 ns, the
    reduce-scatter 4 x 24,576 x 1/2 / 100e9 = 491.52 ns, then the replicas' all-reduce of
    half the gradient over one NIC a node (10 GB/s): 2 x 3/4 x 49,152 B / 10e9 = 7.3728 us.
    Resharded always (pp 1) the same, every microbatch (layer_traffic), nothing once a
    step."""
    ax = _axes()
    sync = ax.expert_sync(32, pp=2)
    assert (sync.sharding, sync.n, sync.stride, sync.shard) == (Sharding.HSDP, 8, 4, 2)
    before, after = sync.times(LOCAL, pp=2)
    assert before == pytest.approx(245.76e-9)
    assert after == pytest.approx(491.52e-9 + 7.3728e-6)
    always = ax.expert_sync(32, pp=1)
    assert always.per_microbatch and always.times(LOCAL, pp=1) == (0.0, 0.0)
    assert always.layer_traffic(LOCAL) == pytest.approx((245.76e-9, 491.52e-9 + 7.3728e-6))
    # the dense weights of the same rank: HSDP over the shard group of 8 (stride 1)
    assert ax.sync(32, 2).layer_traffic(LOCAL)[0] == pytest.approx(7 / 8 * 2 * LOCAL / 100e9)


def test_torchtitan_search_picks_hsdp_with_ep():
    """32 GPUs, ep 4, tp 1 under torchtitan: EP must sit in the sharded ranks, so DDP is
    out; FSDP's group stays in a node only at pp 4 (dp 8), while HSDP keeps its shard group
    in a node at pp 2 (2 replicas of 8) and sends only the replicas' all-reduce of 1 / 8 of
    the gradient (1 / efsdp of the experts') across. The fastest plan torchtitan runs is
    hsdp + ep 4, with the paste's degrees."""
    hw = get_hardware("h100-sxm")
    req, hw2 = F.apply(F.settings("torchtitan"), _request(gpus=32, global_batch=64, top=400,
                                                          tp=(1,), cp=(1,), ep=(4,)), hw)
    plans = [p for p in search(_profiles(), req, hw2).plans
             if F.blocker("torchtitan", p) is None]
    best = plans[0]
    d = best.dims
    assert (best.sharding, d.ep, d.hybrid) == ("hsdp", 4, True)
    assert d.dp_shard * d.dp_replicate == d.dp and d.dp_shard == 8
    fsdp = [p for p in plans if p.sharding == "fsdp"]
    assert fsdp and fsdp[0].step_time > best.step_time


def test_hsdp_ep_optimizer_memory_by_hand():
    """pp 1, hsdp (4 replicas of 8) at ep 4: the optimizer holds 12 B of 1 / 8 of each
    dense parameter and of 1 / efsdp = 1 / 2 of the routed ones a rank holds (3 MoE layers
    x 98,304 / 4)."""
    hw = get_hardware("h100-sxm")
    req, hw2 = F.apply(F.settings("torchtitan"), _request(
        gpus=32, global_batch=64, top=400, tp=(1,), cp=(1,), pp=(1,), ep=(4,),
        shardings=("hsdp",)), hw)
    plans = search(_profiles(), req, hw2).plans
    assert plans and all(p.dims.hybrid and p.dims.efsdp == 2 for p in plans)
    dense = TINY.total_params() - 3 * EXPERT
    assert plans[0].memory[0]["optimizer"] == pytest.approx(12 * (dense / 8 + 3 * LOCAL / 2))


def test_cli_torchtitan_pastes_the_three_degrees(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _plan(["--profile", _write_profile(tmp_path), "--gpu", "h100-sxm",
                          "--gpus", "32", "--global-batch", "64", "--microbatch-size", "1",
                          "--schedules", "1f1b", "--recompute", "none", "--tp", "1",
                          "--ep", "4", "--sharding", "hsdp", "--framework", "torchtitan",
                          "--json"], capsys)
    assert rc == 0, err
    best = json.loads(out)["plans"][0]
    assert (best["sharding"], best["ep"]) == ("hsdp", 4)
    par = best["torchtitan"]["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["expert_parallel_degree"]) == (best["dp_replicate"], best["dp_shard"], 4)
    assert par["data_parallel_replicate_degree"] > 1 and par["data_parallel_shard_degree"] == 8
    cli = best["torchtitan"]["cli"]
    for k, v in par.items():
        if k.endswith("_degree"):
            assert f"--parallelism.{k} {v}" in cli


@pytest.mark.parametrize("framework", ["torchtitan", "none"])
def test_ep_outside_the_shard_group_is_one_line(tmp_path, capsys, monkeypatch, framework):
    """ep 8 on 32 GPUs at tp = etp = 2: the shard group holds 8 / 2 = 4 data-parallel
    ranks (one node with their TP pairs), whatever the framework's rule (HSDP is
    torchtitan's layout); the 8 experts alone would allow ep 8."""
    monkeypatch.chdir(tmp_path)
    rc, _, err = _plan(["--profile", _write_profile(tmp_path), "--gpu", "h100-sxm",
                        "--gpus", "32", "--global-batch", "64", "--microbatch-size", "1",
                        "--tp", "2", "--etp", "2", "--cp", "1", "--ep", "8", "--sharding", "hsdp",
                        "--framework", framework], capsys)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--ep 8 must divide HSDP's shard group" in err
    assert err.strip().endswith("leave it in 4; valid ep are 1, 2, 4")


def test_dims_refuse_ep_over_replicas_under_hsdp():
    with pytest.raises(UserError, match=r"^ep 16 must divide dp_shard x cp = 8 .*HSDP's "
                                        r"shard group only.*valid are 1, 2, 4, 8$"):
        ParallelDims(dp_replicate=4, dp_shard=8, ep=16)


def test_hsdp_shards_over_dp_shard_and_cp_by_hand():
    """16 GPUs, tp 1, cp 2, hsdp over dp 8: 4 data-parallel ranks a node with their CP
    pairs, 2 replicas. torchtitan shards over dp_shard x cp = 8 ranks (its fsdp mesh), so
    the dense states are 16 / 8 = 2 B a parameter resharded always, and the replicas'
    all-reduce runs between the two nodes (8 apart); ep 4 at etp 1 leaves efsdp 8 / 4 = 2."""
    ax = Axes(Point(ParallelDims(cp=2), "hsdp", ep=4, etp=1), NET,
              state_bytes=(2.0, 2.0, 12.0), grad_bytes=4.0)
    d = ax.dims(8)
    assert (d.dp_replicate, d.dp_shard, ax.shard(8), d.efsdp) == (2, 4, 8, 2)
    assert ax.bytes_per_param(8, pp=1) == 2.0 and ax.expert_bytes_per_param(8, pp=1) == 8.0
    sync = ax.sync(8, 2)
    assert (sync.n, sync.shard, sync.stride) == (16, 8, 1)
    P = 1e6
    assert sync.times(P, 2)[1] == pytest.approx(7 / 8 * 4 * P / 100e9
                                                + 2 * 1 / 2 * 4 * P / 8 / 10e9)
