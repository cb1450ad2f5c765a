"""MoE blocks priced as the framework runs them (plan/expert.py, ``MoERecipe.
megatron_dispatch``, ``--tp-overlap on``) and Megatron-Core's SP rule for MoE plans
(plan/settings.py ``megatron_blocker``), each term by hand on test_plan_etp's tiny shape:
T = 32 tokens, h 64, top 2, one shared expert, tp 4, ep 2, SP."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipebubble.cli import main
from pipebubble.plan import frameworks as F
from pipebubble.plan.expert import (
    NO_RECIPE,
    ExpertCosts,
    etp_block_comm,
    replicated_block_comm,
)
from pipebubble.plan.moe import moe_profile
from pipebubble.plan.plans import Request
from pipebubble.plan.tensor import pipelined_pair
from test_plan_etp import BASE, FREE, NET, RATES, SEQ, TINY

MEGATRON = replace(NO_RECIPE, megatron_dispatch=True)
TP_ONE = 3 / 4 * 4096 / 100e9  # an AG or RS of 2 x 32 x 64 B over 4 ranks: 30.72 ns


def _costs(recipe=NO_RECIPE, net=NET, etp=4) -> ExpertCosts:
    return ExpertCosts(TINY, SEQ, RATES, net, tp=4, sp=True, cp=1, ep=2, etp=etp,
                       recipe=recipe)


# ---- 1. etp = tp as Megatron-Core's dispatcher runs it ------------------------------------
def test_megatron_at_etp_tp_sends_the_ranks_own_shard():
    """ep 2 in one node: torchtitan's layout sends the TP group's T k = 64 copies, 8,192 B
    a rank (half over NVLink at 100 GB/s + 1 us, twice in F); Megatron-Core's the rank's
    own T k / tp = 16 copies, 2,048 B, as it does at etp 1."""
    assert _costs().block_of(True, 1)["a2a"] == pytest.approx(2 * (4096 / 100e9 + 1e-6))
    mg = _costs(MEGATRON).block_of(True, 1)["a2a"]
    assert mg == pytest.approx(2 * (1024 / 100e9 + 1e-6))
    assert mg == _costs(MEGATRON, etp=1).block_of(True, 1)["a2a"]


def test_megatron_at_etp_tp_gathers_the_copies_over_tp():
    """Megatron-Core: the attention's and shared experts' SP pairs over TP (30.72 ns each
    collective) and, over the 4 ETP (= TP) ranks, the all-gather of the T k = 64 received
    copies in 16-bit, 3/4 x 8,192 / 100e9 = 61.44 ns, and the reduce-scatter of their
    outputs in fp32 (the routing probabilities' dtype), 122.88 ns, in F and in B; the
    block's F is torchtitan's minus its MLP pair (2 x 30.72 ns) plus these two and minus
    the all-to-all it no longer sends."""
    routed = 3 / 4 * 8192 / 100e9 + 3 / 4 * 16384 / 100e9
    f, b, hid = etp_block_comm(32, 64, 4, 4, FREE, (0, 0), (0, 0), True, 64)
    assert f == pytest.approx(2 * 2 * TP_ONE + routed)
    assert b == pytest.approx(2 * 3 * TP_ONE + routed) and hid == 0
    tt, mg = _costs(net=FREE).block_of(True, 1), _costs(MEGATRON, FREE).block_of(True, 1)
    assert mg["f"] - tt["f"] == pytest.approx(routed + mg["a2a"] - tt["a2a"])
    assert mg["a2a"] == pytest.approx(tt["a2a"] / 4)


def test_megatron_at_etp_tp_keeps_the_gathered_copies():
    """Megatron-Core: the up-projection keeps all T k = 64 gathered copies (2 h B each), its
    1/tp share of the rest: 2 x 64 x 64 x (4 - 1) / 4 = 6,144 B over a 1/tp share of every
    copy's tensors. torchtitan's layout replicates the MoE input over TP, so each TP rank
    also keeps the experts' partial outputs of all 64 copies: 6,144 B more again (index 2;
    index 1 is the dense block, the same in both)."""
    tt, mg, share = _costs().at(1), _costs(MEGATRON).at(1), _costs(etp=1).at(1)
    assert mg.act[1] == tt.act[1] == share.act[1]
    assert mg.act[2] == pytest.approx(share.act[2] + 6144)
    assert tt.act[2] == pytest.approx(share.act[2] + 2 * 6144)


def test_the_framework_sets_the_dispatcher():
    """``--framework megatron`` and ``nemo`` price Megatron-Core's dispatcher (a recipe
    given keeps its own terms); torchtitan, deepspeed and none keep the request's."""
    req = Request(gpus=8, gpu_memory=80e9, global_batch=16)
    for name in ("megatron", "nemo"):
        got, _ = F.apply(F.settings(name), req)
        assert got.moe_recipe.megatron_dispatch is True
    fp8 = replace(NO_RECIPE, fp8_dispatch=True)
    got, _ = F.apply(F.settings("megatron"), replace(req, moe_recipe=fp8))
    assert got.moe_recipe == replace(fp8, megatron_dispatch=True)
    for name in ("torchtitan", "deepspeed", "none"):
        assert F.apply(F.settings(name), req)[0].moe_recipe is None


def test_a_bad_dispatcher_flag_is_one_line():
    with pytest.raises(Exception, match="megatron_dispatch must be true or false"):
        replace(NO_RECIPE, megatron_dispatch="yes")


# ---- 2. --tp-overlap on for MoE blocks ----------------------------------------------------
def test_pipelined_pair_by_hand():
    """One SP pair over 4 ranks behind GEMMs of 1 s: each collective shows one chunk of
    4, 7.68 ns (forward AG + RS, backward gradient AG); the input gradient's RS and the
    re-gather hide behind 1 s weight and data gradients (what a fused B hides: 61.44 ns);
    behind GEMMs of 10 ns, 30.72 - 10 ns shows of each forward one."""
    net = replace(FREE, tp_comm_overlap=True)
    f, b, hid = pipelined_pair(32, 64, 4, net, 1.0, 1.0, (1.0, 1.0), 1.0)
    assert (f, b, hid) == (pytest.approx(TP_ONE / 2), pytest.approx(TP_ONE / 4),
                           pytest.approx(2 * TP_ONE))
    f, _, _ = pipelined_pair(32, 64, 4, net, 1.0, 1.0, (10e-9, 10e-9), 1.0)
    assert f == pytest.approx(2 * (TP_ONE - 10e-9))


def test_megatron_overlap_covers_attention_and_shared_experts_not_the_routed():
    """--tp-comm-overlap under Megatron-Core's dispatcher (tp 4, etp 2, GEMMs of 1 s):
    the attention's and the shared experts' pairs each show TP_ONE / 2 in F and TP_ONE / 4
    in B; the routed pair over the 2 ETP ranks (32 copies: the 16-bit all-gather 1/2 x
    4,096 / 100e9 = 20.48 ns, the fp32 reduce-scatter 40.96 ns) stays whole."""
    net = replace(FREE, tp_comm_overlap=True)
    etp_pair = 1 / 2 * 4096 / 100e9 + 1 / 2 * 8192 / 100e9
    f, b, hid = etp_block_comm(32, 64, 4, 2, net, (1, 1), (1, 1), True, 32, (1, 1, 1, 1),
                               (1, 1))
    assert f == pytest.approx(2 * TP_ONE / 2 + etp_pair)
    assert b == pytest.approx(2 * TP_ONE / 4 + etp_pair)
    assert hid == pytest.approx(2 * 2 * TP_ONE)
    plain = etp_block_comm(32, 64, 4, 2, FREE, (1, 1), (1, 1), True, 32, (1, 1, 1, 1),
                           (1, 1))  # the same GEMMs without the overlap: 2 AG + 2 RS + 2
    assert plain[0] == pytest.approx(2 * 2 * TP_ONE + etp_pair)


def test_torchtitan_layout_overlaps_the_attention_only():
    """torchtitan's layout under --tp-overlap on: the attention's pair pipelined as a dense
    block's (TP_ONE / 2 in F), the MoE's pair (its input's all-gather before router,
    shared and routed experts; the reduce-scatter of their sum) whole, 2 x TP_ONE."""
    net = replace(FREE, tp_comm_overlap=True)
    f, b, _ = replicated_block_comm(32, 64, 4, net, (1, 1), (1, 1), (1, 1), 1)
    assert f == pytest.approx(TP_ONE / 2 + 2 * TP_ONE)
    assert b == pytest.approx(TP_ONE / 4 + TP_ONE)  # the MoE pair's gradient AG shows


@pytest.mark.parametrize("recipe", [NO_RECIPE, MEGATRON])
def test_tp_overlap_on_shortens_an_moe_block(recipe):
    """--tp-overlap on now changes an MoE block's forward (before: not at all), never
    lengthens it; the dense block (index 1) pipelines as a dense model's (before: not)."""
    off, on = _costs(recipe), _costs(recipe, replace(NET, tp_comm_overlap=True))
    assert on.block_of(True, 1)["f"] < off.block_of(True, 1)["f"]
    assert on.block_of(True, 1)["i"] <= off.block_of(True, 1)["i"]
    assert on.at(1).f[1] < off.at(1).f[1]  # tensor.block_tp_comm


# ---- 3. Megatron refuses MoE at tp > 1 without SP -----------------------------------------
@pytest.fixture()
def moe_file(tmp_path):
    path = tmp_path / "moe.json"
    moe_profile(TINY, seq=SEQ, batch=1).save(str(path))
    return str(path)


def test_megatron_refuses_moe_at_tp_without_sp(moe_file, capsys, monkeypatch, tmp_path):
    """MoELayer.forward (Megatron-Core 0.16.1) raises in training with TP > 1 and no
    sequence parallelism: such a plan is shown not runnable in megatron with the reason,
    and never its pick; with SP it runs."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--profile", moe_file, *BASE, "--tp", "2", "--sp", "0",
                 "--framework", "megatron", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all("MoE layers with tp 2 only under sequence parallelism"
                         in p["not_runnable"] for p in plans)
    assert main(["plan", "--profile", moe_file, *BASE, "--tp", "2", "--framework",
                 "megatron", "--json", "--top", "8"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans[0]["sp"] is True and plans[0].get("not_runnable") is None
    assert all(p.get("not_runnable") for p in plans if not p["sp"])


def test_megatron_runs_a_dense_plan_at_tp_without_sp(tmp_path, capsys, monkeypatch):
    from pipebubble.plan.analytic import analytic_profile

    monkeypatch.chdir(tmp_path)
    dense = tmp_path / "dense.json"
    analytic_profile(layers=4, hidden=64, ffn=128, heads=4, vocab=128, seq=SEQ,
                     batch=1).save(str(dense))
    assert main(["plan", "--profile", str(dense), *BASE, "--tp", "2", "--sp", "0",
                 "--framework", "megatron", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans[0].get("not_runnable") is None
