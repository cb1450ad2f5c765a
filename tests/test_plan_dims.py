"""The planner's degrees in one value (plan/dims.py): validation, derived sizes and the
grid layout checked by hand, and every plan the search returns carrying dims that multiply
to its GPUs and split dp as its sharding does."""

import itertools

import pytest

from pipebubble.commands._flags import render
from pipebubble.errors import UserError
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.config import parse_config
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.network import Network
from pipebubble.plan.planner import Request, search


def test_sizes_by_hand():
    d = ParallelDims(tp=4, cp=2, pp=3, dp_replicate=2, dp_shard=5)
    assert d.dp == 10 and d.world == 4 * 2 * 3 * 10
    assert d.model_parallel == 8 and d.non_data_parallel == 24
    assert d.data_context == 20 and d.stage_ranks == 80
    assert d.stage_distance(0) == 0 and d.stage_distance(2) == 160


def test_groups_follow_the_grid_order():
    """TP innermost, then CP, DP, PP: a group's stride is the product of the axes inside it."""
    d = ParallelDims(tp=2, cp=4, pp=2, dp_shard=3)
    assert d.group("tp") == (1, 2)
    assert d.group("cp") == (2, 4)
    assert d.group("dp") == (8, 3)
    assert d.group("dp_cp") == (2, 12)
    assert d.group("pp") == (24, 2)
    assert d.group("ep") == (2, 1)  # ep 1: one rank
    e = ParallelDims(tp=2, cp=2, dp_shard=8, ep=4)  # EP: 4 consecutive ranks of cp x dp
    assert e.group("ep") == (2, 4) and e.group("edp") == (8, 4)
    assert e.expert_data_parallel * e.ep == e.data_context
    with pytest.raises(UserError, match="unknown axis 'xp'"):
        d.group("xp")


def test_members_and_groups_per_node_match_the_network():
    """Members per node agree with Network.members_per_node for every axis, and members x
    groups covers a node (every GPU in one group of each axis; degrees of two, so groups
    align with nodes)."""
    net = Network(gpus_per_node=8, intra=(1.0, 0.0), inter=(1.0, 0.0))
    for tp, cp, pp, dp in itertools.product((1, 2, 4, 8), (1, 2), (1, 2), (1, 2, 4)):
        d = ParallelDims(tp=tp, cp=cp, pp=pp, dp_shard=dp)
        for axis in ("tp", "cp", "dp", "pp"):
            stride, size = d.group(axis)
            k = d.members_per_node(axis, 8)
            assert k == net.members_per_node(stride, size)
            if d.world >= 8:
                assert k * d.groups_per_node(axis, 8) == 8


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 0}, "tp must be an integer >= 1, got 0"),
    ({"pp": 2.0}, "pp must be an integer >= 1, got 2.0"),
    ({"dp_shard": True}, "dp_shard must be an integer >= 1, got True"),
    ({"sp": True}, "sp needs tp > 1"),
    ({"sp": 1, "tp": 2}, "sp must be a bool"),
    ({"ep": 3, "dp_shard": 4}, "ep 3 must divide dp x cp = 4 .*valid are 1, 2, 4$"),
    ({"ep": 3, "dp_shard": 4, "ep_from": "dp_shard"},
     "ep 3 must divide dp_shard x cp = 4 .*valid are 1, 2, 4$"),
    ({"ep_from": "dp_replicate"}, "ep_from must be one of dp, dp_shard"),
])
def test_bad_degrees_are_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as exc:
        ParallelDims(**kwargs)
    assert "\n" not in str(exc.value)


def test_expert_parallel_inside_shard_times_context():
    """torchtitan's rule: EP is carved out of dp_shard x cp; the rest is expert data
    parallel."""
    d = ParallelDims(cp=2, dp_shard=4, ep=8, ep_from="dp_shard")
    assert d.expert_data_parallel == 1
    assert ParallelDims(cp=2, dp_shard=4, ep=2, ep_from="dp_shard").expert_data_parallel == 4
    with pytest.raises(UserError, match="ep 2 must divide dp_shard x cp = 1"):
        ParallelDims(dp_replicate=4, ep=2, ep_from="dp_shard")  # torchtitan: replicas no room


def test_expert_parallel_over_replicated_ranks_as_megatron_core_folds_it():
    """Megatron-Core's rule (the default): EP takes any data-parallel ranks, DDP's replicas
    too. World 16 = tp 2 x dp_replicate 4 x pp 2, ep 4: Megatron-Core's expert_dp = world /
    (etp ep pp) = 16 / (2 x 4 x 2) = 1; at ep 2, 2, the EDP pair 2 x 2 = 4 ranks apart."""
    d = ParallelDims(tp=2, pp=2, dp_replicate=4, ep=4)
    assert d.world == 16 and d.expert_data_parallel == 16 // (2 * 4 * 2) == 1
    assert d.group("ep") == (2, 4)  # ranks 0, 2, 4, 6: the TP-rank-0 of each replica
    two = ParallelDims(tp=2, pp=2, dp_replicate=4, ep=2)
    assert two.expert_data_parallel == 2 and two.group("edp") == (4, 2)
    with pytest.raises(UserError, match="ep 8 must divide dp x cp = 4"):
        ParallelDims(tp=2, dp_replicate=4, ep=8)


def test_check_world():
    ParallelDims(tp=2, pp=2, dp_replicate=4).check_world(16)
    with pytest.raises(UserError, match="= 16 GPUs, but gpus is 32") as info:
        ParallelDims(tp=2, pp=2, dp_replicate=4).check_world(32)
    assert "but --gpus is 32; tp x cp x pp x dp must equal --gpus" in render(info.value)


def test_config_parser_uses_the_degrees():
    assert parse_config("tp=2,pp=4,dp=2", 16) == {"tp": 2, "pp": 4, "dp": 2}
    with pytest.raises(UserError, match="tp=2 x pp=4 = 8 GPUs does not divide gpus 12"):
        parse_config("tp=2,pp=4", 12)
    with pytest.raises(UserError, match="tp=2 x cp=1 x pp=2 x dp=2 = 8 GPUs != gpus 16"):
        parse_config("tp=2,cp=1,pp=2,dp=2", 16)


def test_plans_carry_their_dims():
    """Every plan of a small 4D search: dims multiply to the GPUs, and dp is split as the
    sharding splits it (ddp replicates, zero and fsdp shard all, hsdp both inside a node)."""
    shape = TransformerShape(layers=4, hidden=256, ffn=1024, heads=8, vocab=1000, swiglu=False,
                             tied_embeddings=False)
    prof = ProfileSet([shape_profile(shape, 256, 1)])
    req = Request(gpus=16, gpu_memory=1e15, global_batch=32, microbatch_sizes=(1,),
                  recompute=("none",), schedules=("1f1b",), max_chunks=1, top=400, tp=(1, 2),
                  cp=(1,))
    plans = search(prof, req, get_hardware("a100-80gb")).plans
    seen = set()
    for p in plans:
        d = p.dims
        assert d.world == 16 == p.gpus
        assert (d.tp, d.sp, d.cp, d.pp, d.dp) == (p.tp, p.sp, p.cp, p.pp, p.dp)
        want = {"ddp": (d.dp, 1), "zero1": (1, d.dp), "zero2": (1, d.dp), "fsdp": (1, d.dp)}
        if p.sharding == "hsdp":
            assert d.dp_replicate > 1 and d.dp_shard > 1
            assert d.dp_shard * d.model_parallel <= 8  # the shard group inside a node
        else:
            assert (d.dp_replicate, d.dp_shard) == want[p.sharding]
        j = p.as_json()
        assert (j["dp_replicate"], j["dp_shard"], j["ep"]) == (d.dp_replicate, d.dp_shard, 1)
        seen.add(p.sharding)
    assert seen == {"ddp", "zero1", "zero2", "fsdp", "hsdp"}
