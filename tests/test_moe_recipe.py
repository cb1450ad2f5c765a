"""MoERecipe (plan/expert.py): each of DeepSeek-V3's recipe terms checked by hand on a small
case, the overlapped pair's communication SMs (costs.py), and bad input as one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipebubble.costs import CostModel
from pipebubble.errors import ParamError
from pipebubble.plan.compute import Rates, gemm_time, memory_time
from pipebubble.plan.expert import (
    FP8_WIRE_BYTES,
    ExpertCosts,
    MoERecipe,
    all_to_all_time,
)
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.moe import LatentAttention, MoEShape, moe_profile
from pipebubble.plan.network import Network
from pipebubble.plan.planner import Request, search

NET = Network(gpus_per_node=8, intra=(100e9, 0.0), inter=(10e9, 0.0))
SEQ = 32
# 3 layers (the first dense), 16 experts of 64, top 2, one shared expert, GQA attention
SMALL = MoEShape(layers=3, hidden=64, heads=4, vocab=128, experts=16, top_k=2, expert_ffn=64,
                 shared_experts=1, shared_ffn=32, dense_layers=(0,), dense_ffn=128)
MLA = replace(SMALL, mla=LatentAttention(q_rank=48, kv_rank=32, nope_dim=16, rope_dim=8,
                                         v_dim=16))
FP8 = Rates.of(get_hardware("h100-sxm"), 0.5, "fp8")


def _costs(shape=SMALL, ep=16, rates=FP8, **recipe) -> ExpertCosts:
    return ExpertCosts(shape, SEQ, rates, NET, ep=ep, recipe=MoERecipe(**recipe))


def test_fp8_dispatch_sends_one_of_each_pair_in_fp8():
    """Dispatch (and the combine's gradient) at 1 + 4/128 bytes a value, the combine (and
    the dispatch's gradient) at 2: T k h = 32 x 2 x 64 values, EP 16 over two nodes."""
    values = SEQ * 2 * 64
    want = (all_to_all_time(FP8_WIRE_BYTES * values, 16, 1, NET)
            + all_to_all_time(2 * values, 16, 1, NET))
    got = _costs(fp8_dispatch=True).block_of(True, 1)["a2a"]
    assert got == pytest.approx(want)
    # without latency the all-to-all is linear in its bytes: (1.03125 + 2) / (2 + 2)
    assert got / _costs().block_of(True, 1)["a2a"] == pytest.approx((1 + 1 / 32 + 2) / 4)


def test_block_scaling_prices_the_casts_of_a_dense_block_by_hand():
    """Dense GQA block, tp 1, T = 32: forward casts the attention input (h) and O's input
    (q = h), the MLP input (h) and its down input (f = 128); the backward quantizes each
    GEMM's output gradient (QKV 3h, O h, up 2f, down h) twice and transposes the stored
    activations (the forward's inputs)."""
    h, f, T = 64, 128, SEQ
    ins = T * (h + h + h + f)
    outs = T * (3 * h + h + 2 * f + h)
    rate = FP8
    want = (memory_time((2 + FP8_WIRE_BYTES) * ins, rate)
            + memory_time((2 + 2 * FP8_WIRE_BYTES) * outs, rate)
            + memory_time((1 + FP8_WIRE_BYTES) * ins, rate))
    with_casts, plain = _costs(block_scaling=True), _costs()
    blk = with_casts.block_of(False, 1)
    assert blk["casts"] == pytest.approx(want)
    base = plain.block_of(False, 1)
    assert blk["f"] - base["f"] == pytest.approx(memory_time((2 + FP8_WIRE_BYTES) * ins, rate))
    assert blk["w"] - base["w"] == pytest.approx(memory_time((1 + FP8_WIRE_BYTES) * ins, rate))
    # in bf16 nothing is quantized
    bf16 = Rates.of(get_hardware("h100-sxm"), 0.5)
    assert _costs(rates=bf16, block_scaling=True).block_of(False, 1)["casts"] == 0.0


def test_block_scaling_counts_the_routed_copies_once_each():
    """MoE block: the MoE input is cast once before the dispatch (shared with the shared
    expert), each routed copy's down input (k f_e) and the shared down input (f_s)."""
    h, fe, fs, k, T = 64, 64, 32, 2, SEQ
    ins = T * (h + h + h + fs + k * fe)  # attention in, O in, MoE in, shared down, routed
    cost = _costs(block_scaling=True)
    plain = _costs()
    assert cost.block_of(True, 1)["f"] - plain.block_of(True, 1)["f"] == pytest.approx(
        memory_time((2 + FP8_WIRE_BYTES) * ins, FP8))


def test_fp8_gemm_ratio_slows_only_the_fp8_gemms():
    """Ratio 1/2 halves the FP8 rate: a compute-bound FP8 GEMM takes twice as long, the
    attention and the memory-bound work do not change."""
    big = MoEShape(layers=2, hidden=4096, heads=32, vocab=128, experts=8, top_k=2,
                   expert_ffn=4096)
    full = ExpertCosts(big, 4096, FP8, NET, ep=1)
    half = ExpertCosts(big, 4096, FP8, NET, ep=1, recipe=MoERecipe(fp8_gemm_ratio=0.5))
    a, b = full.block_of(True, 1), half.block_of(True, 1)
    router = gemm_time(4096, 8, 4096, FP8)  # 16-bit: the same in both
    assert (b["gemm_f"] - router) / (a["gemm_f"] - router) == pytest.approx(2.0, rel=1e-9)
    assert b["attention_f"] == a["attention_f"] and b["elementwise_f"] == a["elementwise_f"]


def test_recompute_latent_reruns_the_up_projections_and_the_norms():
    """MLA block, tp 1, T = 32: Q up (T, a (nope + rope), q_rank) and KV up (T, a (nope + v),
    kv_rank) again in I, and the norms' traffic (two over h, the two latent norms)."""
    T, a, h = SEQ, 4, 64
    want = (gemm_time(T, a * 24, 48, FP8, fp8=True) + gemm_time(T, a * 32, 32, FP8, fp8=True)
            + memory_time(2 * 4 * T * h + 2 * 2 * T * (48 + 32), FP8))
    on, off = _costs(MLA, recompute_latent=True), _costs(MLA)
    blk = on.block_of(True, 1)
    assert blk["recomputed"] == pytest.approx(want)
    assert blk["i"] - off.block_of(True, 1)["i"] == pytest.approx(want)
    assert blk["f"] == off.block_of(True, 1)["f"]


def test_mtp_puts_one_more_moe_block_and_head_pass_on_the_head():
    """One MTP module: the head layer's parameters grow by an MoE block's, the 2h x h
    projection and two norms; its F by the block's F, the projection and the head's F."""
    on, off = _costs(mtp_layers=1), _costs()
    h = 64
    assert on.params[-1] - off.params[-1] == pytest.approx(off.params[2] + 2 * h * h + 2 * h)
    assert on.experts[-1] == off.experts[2] > 0
    lo, lf = on.at(1), off.at(1)
    blk = off.block_of(True, 1)
    proj = gemm_time(SEQ, h, 2 * h, FP8, fp8=True)
    assert lo.f[-1] - lf.f[-1] == pytest.approx(blk["f"] + proj + lf.f[-1])
    assert lo.a2a_f[-1] == pytest.approx(blk["a2a"]) and lf.a2a_f[-1] == 0.0
    assert list(lo.f[:-1]) == list(lf.f[:-1])
    # the MTP module embeds with the main table: the head's stage keeps a copy of it where
    # its rank holds no embedding (test_plan_tied_copies.py), V x h (tp 1); none without MTP
    assert lo.tied == on.shape.vocab * h and lf.tied == 0.0


def test_comm_sms_slow_the_overlapped_pair_by_their_share_of_the_all_to_all():
    """Compute C = 4, all-to-all A = 2: the pair takes max(C + s A, A); a lone action is
    unchanged (its all-to-all runs alone)."""
    for s in (0.0, 0.25, 0.5):
        sc = CostModel(f=2, b=4, w=0, a2a_f=1, a2a_b=1, comm_sms=s).resolve(1)
        assert sc.pair_duration(0, 0) == (pytest.approx(4 + s * 2), 2.0)
        assert sc.lone_part(0, "F").duration == 2
    # all-to-all-bound: A = 6 > C + s A
    sc = CostModel(f=4, b=4, w=0, a2a_f=3, a2a_b=3, comm_sms=0.25).resolve(1)
    assert sc.pair_duration(0, 0)[0] == pytest.approx(6.0)


def test_the_planner_prices_the_recipe_and_dualpipe_pays_the_sms():
    """A model whose pairs are compute-bound (C > A): the SMs' share of A shows in the step."""
    wide = replace(SMALL, hidden=1024, heads=8, expert_ffn=1024, shared_ffn=1024,
                   dense_ffn=2048)
    prof = ProfileSet([moe_profile(wide, seq=1024, batch=1)])
    hw = get_hardware("h100-sxm")
    req = Request(gpus=32, gpu_memory=80 * 2**30, global_batch=64, microbatch_sizes=(1,),
                  schedules=("dualpipe",), recompute=("none",), top=1, pp=(4,), ep=(8,),
                  shardings=("zero1",), tp=(1,), cp=(1,))
    plain = search(prof, req, hw, 0.5).plans[0]
    sms = search(prof, replace(req, moe_recipe=MoERecipe(comm_sms=0.3)), hw, 0.5).plans[0]
    assert sms.costs.comm_sms == 0.3 and plain.costs.comm_sms == 0.0
    assert sms.step_time > plain.step_time  # its pairs hide all-to-all, so they pay


@pytest.mark.parametrize("kw, name", [
    (dict(comm_sms=1.0), "comm_sms"), (dict(comm_sms=-0.1), "comm_sms"),
    (dict(fp8_gemm_ratio=0.0), "fp8_gemm_ratio"), (dict(fp8_gemm_ratio=1.5), "fp8_gemm_ratio"),
    (dict(mtp_layers=-1), "mtp_layers"), (dict(mtp_layers=1.5), "mtp_layers"),
    (dict(fp8_dispatch=1), "fp8_dispatch"), (dict(fp8_activations=0), "fp8_activations")])
def test_bad_recipe_is_one_line_naming_the_field(kw, name):
    with pytest.raises(ParamError) as exc:
        MoERecipe(**kw)
    # library-only fields (no command takes them) are named plainly, not marked for a flag
    assert str(exc.value).startswith(f"MoERecipe.{name} must ") and "\n" not in str(exc.value)


@pytest.mark.parametrize("rows", [((1, 1e9, 1e9),), ((16, 0.0, 1e9),), ((16, 1e9),),
                                  [(16, 1e9, 1e9)], ((16.0, 1e9, 1e9),),
                                  ((16, float("inf"), 1e9),)])
def test_bad_measured_all_to_all_is_one_line(rows):
    with pytest.raises(ParamError) as exc:
        MoERecipe(a2a_measured=rows)
    assert str(exc.value).startswith("MoERecipe.a2a_measured must ") and (
        "\n" not in str(exc.value))


def test_deepseek_v3_recipe_is_the_reports():
    r = MoERecipe.deepseek_v3(0.9)
    assert (r.fp8_dispatch, r.block_scaling, r.mtp_layers, r.recompute_latent,
            r.fp8_activations, r.weighted_swiglu) == (True, True, 1, True, True, True)
    assert r.comm_sms == pytest.approx(20 / 132) and r.fp8_gemm_ratio == 0.9
    # DeepEP's README (V1, H800, CX7): EP 64 dispatch 51 GB/s, combine 50 GB/s over RDMA
    assert r.a2a_rates(64) == (51e9, 50e9) and r.a2a_rates(8) is None


# two groups of 8 experts, each token's top 2 within its best group: at EP 16 over two
# nodes (one group a node) a token reaches exactly one node
GROUPED = replace(SMALL, expert_groups=2, group_top_k=1)


def test_measured_all_to_all_by_hand_under_group_limited_routing():
    """EP 16 over 2 nodes, T k h = 32 x 2 x 64 values a rank, FP8 dispatch. A token reaches
    one node, so DeepEP's accounting sends 1 copy a token (its own node's counted) for its 2
    expert copies: 1/2 of the bytes at the measured rate (2 GB/s dispatch, 1 GB/s combine);
    NVLink 7/8 of them at 100 GB/s, the slower side wins. The network's pricing sends the
    remote half of the tokens: (2 - 1) x 1/2 / 2 = 1/4 of the bytes at 10 GB/s."""
    values = SEQ * 2 * 64
    rc = dict(fp8_dispatch=True, a2a_measured=((16, 2e9, 1e9),))
    got = _costs(GROUPED, **rc).block_of(True, 1)["a2a"]
    want = FP8_WIRE_BYTES * values * 0.5 / 2e9 + 2 * values * 0.5 / 1e9
    assert got == pytest.approx(want)
    net = _costs(GROUPED, fp8_dispatch=True).block_of(True, 1)["a2a"]
    assert net == pytest.approx((FP8_WIRE_BYTES + 2) * values * 0.25 / 10e9)
    # an EP degree the table does not list keeps the network's rates
    other = dict(fp8_dispatch=True, a2a_measured=((32, 2e9, 1e9),))
    assert _costs(GROUPED, **other).block_of(True, 1)["a2a"] == pytest.approx(net)
    # without group-limited routing the measured rates are not used (each copy travels alone)
    plain = _costs(SMALL, fp8_dispatch=True).block_of(True, 1)["a2a"]
    assert _costs(SMALL, **rc).block_of(True, 1)["a2a"] == pytest.approx(plain)


def _kept(costs: ExpertCosts, moe: bool = True, recompute: str = "none") -> float:
    return costs._activations(1 if moe else 0, 1, recompute)[0]


def test_recompute_latent_keeps_the_latents_not_their_norms_nor_q_k_v():
    """MLA MoE block, tp 1, T = 32: the normed attention and MLP inputs (4 T h), the normed
    latents (2 T (r_q + r_kv)) and Q, K, V (2 T a (2 d_qk + d_v)) not kept; while the block's
    backward runs they are there again (the transient)."""
    T, h, a = SEQ, 64, 4
    dropped = 4 * T * h + 2 * T * (48 + 32) + 2 * T * a * (2 * 24 + 16)
    on, off = _costs(MLA, recompute_latent=True), _costs(MLA)
    assert _kept(off) - _kept(on) == pytest.approx(dropped)
    assert on._activations(1, 1, "none")[2] == pytest.approx(_kept(off))
    lc = on.at(1)
    assert lc.transient[2] == pytest.approx(dropped) and off.at(1).transient[2] == 0.0
    # a GQA block has no up-projections: only the normed inputs
    assert _kept(_costs(SMALL)) - _kept(_costs(SMALL, recompute_latent=True)) == (
        pytest.approx(4 * T * h))


def test_fp8_activations_by_hand_on_an_moe_and_a_dense_block():
    """GQA, tp 1, ep 16, T = 32, k = 2 copies a token: O's input (q = a d = 64) from 2 to
    E5M6's 1.5 + 4/128 bytes; the shared expert's SwiGLU (6 T f_s) and each copy's (6 f_e)
    to gate and up in FP8 (2 x 1.03125), the product re-run; each dispatched copy (2 h) to
    FP8. Dense block: O's input and the down-projection's input (2 T f) in FP8."""
    T, h, q, fs, fe, k, fd = SEQ, 64, 64, 32, 64, 2, 128
    w8 = 1 + 4 / 128
    moe = (2 - (1.5 + 4 / 128)) * T * q + (6 - 2 * w8) * T * fs + T * k * (
        (2 - w8) * h + (6 - 2 * w8) * fe)
    dense = (2 - (1.5 + 4 / 128)) * T * q + (2 - w8) * T * fd
    on, off = _costs(fp8_activations=True), _costs()
    assert _kept(off) - _kept(on) == pytest.approx(moe)
    assert _kept(off, moe=False) - _kept(on, moe=False) == pytest.approx(dense)
    # the products re-run in the backward: 2 T f_s + 2 T k f_e live again
    assert on._activations(1, 1, "none")[2] - _kept(on) == pytest.approx(
        2 * T * fs + 2 * T * k * fe)
    # under imbalance u the routed part scales by u, the rest does not
    u = 1.5
    on_u = ExpertCosts(SMALL, SEQ, FP8, NET, ep=16, imbalance=u,
                       recipe=MoERecipe(fp8_activations=True))
    off_u = ExpertCosts(SMALL, SEQ, FP8, NET, ep=16, imbalance=u)
    routed = T * k * ((2 - w8) * h + (6 - 2 * w8) * fe)
    assert _kept(off_u) - _kept(on_u) == pytest.approx(moe + (u - 1) * routed)


def test_weighted_swiglu_keeps_no_expert_outputs():
    """The gate weights applied in the SwiGLU: each dispatched copy's output (2 h bytes) not
    kept, T k = 64 copies at tp 1; a dense block keeps what it kept; the time is the same
    (the weights' gradient reads the SwiGLU product the backward has anyway)."""
    T, h, k = SEQ, 64, 2
    on, off = _costs(weighted_swiglu=True), _costs()
    assert _kept(off) - _kept(on) == pytest.approx(T * k * 2 * h)
    assert _kept(off, moe=False) == _kept(on, moe=False)
    assert on.block_of(True, 1) == off.block_of(True, 1)
    # with FP8 caching too the two savings add; the re-run product is the same transient
    both = _costs(weighted_swiglu=True, fp8_activations=True)
    fp8 = _costs(fp8_activations=True)
    assert _kept(fp8) - _kept(both) == pytest.approx(T * k * 2 * h)
    assert (both._activations(1, 1, "none")[2] - _kept(both)) == pytest.approx(
        fp8._activations(1, 1, "none")[2] - _kept(fp8))
    # under imbalance u the dropped outputs scale by u (they are per dispatched copy)
    u = 1.5
    on_u = ExpertCosts(SMALL, SEQ, FP8, NET, ep=16, imbalance=u,
                       recipe=MoERecipe(weighted_swiglu=True))
    off_u = ExpertCosts(SMALL, SEQ, FP8, NET, ep=16, imbalance=u)
    assert _kept(off_u) - _kept(on_u) == pytest.approx(u * T * k * 2 * h)


def test_recipe_memory_under_tp_sp_and_full_recompute():
    """TP 2 with SP and CP 2: every saved byte split by t and cp (norm outputs too, with SP)
    but the FP8 copies of the dispatched tokens (2 - 1 - 4/128 B of each of h values a copy
    saved: FP8 and its tile's fp32 scale), which torchtitan's layout replicates over TP at
    etp = tp: split by cp only, (2 - 1.03125) x h x T k / 4 = 992 B more;
    full recomputation keeps the block input whatever the recipe."""
    kw = dict(tp=2, sp=True, cp=2, ep=8)
    both = MoERecipe(recompute_latent=True, fp8_activations=True)
    on = ExpertCosts(MLA, SEQ, FP8, NET, recipe=both, **kw)
    off = ExpertCosts(MLA, SEQ, FP8, NET, **kw)
    one = ExpertCosts(MLA, SEQ, FP8, NET, ep=8, recipe=both)
    base = ExpertCosts(MLA, SEQ, FP8, NET, ep=8)
    copies = (2 - 1 - 4 / 128) * MLA.hidden * SEQ * MLA.top_k / 4
    assert copies == 992
    assert _kept(off) - _kept(on) == pytest.approx((_kept(base) - _kept(one)) / 4 + copies)
    assert _kept(on, recompute="full") == _kept(off, recompute="full")


def test_the_planner_fits_more_with_the_recipes_memory():
    """The same plan's activation peak falls by the recipe's share, its time unchanged."""
    prof = ProfileSet([moe_profile(MLA, seq=SEQ, batch=1)])
    hw = get_hardware("h100-sxm")
    req = Request(gpus=16, gpu_memory=80 * 2**30, global_batch=32, microbatch_sizes=(1,),
                  schedules=("1f1b",), recompute=("none",), top=1, pp=(2,), ep=(8,),
                  shardings=("zero1",), tp=(1,), cp=(1,))
    plain = search(prof, req, hw, 0.5).plans[0]
    on = search(prof, replace(req, moe_recipe=MoERecipe(fp8_activations=True)), hw,
                0.5).plans[0]
    assert on.step_time == pytest.approx(plain.step_time)
    assert sum(m["activations"] for m in on.memory) < sum(
        m["activations"] for m in plain.memory)


def test_recipe_named_lists_the_valid_ones():
    from pipebubble.plan.expert import recipe_named

    assert recipe_named("none") == MoERecipe()
    assert recipe_named("deepseek-v3", 0.9) == MoERecipe.deepseek_v3(0.9)
    with pytest.raises(ParamError) as exc:
        recipe_named("megatron")
    assert exc.value.params == ("moe_recipe",) and "deepseek-v3, none" in str(exc.value)
