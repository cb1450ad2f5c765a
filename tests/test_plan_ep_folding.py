"""Expert parallelism over plain (replicated) data-parallel ranks, as Megatron-Core's "MoE
parallel folding" lays it out (plan/dims.py ``ParallelDims.ep_from``): the expert mesh
``etp x ep x edp x pp`` over the same world, ``expert_dp = world / (etp x ep x pp)``,
whatever the data-parallel sharding; torchtitan's rule (EP inside ``dp_shard x cp``) kept for
``--framework torchtitan``. Group sizes, strides and the experts' gradient reduction by
hand; the search finding a DDP + EP plan under ``--framework megatron``."""

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
from test_plan_moe import BASE, TINY, _plan, _profiles, _request, _write_profile

NET = Network(gpus_per_node=8, intra=(100e9, 0.0), inter=(10e9, 0.0))
# TINY: 8 experts of 3 x 64 x 64 = 12,288 parameters each, 3 MoE layers of 4
EXPERT = 8 * 3 * 64 * 64  # 98,304 routed parameters a MoE layer


def test_megatron_core_mesh_over_ddp_ranks_by_hand():
    """32 GPUs (4 nodes of 8), tp 2, pp 1, DDP over dp 16, ep 4 (etp = tp 2). Megatron-Core:
    expert_dp = 32 / (2 x 4 x 1) = 4. Rank order tp-ep-dp: an EP group is 4 ranks 2 apart
    (0, 2, 4, 6: one node), the expert-data-parallel group 4 ranks 2 x 4 = 8 apart (0, 8,
    16, 24: one a node, so its all-reduce runs on one NIC)."""
    d = ParallelDims(tp=2, dp_replicate=16, ep=4)
    assert (d.world, d.dp_shard, d.expert_data_parallel) == (32, 1, 4)
    assert d.group("ep") == (2, 4) and d.group("edp") == (8, 4)
    assert d.members_per_node("ep", 8) == 4 and d.members_per_node("edp", 8) == 1


def test_expert_gradient_reduction_over_the_ddp_replicas_by_hand():
    """The same mesh's expert gradients: a rank holds 98,304 / (etp 2 x ep 4) = 12,288
    parameters of each MoE layer, 4 B each on the wire. DDP all-reduces them over the 4
    expert-data-parallel ranks, one a node: 2 x 3/4 x 49,152 B / 10 GB/s = 7.3728 us; the
    dense part over dp 16, 2 apart. Under ZeRO-1 (the distributed optimizer) a
    reduce-scatter and an all-gather of half that each, and a quarter of the optimizer
    states (12 / 4 = 3 B a parameter, +2 weights +2 gradients)."""
    per_rank = EXPERT / (2 * 4)
    assert per_rank == 12288
    ddp = Axes(Point(ParallelDims(tp=2), "ddp", ep=4), NET, state_bytes=(2.0, 2.0, 12.0))
    assert ddp.ep_fits(16)  # torchtitan's rule would refuse: dp_shard 1
    sync = ddp.expert_sync(16)
    assert (sync.n, sync.stride, sync.sharding) == (4, 8, Sharding.DDP)
    assert sync.times(per_rank, 1) == pytest.approx((0.0, 2 * 3 / 4 * 4 * per_rank / 10e9))
    assert sync.times(per_rank, 1)[1] == pytest.approx(7.3728e-6)
    assert ddp.expert_bytes_per_param(16) == 16.0  # replicated over the EDP group
    z1 = Axes(Point(ParallelDims(tp=2), "zero1", ep=4), NET, state_bytes=(2.0, 2.0, 12.0))
    before, after = z1.expert_sync(16).times(per_rank, 1)
    assert after == pytest.approx(3 / 4 * 4 * per_rank / 10e9)
    assert before == pytest.approx(3 / 4 * 2 * per_rank / 10e9)  # the 2-byte weights
    assert z1.expert_bytes_per_param(16) == pytest.approx(2 + 2 + 12 / 4)


def test_torchtitan_rule_keeps_ep_out_of_the_replicas():
    """torchtitan's mesh (pp x dp_replicate x efsdp x ep): the same DDP split leaves EP
    only cp x tp / etp = 1 rank at etp = tp; fsdp gives it dp_shard 16."""
    tt = Axes(Point(ParallelDims(tp=2, ep_from="dp_shard"), "ddp", ep=4), NET)
    assert not tt.ep_fits(16)
    assert Axes(Point(ParallelDims(tp=2, ep_from="dp_shard"), "fsdp", ep=4), NET).ep_fits(16)
    with pytest.raises(UserError, match=r"ep 4 must divide dp_shard x cp = 1 .*never "
                                        r"dp_replicate\); valid are 1$"):
        ParallelDims(tp=2, dp_replicate=16, ep=4, ep_from="dp_shard")


def test_frameworks_set_the_rule():
    """Megatron-LM, NeMo, DeepSpeed and none: any data-parallel rank; torchtitan: dp_shard."""
    req = _request()
    rules = {name: F.apply(F.settings(name), req)[0].ep_from for name in F.FRAMEWORKS}
    assert rules == {"megatron": "dp", "nemo": "dp", "deepspeed": "dp", "none": "dp",
                     "torchtitan": "dp_shard"}


def test_search_under_megatron_finds_ep_over_ddp():
    """8 GPUs, tp 1, DDP only, ep 4: Megatron-Core runs it (expert_dp = 8 / (4 pp)); each
    plan's expert states are replicated over its expert_dp ranks: 16 B a routed parameter
    of the 8 / 4 = 2 experts a rank holds."""
    hw = get_hardware("h100-sxm")
    req, hw2 = F.apply(F.settings("megatron"), _request(tp=(1,), cp=(1,), ep=(4,),
                                                        shardings=("ddp",)), hw)
    plans = search(_profiles(), req, hw2).plans
    assert plans and all(p.dims.ep == 4 and p.dims.dp_replicate == p.dims.dp for p in plans)
    for p in plans:
        assert p.dims.expert_data_parallel == 8 // (4 * p.pp)
        assert F.blocker("megatron", p) is None
        assert F.blocker("torchtitan", p).startswith("torchtitan's EP borrows dp_shard")
    one = next(p for p in plans if p.pp == 1)
    routed = 3 * EXPERT / 4  # 3 MoE layers, ep 4
    dense = TINY.total_params() - 3 * EXPERT
    assert one.memory[0]["optimizer"] == pytest.approx(12 * (dense + routed))


def test_cli_megatron_pastes_ep_over_ddp(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _plan(["--profile", _write_profile(tmp_path), *BASE, "--tp", "1",
                          "--ep", "4", "--sharding", "ddp", "--framework", "megatron",
                          "--json"], capsys)
    assert rc == 0, err
    best = json.loads(out)["plans"][0]
    assert (best["ep"], best["sharding"], best["dp_replicate"]) == (4, "ddp", best["dp"])
    flags = best["megatron"]
    assert "--expert-model-parallel-size 4" in flags
    assert "--use-distributed-optimizer" not in flags
    assert "--moe-router-dtype fp32" in flags  # the ETP reduce-scatter's dtype (plan/expert)


@pytest.mark.parametrize("extra, words", [
    # Megatron-Core: at etp = tp 2, ep must divide dp x cp, at most 4 of 8 GPUs (at etp 1
    # it could borrow the TP ranks: 8 fits)
    (["--tp", "2", "--etp", "2", "--ep", "8", "--framework", "megatron"],
     "--ep 8 must divide dp x cp (expert parallelism is carved out of the data x context "
     "parallel ranks and the TP ranks ETP leaves, tp / etp); these degrees leave "
     "tp x dp x cp / etp in 1, 2, 4"),
    (["--tp", "1", "--cp", "1", "--ep", "2", "--sharding", "ddp", "--framework", "torchtitan"],
     "--ep 2 must divide dp_shard x cp (torchtitan's EP borrows the sharded data-parallel "
     "ranks only), but --sharding ddp leaves"),
    # the same refusal for a --config names the keys the user wrote, not flags
    (["--config", "tp=1,cp=1,pp=1,dp=8,ep=2,sharding=ddp,mbs=1", "--framework", "torchtitan"],
     "--config ep=2 must divide dp_shard x cp (torchtitan's EP borrows the sharded "
     "data-parallel ranks only), but --config sharding=ddp leaves dp_shard x cp in 1 "
     "(ddp shards nothing: dp_shard 1); use --config sharding=fsdp"),
])
def test_ep_the_framework_leaves_no_room_for_is_one_line(tmp_path, capsys, monkeypatch,
                                                        extra, words):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _plan(["--profile", _write_profile(tmp_path), *BASE, *extra], capsys)
    assert rc == 2 and words in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
