"""MoE profiles in the planner (plan/expert.py): the all-to-all priced by hand on the two-level
network, expert states sharded over the expert-data-parallel group by hand, the EP axis
searched and restricted (``--ep``, ``ep=`` in ``--config``), the pastes' EP flags, and the
one-line refusals."""

from __future__ import annotations

import json
import math

import pytest

from pipebubble.cli import main
from pipebubble.plan.compute import Rates
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.expert import (
    ExpertCosts,
    all_to_all_time,
    moe_model_flops_per_sequence,
    routed_shares,
)
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.moe import MoEShape, layer_cost, moe_profile
from pipebubble.plan.network import Network
from pipebubble.plan.planner import Request, search

NET = Network(gpus_per_node=8, intra=(100e9, 1e-6), inter=(10e9, 5e-6))
# 4 layers (the first dense), 8 experts of inner size 64, top 2, one shared expert
TINY = MoEShape(layers=4, hidden=64, heads=4, vocab=128, experts=8, top_k=2, expert_ffn=64,
                shared_experts=1, shared_ffn=64, dense_layers=(0,), dense_ffn=128)
SEQ = 32


def _profiles(shape: MoEShape = TINY) -> ProfileSet:
    return ProfileSet([moe_profile(shape, seq=SEQ, batch=1)])


def _request(**kw) -> Request:
    base = dict(gpus=8, gpu_memory=80 * 2**30, global_batch=16, microbatch_sizes=(1,),
                schedules=("1f1b",), recompute=("none",), top=50)
    base.update(kw)
    return Request(**base)


# ---- the all-to-all by hand ------------------------------------------------------------------
def test_all_to_all_inside_a_node_runs_on_nvlink():
    # 8 ranks in one node: 7/8 of the 16 MB leave the rank, over NVLink at 100 GB/s
    assert all_to_all_time(16e6, ep=8, tp=1, net=NET) == pytest.approx(7 / 8 * 16e6 / 100e9
                                                                        + 1e-6)
    # TP 2 x EP 4: the EP group's 4 members are 2 apart, still one node
    assert all_to_all_time(16e6, ep=4, tp=2, net=NET) == pytest.approx(3 / 4 * 16e6 / 100e9
                                                                        + 1e-6)
    assert all_to_all_time(16e6, ep=1, tp=1, net=NET) == 0.0


def test_all_to_all_across_nodes_waits_for_the_nic():
    # 16 ranks over 2 nodes: 7/16 stays in the node (NVLink), 8/16 crosses on the rank's NIC
    nvlink, nic = 7 / 16 * 16e6 / 100e9, 8 / 16 * 16e6 / 10e9
    assert all_to_all_time(16e6, ep=16, tp=1, net=NET) == pytest.approx(max(nvlink, nic) + 5e-6)
    # TP 4 x EP 4: 2 EP members a node, 2 nodes: half the bytes cross
    assert all_to_all_time(16e6, ep=4, tp=4, net=NET) == pytest.approx(
        max(1 / 4 * 16e6 / 100e9, 2 / 4 * 16e6 / 10e9) + 5e-6)
    # half the NICs a node: each GPU gets half a NIC
    half = Network(8, (100e9, 0.0), (10e9, 0.0), nics_per_node=4)
    assert all_to_all_time(16e6, ep=16, tp=1, net=half) == pytest.approx(8 / 16 * 16e6 / 5e9)


def test_group_limited_routing_crosses_once_a_node():
    """DeepSeek-V3: 8 groups on 8 nodes, each token within 4 of them: a node is reached
    with probability 1 - C(7, 4) / C(8, 4) = 1/2, so 7 x 1/2 = 3.5 crossings of 8 copies."""
    ds = MoEShape(layers=1, hidden=64, heads=4, vocab=10, experts=256, top_k=8, expert_ffn=8,
                  expert_groups=8, group_top_k=4)
    on, off = routed_shares(ds, ep=64, members=8)
    assert off == pytest.approx(3.5 / 8) and on == pytest.approx(7 / 8)
    assert routed_shares(ds, ep=8, members=8) is None  # one node: nothing crosses
    assert routed_shares(TINY, ep=16, members=8) is None  # no group limit


def test_the_block_carries_four_all_to_alls_of_t_k_h_values():
    """One MoE block at EP 16 on two nodes: F and I each hold a dispatch and a combine of
    T k u h 16-bit values, u = the imbalance; the CostModel's a2a_f / a2a_b are those parts."""
    rates = Rates.of(get_hardware("h100-sxm"))
    for u in (1.0, 1.5):
        shape = MoEShape(layers=2, hidden=64, heads=4, vocab=128, experts=16, top_k=2,
                         expert_ffn=64)
        costs = ExpertCosts(shape, SEQ, rates, NET, ep=16, imbalance=u)
        one = all_to_all_time(2 * SEQ * 2 * u * 64, 16, 1, NET)  # T=32, k=2, h=64, 2 bytes
        blk = costs.block_of(True, 1)
        assert blk["a2a"] == pytest.approx(2 * one)
        lc = costs.at(1)
        assert list(lc.a2a_f) == pytest.approx([0.0, 2 * one, 2 * one, 0.0])
        assert list(lc.a2a_b) == pytest.approx([0.0, 2 * one, 2 * one, 0.0])
        assert all(lc.f >= lc.a2a_f) and all(lc.i >= lc.a2a_b)
        full = costs.at(1, "full")  # the recomputed forward re-runs its all-to-alls
        assert full.a2a_b[1] == pytest.approx(4 * one)


def test_model_flops_follow_the_active_path():
    """3 forwards of: each layer's attention (scores in full), router, top-k and shared
    experts (or the dense MLP), and the head."""
    flops = sum(layer_cost(TINY, n, SEQ, 1).forward_flops for n in range(4))
    assert moe_model_flops_per_sequence(TINY, SEQ) == 3 * (flops + 2 * SEQ * 64 * 128)


# ---- expert memory, by hand ------------------------------------------------------------------
def test_expert_states_shard_over_the_expert_data_parallel_group():
    """ZeRO-1 over dp = 8 at EP 4: a rank holds 1/4 of the routed experts, and their optimizer
    state is split over the 8 / 4 = 2 ranks that hold the same experts; the rest (attention,
    router, shared expert, dense layer, embedding, head) over all 8."""
    res = search(_profiles(), _request(pp=(1,), ep=(4,), shardings=("zero1",)),
                 get_hardware("h100-sxm"))
    plan = res.plans[0]
    assert (plan.dims.ep, plan.dims.dp, plan.dims.expert_data_parallel) == (4, 8, 2)
    routed = 3 * TINY.experts * TINY.expert_params()  # 3 MoE layers
    dense = TINY.total_params() - routed
    mem = plan.memory[0]
    assert mem["weights"] == pytest.approx(2 * (dense + routed / 4))
    assert mem["gradients"] == pytest.approx(2 * (dense + routed / 4))
    assert mem["optimizer"] == pytest.approx(12 * (dense / 8 + routed / 4 / 2))


def test_ddp_replicates_the_experts_of_each_ep_rank():
    """DDP at EP 2 (inside CP 2, which every framework's rule allows): experts / 2 a rank,
    every state whole."""
    res = search(_profiles(), _request(pp=(1,), cp=(2,), ep=(2,), shardings=("ddp",)),
                 get_hardware("h100-sxm"))
    plan = res.plans[0]
    routed = 3 * TINY.experts * TINY.expert_params()
    dense = TINY.total_params() - routed
    assert plan.memory[0]["optimizer"] == pytest.approx(12 * (dense + routed / 2))


# ---- the axis: searched, restricted ------------------------------------------------------------
def test_ep_is_searched_and_restricted():
    hw = get_hardware("h100-sxm")
    every = {p.dims.ep for p in search(_profiles(), _request(shardings=("zero1",)), hw).plans}
    assert len(every) > 1 and every <= {1, 2, 4, 8}
    only = search(_profiles(), _request(shardings=("zero1",), ep=(2,)), hw).plans
    assert {p.dims.ep for p in only} == {2}
    for p in only:  # ep divides dp_shard x cp: the validated degrees
        assert ParallelDims(**{k: v for k, v in p.dims.as_json().items()
                               if k not in ("dp",)}) == p.dims
        assert p.dims.data_context % 2 == 0


def _write_profile(tmp_path, shape: MoEShape = TINY) -> str:
    path = tmp_path / "moe.json"
    moe_profile(shape, seq=SEQ, batch=1).save(str(path))
    return str(path)


def _plan(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


BASE = ["--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--microbatch-size", "1",
        "--schedules", "1f1b", "--recompute", "none"]


def test_config_ep_and_the_pastes_carry_ep(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prof = _write_profile(tmp_path)
    rc, out, err = _plan(["--profile", prof, *BASE, "--config", "ep=4,pp=1,tp=1,sharding=fsdp",
                          "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["config"]["ep"] == 4 and data["config"]["all_to_all"]["ep"] == 4
    paste = data["pastes"]
    assert paste["torchtitan"]["parallelism"]["expert_parallel_degree"] == 4
    assert "--parallelism.expert_parallel_degree 4" in paste["torchtitan"]["cli"]
    flags = paste["megatron"]["flags"] or paste["megatron"]["instead"]["flags"]
    for f in ("--expert-model-parallel-size", "--num-experts 8", "--moe-router-topk 2"):
        assert f in flags
    assert "--expert-model-parallel-size 4" in (paste["megatron"]["flags"] or "")
    assert '--moe-layer-freq "[0,1,1,1]"' in flags  # the first layer is dense


def test_the_table_shows_ep(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "160")
    rc, out, err = _plan(["--profile", _write_profile(tmp_path), *BASE, "--ep", "8",
                          "--top", "1"], capsys)
    assert rc == 0, err
    assert "ep=8" in out and "all-to-all" in out


def test_recompute_all_on_an_moe_profile_tries_the_moe_modes(tmp_path, capsys, monkeypatch):
    """--recompute all means every mode the MoE layers are priced for: torchtitan's op-level
    checkpointing (dense blocks only) is left out, not a one-line refusal of the whole plan."""
    monkeypatch.chdir(tmp_path)
    args = [a if a != "none" else "all" for a in BASE]
    rc, out, err = _plan(["--profile", _write_profile(tmp_path), *args, "--json"], capsys)
    assert rc == 0, err
    modes = {p["recompute"] for p in json.loads(out)["plans"]}
    assert "op" not in modes and len(modes) > 1
    rc, _, err = _plan(["--profile", _write_profile(tmp_path), *BASE[:-1], "op"], capsys)
    assert rc == 2 and "op" in err and "MoE" in err and len(err.strip().splitlines()) == 1


# ---- bad input: one line, exit 2 ----------------------------------------------------------------
@pytest.mark.parametrize("extra, words", [
    (["--ep", "3"], "must divide the model's 8 experts"),
    (["--ep", "16"], "must divide"),
    (["--config", "ep=3"], "--config ep=3: ep 3 must divide the model's 8 experts"),
    (["--config", "ep=4,pp=4"], "must divide dp x cp"),
    # (tp 1: at etp 1 < tp, EP could borrow the TP ranks ddp leaves: tests/test_plan_etp.py)
    (["--ep", "2", "--cp", "1", "--tp", "1", "--sharding", "ddp", "--framework", "torchtitan"],
     "must divide dp_shard x cp (torchtitan's EP borrows the sharded data-parallel ranks"),
    (["--moe-imbalance", "0.5"], "--moe-imbalance must be a finite number >= 1"),
    (["--moe-imbalance", "nan"], "--moe-imbalance"),
    (["--moe-imbalance", "inf"], "--moe-imbalance"),
    (["--moe-recipe", "deepseek"], "--moe-recipe must be one of deepseek-v3, none, got "
                                   "'deepseek'"),
])
def test_bad_moe_input_is_one_line(tmp_path, capsys, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _plan(["--profile", _write_profile(tmp_path), *BASE, *extra], capsys)
    assert rc == 2
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_ep_on_a_dense_profile_is_refused(tmp_path, capsys):
    path = tmp_path / "dense.json"
    assert main(["profile", "--analytic", "--layers", "4", "--hidden", "64", "--ffn", "128",
                 "--heads", "4", "--vocab", "128", "--seq", "32", "--out", str(path)]) == 0
    capsys.readouterr()
    rc, _, err = _plan(["--profile", str(path), *BASE, "--ep", "2"], capsys)
    assert rc == 2 and "--ep 2 needs an MoE profile" in err
    assert len(err.strip().splitlines()) == 1


def test_top_k_above_the_experts_is_refused(tmp_path, capsys):
    path = tmp_path / "moe.json"
    moe_profile(TINY, seq=SEQ, batch=1).save(str(path))
    data = json.loads(path.read_text())
    data["moe"]["top_k"] = 9
    path.write_text(json.dumps(data))
    rc, _, err = _plan(["--profile", str(path), *BASE], capsys)
    assert rc == 2 and "top_k must be in 1..8" in err and len(err.strip().splitlines()) == 1


def test_imbalance_slows_the_experts():
    hw = get_hardware("h100-sxm")
    even, skew = (search(_profiles(), _request(pp=(1,), ep=(8,), shardings=("zero1",),
                                               moe_imbalance=u), hw).plans[0]
                  for u in (1.0, 2.0))
    assert skew.step_time > even.step_time
    assert math.isfinite(skew.step_time)


def test_pruning_keeps_the_plans_simulating_everything_finds():
    """The bounds stay bounds with the experts' own states and traffic: the pruned search
    returns the plans of the search that simulates every configuration."""
    hw = get_hardware("h100-sxm")
    req = _request(top=8, schedules=("1f1b", "dualpipe"), ep=(2, 4),
                   shardings=("zero1", "fsdp"), recompute=("none", "full"))
    fast = search(_profiles(), req, hw).plans
    slow = search(_profiles(), Request(**{**req.__dict__, "prune": False}), hw).plans
    assert [p.step_time for p in fast] == pytest.approx([p.step_time for p in slow], rel=1e-12)
    assert {p.dims.ep for p in slow} == {2, 4}  # EP is among what is compared


def test_group_limited_routing_keys_are_read_and_checked():
    from pipebubble.errors import UserError
    from pipebubble.plan.moe import moe_shape_from_hf

    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
           "moe_intermediate_size": 32, "n_routed_experts": 16, "n_shared_experts": 1,
           "num_experts_per_tok": 4, "first_k_dense_replace": 1, "num_attention_heads": 4,
           "num_hidden_layers": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "vocab_size": 100,
           "n_group": 4, "topk_group": 2}
    shape, used = moe_shape_from_hf(cfg)
    assert (shape.expert_groups, shape.group_top_k) == (4, 2) and used["n_group"] == 4
    with pytest.raises(UserError, match="'n_group' 5 must divide 'n_routed_experts' 16"):
        moe_shape_from_hf(dict(cfg, n_group=5))
    with pytest.raises(UserError, match="'topk_group' 6 be in 1..4"):
        moe_shape_from_hf(dict(cfg, topk_group=6))


def test_the_default_imbalance_is_the_capacity_factor():
    from pipebubble.plan.expert import default_imbalance
    from pipebubble.plan.moe import moe_shape_from_hf

    assert default_imbalance(TINY) == 1.0  # no capacity factor: even routing
    cfg = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_hidden_layers": 2, "num_local_experts": 4,
           "num_experts_per_tok": 2, "vocab_size": 100, "capacity_factor": 1.25}
    shape, used = moe_shape_from_hf(cfg)
    assert default_imbalance(shape) == 1.25 and used["capacity_factor"] == 1.25
    hw = get_hardware("h100-sxm")
    prof = ProfileSet([moe_profile(shape, seq=SEQ, batch=1)])
    at_default = search(prof, _request(pp=(1,), ep=(4,), shardings=("zero1",)), hw).plans[0]
    given = search(prof, _request(pp=(1,), ep=(4,), shardings=("zero1",),
                                  moe_imbalance=1.25), hw).plans[0]
    assert at_default.step_time == given.step_time


def test_torchtitan_gets_ep_and_a_note_where_it_lays_the_experts_out_otherwise():
    from pipebubble.plan.expert import torchtitan_moe

    assert torchtitan_moe(ParallelDims(dp_shard=8, ep=4)) == (
        {"expert_parallel_degree": 4}, None)
    entries, note = torchtitan_moe(ParallelDims(tp=2, cp=4, dp_shard=2, ep=2))  # etp = tp
    assert entries == {"expert_parallel_degree": 2, "expert_tensor_parallel_degree": 2}
    assert "expert_tensor_parallel_degree = 2 only if ep is a multiple of cp 4" in note
    assert "torchtitan 0.3" in note and "expert_parallel_degree = 4 at etp 1" in note
    # etp 1: torchtitan 0.2's etp 1 and 0.3's only layout (EP borrows the TP ranks)
    assert torchtitan_moe(ParallelDims(tp=2, sp=True, dp_shard=2, ep=4, etp=1)) == (
        {"expert_parallel_degree": 4, "expert_tensor_parallel_degree": 1}, None)


def test_moe_recipe_flag_reaches_the_planner(tmp_path, capsys, monkeypatch):
    """--moe-recipe deepseek-v3 prices the recipe: the same configuration is slower (its MTP
    module on the head's stage, the casts, the communication SMs) than with none, which is
    the default."""
    monkeypatch.chdir(tmp_path)
    prof = _write_profile(tmp_path)
    got = {}
    for name in ("none", "deepseek-v3"):
        rc, out, err = _plan(["--profile", prof, *BASE, "--precision", "fp8", "--config",
                              "ep=4,pp=2,sharding=zero1", "--moe-recipe", name, "--json"],
                             capsys)
        assert rc == 0, err
        got[name] = json.loads(out)["config"]
    rc, out, err = _plan(["--profile", prof, *BASE, "--precision", "fp8", "--config",
                          "ep=4,pp=2,sharding=zero1", "--json"], capsys)
    default = json.loads(out)["config"]
    for c in (default, *got.values()):  # how long the rank's bounds took: not the plan
        c["rank_bounds"].pop("seconds", None)
    assert rc == 0 and default == got["none"]
    assert got["deepseek-v3"]["predicted_step_time"] > got["none"]["predicted_step_time"]
