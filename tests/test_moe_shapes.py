"""MoE shapes from HF configs (plan/moe.py): parameters against the published totals, per-layer
FLOPs and bytes against their closed forms, and the one-line errors for bad expert keys."""

from __future__ import annotations

import json
import math

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan.hfconfig import shape_from_hf
from pipebubble.plan.moe import LatentAttention, MoEShape, layer_cost, layer_groups, moe_profile

# The released config.json of each model (the keys plan/moe.py reads, and a few it ignores).
MIXTRAL_8X7B = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
    "tie_word_embeddings": False, "router_aux_loss_coef": 0.02, "sliding_window": None}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc"}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48, "vocab_size": 151936,
    "tie_word_embeddings": False}
QWEN15_MOE_A27B = {
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
    "vocab_size": 151936, "tie_word_embeddings": False}


def _floor(x: float, digits: int) -> float:
    return math.floor(x * 10**digits) / 10**digits


# (config, published total, published active, how the active figure is written: "round"ed,
# or "cut" to its digits). Sources: Mistral AI, "Mixtral of experts" (blog, 2023); DeepSeek-V3
# technical report (arXiv 2412.19437, abstract); the Qwen3-30B-A3B model card; Qwen,
# "Qwen1.5-MoE: matching 7B model performance with 1/3 activated parameters" (blog, 2024).
PUBLISHED = [
    pytest.param(MIXTRAL_8X7B, 46.7e9, 12.9e9, "round", id="mixtral-8x7b"),
    pytest.param(DEEPSEEK_V3, 671e9, 37e9, "cut", id="deepseek-v3"),
    pytest.param(QWEN3_30B_A3B, 30.5e9, 3.3e9, "cut", id="qwen3-30b-a3b"),
    pytest.param(QWEN15_MOE_A27B, 14.3e9, 2.7e9, "round", id="qwen1.5-moe-a2.7b"),
]


@pytest.mark.parametrize(("config", "total", "active", "written"), PUBLISHED)
def test_totals_match_the_published_figures(config, total, active, written):
    shape, _ = shape_from_hf(config)
    assert abs(shape.total_params() / total - 1) < 0.01
    ours = shape.active_params()
    if written == "round":
        assert abs(ours / active - 1) < 0.01
    else:  # DeepSeek 37.55B -> "37B", Qwen3 3.35B -> "3.3B": 1.5 % and 1.6 % apart
        digits = 0 if active % 1e9 == 0 else 1
        assert _floor(ours / 1e9, digits) == active / 1e9
        assert 0 < ours / active - 1 < 0.02


def test_the_exact_counts_by_hand():
    mixtral, _ = shape_from_hf(MIXTRAL_8X7B)
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024
    layer = attn + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096
    assert mixtral.total_params() == 32 * layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert mixtral.active_params() == 12_879_925_248
    ds, _ = shape_from_hf(DEEPSEEK_V3)
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
           + 128 * 128 * 7168)
    assert ds.attention_matmul_params() + ds.attention_other_params() == mla == 187_107_328
    assert ds.total_params() == 671_026_419_200
    assert ds.active_params() == 37_552_297_472
    qwen, _ = shape_from_hf(QWEN3_30B_A3B)
    assert qwen.total_params() == 30_532_122_624
    # the model card's "non-embedding 29.9B": everything but the embedding and the head
    nonembed = qwen.total_params() - qwen.embedding_params() - qwen.vocab * qwen.hidden
    assert round(nonembed / 1e9, 1) == 29.9


def test_deepseek_dense_layers_shared_expert_and_mtp():
    shape, used = shape_from_hf(DEEPSEEK_V3)
    assert shape.dense_layers == (0, 1, 2) and shape.moe_layers == 58
    assert shape.shared_experts == 1 and shape.shared_ffn == 2048 and shape.router_bias
    assert shape.mla == LatentAttention(1536, 512, 128, 64, 128)
    assert shape.extra == {"mtp_layers_excluded": 1}
    for key in ("first_k_dense_replace", "n_shared_experts", "n_routed_experts",
                "num_experts_per_tok", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        assert key in used
    prof = moe_profile(shape, seq=4096, batch=1)
    assert [g[:2] for g in layer_groups(prof)] == [(0, 2), (3, 60)]
    assert [layer.type for layer in prof.layers[1:5]] == ["TransformerBlock"] * 3 + ["MoEBlock"]


def test_qwen_sparse_step_and_mlp_only_layers():
    cfg = dict(QWEN3_30B_A3B, num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[1])
    shape, used = shape_from_hf(cfg)
    # MoE where (i + 1) % 2 == 0 and i not in [1]: layers 3 and 5
    assert [n for n in range(6) if shape.is_moe(n)] == [3, 5]
    assert used["mlp_only_layers"] == [1] and used["decoder_sparse_step"] == 2
    assert shape.layer_params(0) - shape.layer_params(3) == (
        3 * 2048 * 6144 - (128 * 3 * 2048 * 768 + 2048 * 128))


def test_per_layer_costs_are_the_closed_forms():
    """Router 2thE, experts 2tk(3hf_e), shared 2t n_s (3hf_s), four all-to-alls of t k h."""
    shape = MoEShape(layers=2, hidden=16, heads=4, vocab=50, experts=6, top_k=2,
                     expert_ffn=24, shared_experts=1, shared_ffn=40, kv_heads=2)
    s, b = 8, 3
    t, h, d = s * b, 16, 4
    c = layer_cost(shape, 0, s, b)
    assert c.router_flops == 2 * t * h * 6
    assert c.expert_flops == 2 * t * 2 * 3 * h * 24
    assert c.shared_flops == 2 * t * 3 * h * 40
    attn_mm = 2 * h * (4 * d) + 2 * h * (2 * d)
    assert c.attention_flops == 2 * t * attn_mm + 2 * b * s * s * 4 * (d + d)
    assert c.dispatched_tokens == t * 2 and c.all_to_all_bytes == 2 * t * 2 * h
    # kept for the backward: attention (norm inputs, input, Q, K, V, output) + the MLP input,
    # fp32 router probabilities, dispatched copies, their SwiGLU inner tensors, the expert
    # outputs, the shared expert's inner tensors
    attn_act = 6 * t * h + 2 * t * 16 + 4 * t * 8 + 2 * t * 16
    moe_act = 2 * t * h + 4 * t * 6 + 2 * 2 * t * h + 6 * 2 * t * 24 + 2 * 2 * t * h \
        + 6 * t * 40
    assert c.activation_bytes == attn_act + moe_act
    assert layer_cost(shape, 0, s, b, bytes_=4).all_to_all_bytes == 2 * c.all_to_all_bytes
    assert shape.layer_params(0) - shape.layer_params(0, active=True) == 4 * 3 * h * 24


def test_the_profile_adds_up():
    shape, _ = shape_from_hf(MIXTRAL_8X7B)
    prof = moe_profile(shape, seq=1024, batch=2, tflops=1000, mfu=0.5)
    assert sum(layer.params for layer in prof.layers) == shape.total_params()
    blocks = prof.layers[1:-1]
    assert sum(layer.extra["active_params"] for layer in blocks) + 32000 * 4096 * 2 + 4096 \
        == shape.active_params()
    one = blocks[0].as_dict()
    fwd = one["attention_flops"] + one["router_flops"] + one["expert_flops"]
    assert one["forward_flops"] == fwd and one["shared_expert_flops"] == 0
    # F + I + W = 3 x the matrix multiplies + 3 x the scores (backward twice the forward)
    assert one["flops"] == pytest.approx(3 * fwd)
    assert one["forward"] == pytest.approx(fwd / (1000e12 * 0.5))
    assert prof.metadata["active_params"] == shape.active_params()
    assert "model" not in prof.metadata  # the planner must not read it as a dense shape


@pytest.mark.parametrize(("change", "key", "valid"), [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok", "1..8"),
    ({"num_local_experts": 0}, "num_local_experts", "1..65,536"),
    ({"num_local_experts": None}, "num_local_experts", "missing"),
])
def test_bad_expert_keys_are_one_line(tmp_path, capsys, change, key, valid):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MIXTRAL_8X7B, **change}))
    assert main(["profile", "--analytic", "--hf-config", str(path), "--seq", "128"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert key in err and valid in err


def test_a_missing_moe_intermediate_size_is_named():
    bad = {k: v for k, v in QWEN3_30B_A3B.items() if k != "moe_intermediate_size"}
    with pytest.raises(UserError, match="missing key 'moe_intermediate_size'"):
        shape_from_hf(bad)
    with pytest.raises(UserError, match="'num_experts_per_tok' 300 must be at most "
                                        "'n_routed_experts' 256"):
        shape_from_hf(dict(DEEPSEEK_V3, num_experts_per_tok=300))


def test_profile_cli_names_the_keys_and_prints_the_moe_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "140")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3))
    out = tmp_path / "ds.json"
    assert main(["profile", "--analytic", "--hf-config", str(path), "--seq", "4096",
                 "--tflops", "989", "--mfu", "0.4", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "n_routed_experts=256" in captured.err and "kv_lora_rank=512" in captured.err
    assert "37.6 B active" in captured.out and "3-60" in captured.out
    saved = json.loads(out.read_text())
    assert saved["layers"][4]["dispatched_tokens"] == 4096 * 8
    assert saved["hf_config"]["keys"]["first_k_dense_replace"] == 3


def test_plan_prices_a_hardware_free_moe_profile(tmp_path, capsys, monkeypatch):
    """``plan --gpu`` prices an MoE profile's layers per op (plan/expert.py), EP searched."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(QWEN15_MOE_A27B, num_hidden_layers=4)))
    out = tmp_path / "q.json"
    assert main(["profile", "--analytic", "--hf-config", str(path), "--seq", "512",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", "--profile", str(out), "--gpus", "8", "--gpu", "h100-sxm",
                 "--global-batch", "16", "--schedules", "1f1b", "--microbatch-size", "1",
                 "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["mfu"] > 0 and "ep" in p for p in plans)


def test_the_readme_moe_command_runs(tmp_path, capsys, monkeypatch):
    """README's ``profile --analytic --hf-config DeepSeek-V3/config.json`` (a text block:
    the config is not shipped), run on DeepSeek-V3's released config."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = text.index("pipebubble profile --analytic --hf-config DeepSeek-V3/config.json")
    line = text[start:text.index("\n```", start)].replace("\\\n", " ")
    argv = shlex.split(line)[1:]
    (tmp_path / "DeepSeek-V3").mkdir()
    (tmp_path / "DeepSeek-V3" / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert json.loads((tmp_path / "dsv3.json").read_text())["active_params"] == 37_552_297_472


def test_latent_attention_costs_by_hand():
    """MLA: Q from a rank-6 latent, K and V from a rank-4 latent plus a shared rotary key."""
    mla = LatentAttention(q_rank=6, kv_rank=4, nope_dim=3, rope_dim=2, v_dim=5)
    shape = MoEShape(layers=1, hidden=16, heads=2, vocab=10, experts=4, top_k=2,
                     expert_ffn=8, mla=mla)
    t, h, a = 4, 16, 2
    qk, v = a * (3 + 2), a * 5
    params = (h * 6 + 6 * qk) + (h * (4 + 2) + 4 * a * (3 + 5)) + v * h
    assert shape.attention_matmul_params() == params
    assert shape.attention_other_params() == 6 + 4  # the two latent norms
    c = layer_cost(shape, 0, s=4, b=1)
    assert c.scores == 2 * 1 * 4 * 4 * a * ((3 + 2) + 5)  # Q K^T over 5 dims, x V over 5
    assert c.attention_flops == 2 * t * params + c.scores
    # kept: norm inputs and the attention input (6th), c_q and its normed copy, c_kv + k_rope
    # and the normed c_kv, Q and K (qk each), V, the output projection's input
    attn = 6 * t * h + 2 * t * (6 + 6) + 2 * t * (4 + 2 + 4) + 2 * t * (2 * qk + v) + 2 * t * v
    moe_part = 2 * t * h + 4 * t * 4 + 2 * 8 * h + 6 * 8 * 8 + 2 * 8 * h
    assert c.activation_bytes == attn + moe_part
    # W needs the inputs of every matrix multiply: the attention input, both normed latents,
    # the output projection's input; the MLP input (router), dispatched copies, down inputs
    assert c.weight_activation_bytes == (2 * t * h + 2 * t * (6 + 4) + 2 * t * v
                                         + 2 * t * h + 2 * 8 * h + 2 * 8 * 8)


def test_plan_holds_every_expert_and_runs_on_the_active_flops(tmp_path, capsys):
    """A 4-layer Qwen3-MoE profile with times: ``plan`` keeps the weights of all the experts
    (2 bytes a parameter of the total, not of the active), its compute follows the profile."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(QWEN3_30B_A3B, num_hidden_layers=4)))
    out = tmp_path / "q.json"
    assert main(["profile", "--analytic", "--hf-config", str(cfg), "--seq", "1024",
                 "--tflops", "989", "--mfu", "0.4", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", "--profile", str(out), "--gpus", "4", "--global-batch", "8",
                 "--pp", "1", "--sharding", "ddp", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    shape, _ = shape_from_hf(dict(QWEN3_30B_A3B, num_hidden_layers=4))
    assert plan["memory"][0]["weights"] == 2 * shape.total_params()
    assert shape.total_params() > 3 * shape.active_params()  # the difference is real
