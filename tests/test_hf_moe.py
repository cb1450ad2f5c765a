"""HuggingFace mixtures of experts through the pipeline (models/hf.py): mixtral, qwen2_moe,
qwen3_moe and deepseek_v3, built by transformers' own classes at toy size (random weights,
float64), give the HF model's logits, and every schedule family's gradients equal the unsplit
HF model's; training and a checkpoint resume as one run; the router's load-balancing loss is
refused in one line (expert parallelism: tests/test_run_ep_hf.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

tf = pytest.importorskip("transformers")

from pipebubble.cli import main  # noqa: E402
from pipebubble.errors import UserError  # noqa: E402
from pipebubble.models.hf import MOE_TYPES, check_build, check_moe, hf_spec, lm_loss  # noqa: E402
from pipebubble.runtime.local import run_local  # noqa: E402
from pipebubble.runtime.stages import split_stages  # noqa: E402
from pipebubble.schedules import get_schedule, schedule_names  # noqa: E402
from runtime_helpers import first_schedule  # noqa: E402

BASE = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, intermediate_size=24)
# 4 experts, top-2; every type's particulars: Mixtral's sliding window (shorter than the
# sequence), Qwen2-MoE's shared expert with its sigmoid gate and a dense first layer,
# Qwen3-MoE's Q/K norms and normalised top-k, DeepSeek-V3's dense first layer, latent
# attention (MLA), shared expert, grouped routing with its bias
CONFIGS = {
    "mixtral": dict(BASE, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
    "qwen2_moe": dict(BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=24, mlp_only_layers=[0]),
    "qwen3_moe": dict(BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      head_dim=8, norm_topk_prob=True),
    "deepseek_v3": dict(BASE, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1,
                        n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8),
}
SEQ = 8
# transformers imports each model's module on first use (seconds): once, here
MODEL_CLASSES = [tf.AutoModelForCausalLM._model_mapping[type(tf.AutoConfig.for_model(kind))]
                 for kind in CONFIGS]


def tiny(kind: str, seed: int = 0, **extra) -> nn.Module:
    """A toy HF MoE causal LM of ``kind``, random weights, float64."""
    torch.manual_seed(seed)
    config = tf.AutoConfig.for_model(kind, **{**CONFIGS[kind], **extra})
    model = tf.AutoModelForCausalLM.from_config(config).double()
    if kind == "deepseek_v3":  # a routing bias that matters (the load balancer's, no grad)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.01, 0.0, -0.01, 0.005]))
    return model


def _problem(kind: str, batch: int = 8, seed: int = 1):
    """(the spec's layers, the unsplit HF model with the same weights, a batch)."""
    model = tiny(kind)
    spec = hf_spec(model, seq=SEQ)  # float64 paths set on the model it wraps
    ref = copy.deepcopy(model)
    x, y = spec.make_batch(batch, torch.Generator().manual_seed(seed))
    return spec, ref, x, y


def _hf_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return lm_loss(model(input_ids=x).logits, y)


@pytest.mark.parametrize("kind", MOE_TYPES)
def test_flat_layers_give_the_hf_logits_and_the_routing_is_not_trivial(kind):
    spec, ref, x, _ = _problem(kind, batch=3)
    h = x
    for layer in spec.layers:
        h = layer(h)
    torch.testing.assert_close(h, ref(input_ids=x).logits, rtol=0, atol=1e-13)
    gates = [m for m in ref.modules() if type(m).__name__.endswith(("TopKRouter", "TopkRouter"))]
    assert gates, "no router found"
    chosen = gates[0](torch.randn(24, 32, dtype=torch.float64))[2]
    assert len(set(chosen.flatten().tolist())) >= 3  # tokens go to several experts


SCHEDULES = [("1f1b", 2, 4), ("zb-h1", 2, 4), ("dualpipe", 2, 4)]


@pytest.mark.parametrize("name,ranks,m", SCHEDULES)
@pytest.mark.parametrize("kind", MOE_TYPES)
def test_pipeline_gradients_equal_the_unsplit_hf_model(kind, name, ranks, m):
    """1F1B, ZB-H1 (backward split into I and W) and DualPipe (two chunks per rank, both
    directions) on 2 ranks, cut inside the model: the HF model's own loss and gradients."""
    sched = get_schedule(name, ranks, m)
    stages = sched.num_stages // sched.chains
    spec, ref, x, y = _problem(kind)
    cuts = [2] if stages == 2 else [2, 3, 4][: stages - 1]
    mods = split_stages(spec.layers, stages, cuts)
    result = run_local(sched, mods, x, y, spec.loss_fn)
    ref_loss = _hf_loss(ref, x, y)
    ref_loss.backward()
    assert result.loss == pytest.approx(ref_loss.item(), rel=1e-13)
    _assert_hf_grads(mods, ref)
    if name != "1f1b":
        assert {"I", "W"} <= {e.kind for e in result.timeline.events()}


@pytest.mark.slow
@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_every_registered_schedule_matches_the_unsplit_deepseek_v3(name):
    """Every registered schedule (chunked, split backward, both DualPipes) on DeepSeek-V3,
    cut into its stages two layers apiece: the HF model's gradients."""
    sched = first_schedule(name)
    stages = sched.num_stages // sched.chains
    model = tiny("deepseek_v3", num_hidden_layers=2 * stages - 2)
    spec = hf_spec(model, seq=SEQ)
    ref = copy.deepcopy(model)
    x, y = spec.make_batch(2 * sched.total_microbatches, torch.Generator().manual_seed(3))
    mods = split_stages(spec.layers, stages, None)
    result = run_local(sched, mods, x, y, spec.loss_fn)
    ref_loss = _hf_loss(ref, x, y)
    ref_loss.backward()
    assert result.loss == pytest.approx(ref_loss.item(), rel=1e-13)
    _assert_hf_grads(mods, ref)


def _assert_hf_grads(mods: list[nn.Module], ref: nn.Module) -> None:
    """Every stage parameter's gradient equals the HF model's, by HF parameter name, to
    1e-13 of the largest gradient (float64)."""
    got = dict(p for mod in mods for p in _hf_named(mod))
    want = dict(ref.named_parameters())
    assert got.keys() == want.keys()
    scale = max(float(q.grad.abs().max()) for q in want.values())
    for n, q in want.items():
        assert got[n].grad is not None, n
        torch.testing.assert_close(got[n].grad, q.grad, rtol=0, atol=1e-13 * scale, msg=n)


def _hf_named(mod: nn.Module):
    """(HF parameter name, parameter) of a stage: its layers wrap the HF modules."""
    for layer in mod.layers:
        inner = getattr(layer, "layer", None)
        if inner is not None:  # a DecoderLayer: model.layers.<i>
            yield from ((f"model.layers.{inner.self_attn.layer_idx}.{n}", p)
                        for n, p in inner.named_parameters())
        elif hasattr(layer, "tokens"):
            yield "model.embed_tokens.weight", layer.tokens.weight
        else:
            yield "model.norm.weight", layer.norm.weight
            yield "lm_head.weight", layer.proj.weight


def test_deepseek_router_in_float64_is_transformers_formula():
    """The float64 router (models/hf.py) against transformers' own on a float32 copy: the same
    experts chosen, the same weights to float32 rounding."""
    model = tiny("deepseek_v3")
    orig = copy.deepcopy(model.model.layers[1].mlp.gate).float()
    hf_spec(model, seq=SEQ)
    wide = model.model.layers[1].mlp.gate
    assert type(wide) is not type(orig) and isinstance(wide, type(orig))
    x = torch.randn(50, 32, dtype=torch.float64)
    _, w64, i64 = wide(x)
    _, w32, i32 = orig(x.float())
    assert w64.dtype == torch.float64
    order64, order32 = i64.sort(dim=-1), i32.sort(dim=-1)
    assert torch.equal(order64.values, order32.values)
    torch.testing.assert_close(w64.gather(1, order64.indices), w32.gather(1, order32.indices)
                               .double(), rtol=1e-6, atol=1e-7)
    assert set(wide.state_dict()) == set(orig.state_dict())  # names kept: checkpoints agree


@pytest.mark.parametrize("kind", ["mixtral", "deepseek_v3"])
def test_two_training_steps_equal_plain_hf_training(kind):
    """Two AdamW steps of ZB-H1 against the HF model trained by plain PyTorch."""
    sched = get_schedule("zb-h1", 2, 4)
    spec, ref, _, _ = _problem(kind)
    mods = split_stages(spec.layers, 2, [2])
    pipe_opt = torch.optim.AdamW([p for m in mods for p in m.parameters()], lr=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        x, y = spec.make_batch(8, gen)
        loss = run_local(sched, mods, x, y, spec.loss_fn).loss
        pipe_opt.step()
        pipe_opt.zero_grad(set_to_none=True)
        ref_loss = _hf_loss(ref, x, y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert loss == pytest.approx(ref_loss.item(), rel=1e-12)
    got = dict(p for m in mods for p in _hf_named(m))
    for n, q in ref.named_parameters():
        torch.testing.assert_close(got[n], q, rtol=1e-9, atol=1e-11, msg=n)


def _config(tmp_path, kind: str, **extra) -> str:
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({"model_type": kind, **CONFIGS[kind], **extra}))
    return f"hf:{path}"


@pytest.mark.slow
def test_run_check_trains_and_a_checkpoint_resumes_under_another_schedule(tmp_path, capsys):
    """``run --model hf:qwen2_moe.json``: --check with two steps (float64), then two steps
    saved and one resumed under DualPipe give the losses of three steps in one run."""
    model = _config(tmp_path, "qwen2_moe")
    common = ["-p", "2", "-m", "4", "--model", model, "--seq", str(SEQ), "--warmup", "0",
              "--repeat", "1", "--dtype", "float64", "--json"]
    assert main(["run", "--local", "--schedule", "zb-h1", "--steps", "2", "--check",
                 *common]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["passed"] and out["check"]["relative"]["gradients"] < 1e-13
    assert out["losses"] == pytest.approx(out["reference_losses"], rel=1e-12)
    ck = str(tmp_path / "ck")
    assert main(["run", "--local", "--schedule", "1f1b", "--steps", "2", "--save", ck,
                 *common]) == 0
    first = json.loads(capsys.readouterr().out)["losses"]
    assert first == pytest.approx(out["losses"], rel=1e-12)  # the same steps, another cut
    assert main(["run", "--local", "--schedule", "dualpipe", "--steps", "1", "--resume", ck,
                 *common]) == 0
    resumed = json.loads(capsys.readouterr().out)["losses"]
    assert main(["run", "--local", "--schedule", "1f1b", "--steps", "3", *common]) == 0
    whole = json.loads(capsys.readouterr().out)["losses"]
    assert first + resumed == pytest.approx(whole, rel=1e-12)


@pytest.mark.distributed
@pytest.mark.slow
def test_gloo_two_ranks_deepseek_gradients_equal_the_unsplit_model(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", "--schedule", "zb-h1",
                           "-p", "2", "-m", "4", "--model", _config(tmp_path, "deepseek_v3"),
                           "--seq", str(SEQ), "--check", "--dtype", "float64", "--warmup", "0",
                           "--repeat", "1", "--json"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["world_size"] == 2
    assert out["check"]["passed"] and out["check"]["relative"]["gradients"] < 1e-13


# ---- bad input: one line naming the key ----------------------------------------------------

@pytest.mark.parametrize("kind,extra,message", [
    ("mixtral", {"num_experts_per_tok": 5},
     "'num_experts_per_tok' 5 must be at most 'num_local_experts' 4 (valid: 1..4)"),
    ("qwen3_moe", {"num_experts_per_tok": 6},
     "'num_experts_per_tok' 6 must be at most 'num_experts' 4 (valid: 1..4)"),
    ("mixtral", {"output_router_logits": True}, "'output_router_logits' true adds the "
     "router's load-balancing loss"),
    ("qwen2_moe", {"output_router_logits": True}, "set it to false"),
    ("deepseek_v3", {"n_group": 3}, "'n_group' 3 must divide 'n_routed_experts' 4"),
    ("deepseek_v3", {"topk_group": 3}, "'topk_group' 3 must be in 1..2 ('n_group')"),
    ("deepseek_v3", {"num_experts_per_tok": 3}, "'num_experts_per_tok' 3 must be at most 2"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "'num_key_value_heads' 2 must equal "
     "'num_attention_heads' 4"),
])
def test_bad_moe_configs_are_one_line_naming_the_key(tmp_path, run_cli, kind, extra, message):
    model = _config(tmp_path, kind, **extra)
    rc, out, err = run_cli("run", "--local", "--model", model, "-p", "2", "-m", "2",
                           "--schedule", "1f1b")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"pipebubble: error: {model}: "), err
    assert message in err


def test_the_router_logits_flag_adds_no_loss_in_deepseek_so_it_is_accepted():
    model = tiny("deepseek_v3", output_router_logits=True)
    assert check_moe(model.config.to_dict(), "hf:x") > 0


VARIANTS = [(kind, {}) for kind in MOE_TYPES] + [
    ("mixtral", {"tie_word_embeddings": True, "head_dim": 16}),
    ("qwen2_moe", {"qkv_bias": False, "decoder_sparse_step": 2}),
    ("qwen3_moe", {"attention_bias": True, "mlp_only_layers": [1]}),
    ("deepseek_v3", {"q_lora_rank": None, "attention_bias": True, "n_shared_experts": 2,
                     "first_k_dense_replace": 0}),
]


@pytest.mark.parametrize("kind,extra", VARIANTS)
def test_the_size_check_counts_the_stored_tensors(kind, extra):
    """check_build's count (the memory check's) against the model transformers builds, from
    the config with its defaults filled in, as load_hf passes it."""
    model = tiny(kind, **extra)
    data = model.config.to_dict()
    stored = sum(p.numel() for p in model.parameters())
    # the routing bias is a buffer in transformers, stored all the same
    stored += sum(b.numel() for n, b in model.named_buffers() if "e_score_correction" in n)
    assert check_moe(data, "hf:x") == stored
    with pytest.raises(UserError, match="^hf:x: 'num_experts_per_tok' 9 must be at most"):
        check_moe({**data, "num_experts_per_tok": 9}, "hf:x")
    if kind != "qwen2_moe":  # (its config's sliding_window is 0 when unused: not a size)
        assert check_build({k: v for k, v in data.items() if v is not None}, "hf:x") == stored
