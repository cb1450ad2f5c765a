"""Expert tensor parallelism (``ParallelDims.etp``, ``plan --etp``): the degree, its checks,
and every term it prices checked by hand on a tiny MoE shape (plan/expert.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.axes import Axes, Point
from pipebubble.plan.compute import Rates
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.expert import ExpertCosts, etp_block_comm, megatron_moe_flags
from pipebubble.plan.moe import MoEShape, moe_profile
from pipebubble.plan.network import Network

NET = Network(gpus_per_node=8, intra=(100e9, 1e-6), inter=(10e9, 5e-6))
FREE = Network(gpus_per_node=8, intra=(100e9, 0.0), inter=(10e9, 0.0))
# 4 layers (the first dense), 8 experts of inner size 64, top 2, one shared expert
TINY = MoEShape(layers=4, hidden=64, heads=4, vocab=128, experts=8, top_k=2, expert_ffn=64,
                shared_experts=1, shared_ffn=64, dense_layers=(0,), dense_ffn=128)
SEQ = 32  # T = 32 tokens a microbatch (b 1, cp 1)
RATES = Rates(1e15, 3e12)


def _costs(etp: int, tp: int = 4, ep: int = 2, net: Network = NET) -> ExpertCosts:
    return ExpertCosts(TINY, SEQ, RATES, net, tp=tp, sp=True, cp=1, ep=ep, etp=etp)


# ---- the degree --------------------------------------------------------------------------
def test_the_expert_mesh_is_etp_x_ep_x_edp_per_stage():
    d = ParallelDims(tp=4, sp=True, dp_shard=4, ep=8, etp=1)  # EP borrows the 4 TP ranks
    assert d.expert_data_parallel == 4 * 4 // (1 * 8) == 2
    assert (d.group("etp"), d.group("ep"), d.group("edp")) == ((1, 1), (1, 8), (8, 2))
    e = ParallelDims(tp=4, dp_shard=4, ep=2)  # etp defaults to tp: the layout before etp
    assert e.etp == 4 and e.group("ep") == (4, 2) and e.group("edp") == (8, 2)
    assert e.expert_data_parallel == e.data_context // e.ep == 2


def test_etp_above_tp_spans_tp_groups_of_the_stage():
    """Megatron-Core's expert mesh is carved apart from the dense one (etp x ep x edp = tp
    x cp x dp): etp 4 over tp 2 spans two TP groups; etp 3 over tp 2 straddles them."""
    d = ParallelDims(tp=2, sp=True, dp_shard=4, ep=2, etp=4)
    assert d.expert_data_parallel == 2 * 4 // (4 * 2) == 1
    assert (d.group("etp"), d.group("ep"), d.group("edp")) == ((1, 4), (4, 2), (8, 1))
    assert d.ep_room(4) == 2 and d.etp_groups == 0.5
    odd = ParallelDims(tp=2, sp=True, dp_shard=3, etp=3)
    assert odd.ep_room(3) == 2 and odd.expert_data_parallel == 2
    assert not odd.ep_fits(2, data=2)  # 3 does not divide tp x dp = 4
    assert ParallelDims(tp=1, dp_shard=4, etp=2).expert_data_parallel == 2  # ETP without TP


@pytest.mark.parametrize("kw, words", [
    (dict(tp=4, sp=True, dp_shard=2, etp=16), "etp 16 must divide tp x dp x cp = 8"),
    (dict(tp=4, sp=True, dp_replicate=2, etp=16, ep_from="dp_shard"),
     "etp 16 must divide tp x dp_shard x cp = 4"),
    (dict(tp=4, etp=2), "etp 2 with tp 4 needs sp"),
    (dict(tp=2, etp=4, dp_shard=2), "etp 4 with tp 2 needs sp"),
    (dict(tp=2, sp=True, dp_shard=2, ep=8, etp=1), "ep 8 must divide tp / etp x dp x cp = 4"),
    (dict(tp=2, sp=True, dp_shard=4, ep=4, etp=4), "ep 4 must divide tp x dp x cp / etp = 2"),
    (dict(tp=2, sp=True, dp_replicate=2, dp_shard=2, ep=8, etp=1, ep_from="dp_shard"),
     "ep 8 must divide tp / etp x dp_shard x cp = 4"),
    (dict(tp=2, etp=0), "etp must be an integer >= 1, got 0"),
])
def test_bad_etp_is_one_line_naming_it(kw, words):
    with pytest.raises(UserError) as exc:
        ParallelDims(**kw)
    assert words in str(exc.value) and "\n" not in str(exc.value)


# ---- every ETP term by hand (tp 4, sp, ep 2; T = 32, h = 64, E = 8, k = 2, f_e = 64) ------
def test_expert_params_are_split_over_ep_x_etp():
    whole = TINY.experts * TINY.expert_params()  # 8 experts x 3 x 64 x 64 = 98,304
    assert whole == 98_304
    for etp in (1, 2, 4, 8):
        assert _costs(etp).experts[2] == whole / (2 * etp)  # block 1 (an MoE block)
    assert _costs(1).experts[2] == 4 * 3 * 64 * 64  # etp 1: E / ep = 4 whole experts


def test_expert_gemm_flops_are_each_ranks_share_whatever_etp():
    """Each rank computes its ETP group's T k etp / tp copies on f_e / etp columns:
    6 T k h f_e / tp = 6 x 32 x 2 x 64 x 64 / 4 = 393,216 forward FLOPs at every etp (etp 8:
    128 copies, 32 rows a local expert, (32, 16, 64) and (32, 64, 8) GEMMs, 4 experts)."""
    for etp in (1, 2, 4, 8):
        assert _costs(etp).block_of(True, 1)["expert_flops"] == 393_216


def test_all_to_all_sends_each_ranks_own_copies_except_at_etp_tp():
    """Two all-to-alls in F; ep 2. Megatron-Core's dispatcher (every etp but tp): each rank
    sends its own T k / tp = 16 copies, 2,048 B; in one node half of it over NVLink (100
    GB/s) + 1 us. etp 4 = tp (torchtitan's layout, the planner's before etp): the TP
    group's 64 copies, 8,192 B. etp 8: the EP pair is 8 ranks apart, two nodes: half of the
    2,048 B over the 10 GB/s NIC + 5 us."""
    for etp in (1, 2):
        assert _costs(etp).block_of(True, 1)["a2a"] == pytest.approx(2 * (1024 / 100e9 + 1e-6))
    assert _costs(4).block_of(True, 1)["a2a"] == pytest.approx(2 * (4096 / 100e9 + 1e-6))
    assert _costs(8).block_of(True, 1)["a2a"] == pytest.approx(2 * (1024 / 10e9 + 5e-6))


TP_ONE = 3 / 4 * 4096 / 100e9  # an AG or RS of 2 x 32 x 64 B over 4 ranks: 30.72 ns


def test_etp_collectives_gather_the_dispatched_copies_in_the_etp_group():
    """tp 4, etp 2, no latency: the attention's and the shared experts' all-gather and
    reduce-scatter of 2 x 32 x 64 B over 4 ranks, 30.72 ns each; the routed experts' of
    the ETP group's 32 copies (T k etp / tp) over 2 ranks: the tokens' all-gather 2 x 32 x
    64 B, 1/2 x 4,096 / 100e9 = 20.48 ns, the outputs' reduce-scatter in fp32 (the
    routing probabilities' dtype, Megatron-Core's combine_preprocess), 4 x 32 x 64 B,
    40.96 ns, once each way in F and in B (no re-gather: the grouped GEMM keeps the
    gathered copies)."""
    etp_pair = 1 / 2 * 4096 / 100e9 + 1 / 2 * 8192 / 100e9
    assert etp_pair == pytest.approx(61.44e-9)
    f, b, hidden = etp_block_comm(32, 64, 4, 2, FREE, (0, 0), (0, 0), True, 32)
    assert f == pytest.approx(2 * (2 * TP_ONE) + etp_pair)
    assert b == pytest.approx(2 * (3 * TP_ONE) + etp_pair)  # TP: AG, RS, AG each
    assert hidden == 0
    f, b, hidden = etp_block_comm(32, 64, 4, 2, FREE, (1, 1), (1, 1), False, 32)
    assert f == pytest.approx(2 * TP_ONE + etp_pair)  # no shared experts: one TP pair
    assert b == pytest.approx(TP_ONE + etp_pair)  # TP: the gradient all-gather shows
    assert hidden == pytest.approx(2 * TP_ONE)  # the TP pair's RS and re-gather, not ETP's


@pytest.mark.parametrize("overlap, pipelined", [(False, False), (True, False), (True, True)])
def test_etp_collectives_are_exposed_under_every_tp_overlap(overlap, pipelined):
    """Megatron-Core runs the ETP all-gather / reduce-scatter in the dispatcher, off
    TransformerEngine's userbuffers (off for experts) and after the grouped GEMMs'
    backward: at tp 1, etp 4 (no TP pair), 64 copies x 64: the all-gather of 2 B values,
    8,192 B, 3/4 x 8,192 / 100e9 = 61.44 ns, the reduce-scatter of fp32 ones, 16,384 B,
    122.88 ns, both in F and in B, nothing hidden, whatever --tp-overlap."""
    net = replace(FREE, tp_overlap=overlap, tp_comm_overlap=pipelined)
    pair = 3 / 4 * 8192 / 100e9 + 3 / 4 * 16384 / 100e9
    f, b, hidden = etp_block_comm(32, 64, 1, 4, net, (1, 1), (1, 1), True, 64)
    assert (f, b, hidden) == (pytest.approx(pair), pytest.approx(pair), 0)
    blk = ExpertCosts(TINY, SEQ, RATES, net, tp=1, cp=1, ep=1, etp=4).block_of(True, 1)
    assert blk["hidden"] == 0


def test_expert_states_are_sharded_over_expert_data_parallel():
    """zero1, dp 4, tp 4, ep 2: the expert-data-parallel group is 16 / (etp x 2) ranks,
    2 + 2 + 12 / edp bytes a local expert parameter; its reduction ranks etp x ep apart."""
    for etp, edp in ((1, 8), (4, 2)):
        ax = Axes(Point(ParallelDims(tp=4, sp=True), "zero1", ep=2, etp=etp), NET)
        assert ax.dims(4).expert_data_parallel == edp
        assert ax.expert_bytes_per_param(4) == pytest.approx(2 + 2 + 12 / edp)
        sync = ax.expert_sync(4)
        assert ax.dims(4).group("edp") == (2 * etp, edp) and sync is not None


def test_activations_keep_the_gathered_copies_at_etp_other_than_tp():
    """Each rank keeps its share of the dispatched copies' (4 h + 6 f_e) bytes over tp,
    and under Megatron-Core's dispatcher the up-projection's input for all etp copies of
    its ETP group: 2 h (etp - 1) T k / tp more, 2 x 64 x 1 x 64 / 4 = 2,048 B at etp 2,
    14,336 B at etp 8, in the MoE blocks only (index 1 is the dense block). At etp = tp
    (torchtitan's layout, the MoE input replicated over TP) each rank keeps the inputs and
    the experts' outputs of all T k copies: 2 x 2 h (tp - 1) T k / tp = 12,288 B more."""
    base = _costs(1).at(1)
    tt = _costs(4).at(1).act
    assert tt[1] == base.act[1] and tt[2] == base.act[2] + 12_288
    for etp, more in ((2, 2048), (8, 14_336)):
        lc = _costs(etp).at(1)
        assert lc.act[1] == base.act[1] and lc.act[2] == base.act[2] + more
        assert lc.act_w[2] == base.act_w[2] + more


def test_etp_equal_to_tp_is_the_default_layout():
    """etp = tp (Megatron-Core's default) prices exactly what the planner priced before
    etp had a degree: the same numbers as leaving etp out."""
    for tp in (1, 2, 4):
        given, left = _costs(tp, tp=tp).at(1), ExpertCosts(TINY, SEQ, RATES, NET, tp=tp,
                                                           sp=tp > 1, cp=1, ep=2).at(1)
        for col in ("f", "i", "w", "act", "a2a_f", "a2a_b", "params", "expert"):
            assert list(getattr(given, col)) == list(getattr(left, col))


def test_megatron_paste_names_the_expert_tensor_parallel_size():
    flags = " ".join(megatron_moe_flags(TINY, 2, 1))
    assert "--expert-model-parallel-size 2" in flags
    assert "--expert-tensor-parallel-size 1" in flags
    assert "--disable-bias-linear" not in flags  # Megatron-Core: bias in MoE at ETP 1 only
    assert "--disable-bias-linear" in " ".join(megatron_moe_flags(TINY, 2, 4))


# ---- the CLI -----------------------------------------------------------------------------
BASE = ["--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--microbatch-size", "1",
        "--schedules", "1f1b", "--recompute", "none"]


@pytest.fixture()
def moe_file(tmp_path):
    path = tmp_path / "moe.json"
    moe_profile(TINY, seq=SEQ, batch=1).save(str(path))
    return str(path)


def _bad(args, capsys) -> str:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    return err


def test_bad_etp_on_the_cli_exits_2_with_one_line(moe_file, tmp_path, capsys):
    err = _bad(["--profile", moe_file, *BASE, "--etp", "3"], capsys)
    assert "--etp 3" in err and "expert inner size 64" in err
    err = _bad(["--profile", moe_file, *BASE, "--etp", "32"], capsys)  # 8 GPUs a stage
    assert "--etp 32" in err and "must divide a stage's tp x cp x dp" in err
    err = _bad(["--profile", moe_file, *BASE, "--config", "tp=2,etp=1", "--sp", "0"], capsys)
    assert "etp=1" in err and "--sp 1" in err
    err = _bad(["--profile", moe_file, *BASE, "--config", "tp=2,etp=4", "--sp", "0"], capsys)
    assert "etp=4 other than tp needs --sp 1" in err  # above tp: Megatron needs SP too
    err = _bad(["--profile", moe_file, *BASE, "--config", "tp=2,sp=1,pp=1,etp=4,ep=4,"
                "sharding=fsdp"], capsys)  # 2 x 4 ranks: etp 4 leaves EP 2 of them
    assert "ep=4 must divide" in err and "tp x dp x cp / etp in 2" in err
    dense = tmp_path / "dense.json"
    analytic_profile(layers=4, hidden=64, ffn=128, heads=4, vocab=128, seq=SEQ,
                     batch=1).save(str(dense))
    err = _bad(["--profile", str(dense), *BASE, "--etp", "2"], capsys)
    assert "--etp 2" in err and "MoE profile" in err


def test_the_plan_searches_and_prints_etp(moe_file, capsys, monkeypatch, tmp_path):
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--profile", moe_file, *BASE, "--config", "tp=2,sp=1,pp=1,etp=1,ep=8,"
                 "sharding=fsdp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["etp"] == 1 and data["config"]["ep"] == 8
    paste = data["pastes"]
    flags = paste["megatron"]["flags"] or paste["megatron"]["instead"]["flags"]
    assert "--expert-tensor-parallel-size" in flags
    assert paste["torchtitan"]["parallelism"]["expert_tensor_parallel_degree"] == 1
    assert "expert_tensor_parallel_degree" not in paste["torchtitan"]["cli"]  # 0.3: none
    assert math.isfinite(data["config"]["predicted_step_time"])


def test_torchtitan_refuses_an_etp_between_1_and_tp(moe_file, capsys, monkeypatch, tmp_path):
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--profile", moe_file, *BASE, "--config", "tp=4,sp=1,pp=1,etp=2,"
                 "ep=2,sharding=fsdp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tt = data["pastes"]["torchtitan"]
    assert tt["runnable"] is False and "1 or tp 4 only, not etp 2" in tt["reason"]
    mg = data["pastes"]["megatron"]  # Megatron-Core runs any etp dividing the mesh
    assert "--expert-tensor-parallel-size 2" in (mg["flags"] or mg["instead"]["flags"])


def test_the_plan_runs_etp_above_tp(moe_file, capsys, monkeypatch, tmp_path):
    """tp 2, dp 4 (fsdp): etp 4 spans two TP groups, ep 2 the rest; Megatron-Core's paste
    carries it (with --disable-bias-linear), torchtitan refuses it in one sentence."""
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--profile", moe_file, *BASE, "--config", "tp=2,sp=1,pp=1,etp=4,"
                 "ep=2,sharding=fsdp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["etp"] == 4 and data["config"]["ep"] == 2
    mg = data["pastes"]["megatron"]
    flags = mg["flags"] or mg["instead"]["flags"]
    assert "--expert-tensor-parallel-size 4" in flags and "--disable-bias-linear" in flags
    tt = data["pastes"]["torchtitan"]
    assert tt["runnable"] is False and "1 or tp 2 only, not etp 4" in tt["reason"]


def test_dualpipe_pair_hides_the_etp_pair_with_the_all_to_all():
    """tp 1, etp 4, ep 2, no latency: the block's hideable communication (``a2a_f``) is
    its all-to-all plus the ETP pair over the 4 ranks' T k = 64 copies each, 256 x 64
    values: the 16-bit all-gather 3/4 x 32,768 / 100e9 = 245.76 ns, the fp32 reduce-scatter
    491.52 ns, 737.28 ns, and the same in the backward. An F&B pair of two such blocks,
    compute far above communication, hides all of both halves' (before: the all-to-all
    only); a lone F shows it whole."""
    from pipebubble.costs import CostModel

    slow = Rates(1e12, 3e10)  # a slow chip: compute well above the communication
    lc = ExpertCosts(TINY, SEQ, slow, FREE, tp=1, cp=1, ep=2, etp=4).at(1)
    blk = ExpertCosts(TINY, SEQ, slow, FREE, tp=1, cp=1, ep=2, etp=4).block_of(True, 1)
    pair = 3 / 4 * 32768 / 100e9 + 3 / 4 * 65536 / 100e9
    assert blk["etp"] == pytest.approx(pair) == pytest.approx(737.28e-9)
    assert lc.a2a_f[2] == pytest.approx(blk["a2a"] + pair)  # layer 1: the first MoE block
    assert lc.a2a_b[2] == pytest.approx(blk["a2a"] + pair)
    assert lc.a2a_f[1] == 0  # the dense block: nothing to hide
    assert ExpertCosts(TINY, SEQ, RATES, FREE, tp=1, cp=1, ep=2, etp=1).block_of(
        True, 1)["etp"] == 0  # experts whole: no ETP pair
    f, b = float(lc.f[2]), float(lc.i[2] + lc.w[2])
    sc = CostModel(f=f, b=b, w=0, a2a_f=float(lc.a2a_f[2]), a2a_b=float(lc.a2a_b[2])).resolve(1)
    time, hidden = sc.pair_duration(0, 0)
    comm = 2 * (blk["a2a"] + pair)
    assert f + b - comm > comm  # compute-bound: every byte of it hides
    assert hidden == pytest.approx(comm) and time == pytest.approx(f + b - comm)
    lone = sc.lone_part(0, "F")
    assert lone.exposed == pytest.approx(blk["a2a"] + pair) and lone.hidden == 0
