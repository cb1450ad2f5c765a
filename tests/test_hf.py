"""The HuggingFace adapter: flat layer lists that reproduce the HF model, and the split
backward (every family that splits B into I and W) on them, with any cut."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from torch import nn

tf = pytest.importorskip("transformers")

from pipebubble import auto_schedule, get_schedule  # noqa: E402
from pipebubble.errors import UserError  # noqa: E402
from pipebubble.models.hf import KNOWN_TYPES, hf_layers, hf_spec, load_hf  # noqa: E402
from pipebubble.runtime.local import run_local  # noqa: E402
from pipebubble.runtime.stages import split_stages  # noqa: E402

SMALL = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def tiny(kind: str, layers: int = 3):
    """A tiny random HF causal LM of ``kind`` in float64 (dropout off)."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = tf.GPT2Config(vocab_size=40, n_embd=16, n_layer=layers, n_head=4,
                               n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                               bos_token_id=0, eos_token_id=0)
    else:
        cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config}
        extra = {"sliding_window": 3} if kind == "mistral" else {}
        config = cls[kind](**{**SMALL, "num_hidden_layers": layers}, **extra)
    return tf.AutoModelForCausalLM.from_config(config).double()


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gpt2"])
def test_flat_layers_give_the_hf_logits_and_loss(kind):
    model = tiny(kind)
    spec = hf_spec(model, seq=7)
    idx = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    h = idx[:, :-1]
    for layer in spec.layers:
        h = layer(h)
    out = model(input_ids=idx, labels=idx)  # HF shifts the labels itself
    torch.testing.assert_close(h, out.logits[:, :-1], rtol=0, atol=1e-12)
    # The next-token loss over the first 7 positions of 8 tokens: HF's own loss (which HF
    # computes in float32, hence the tolerance).
    loss = spec.loss_fn(h, idx[:, 1:])
    torch.testing.assert_close(loss, out.loss.double(), rtol=0, atol=1e-6)


def test_names_are_the_hf_module_names_and_roles_mark_embedding_and_head():
    layers, names, roles = hf_layers(tiny("llama", layers=2))
    assert names == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                     "model.norm+lm_head"]
    assert roles == ["embedding", "layer", "layer", "head"]
    model = tiny("gpt2", layers=2)
    _, names, roles = hf_layers(model)
    assert names[1:3] == ["transformer.h.0", "transformer.h.1"]
    assert roles[0] == "embedding" and roles[-1] == "head"
    real = dict(model.named_modules())
    for name in names:
        assert all(part in real for part in name.split("+")), name


def test_a_tied_head_stays_tied_to_the_token_table():
    model = tiny("gpt2", layers=1)
    assert model.lm_head.weight is model.transformer.wte.weight  # GPT-2 ties them
    layers, _, _ = hf_layers(model)
    assert layers[-1].proj.weight is layers[0].tokens.weight  # the model as it is


def test_an_unknown_model_type_names_the_known_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UserError, match="'bert'.*" + ", ".join(KNOWN_TYPES)):
        load_hf(tmp_path)
    with pytest.raises(UserError, match="no config.json"):
        load_hf(tmp_path / "..")
    with pytest.raises(UserError, match="no such file"):
        load_hf(tmp_path / "missing.json")


def test_hf_path_builds_from_a_config_seeded_and_loads_safetensors(tmp_path):
    model = tiny("llama", layers=2).float()
    model.config.save_pretrained(tmp_path)
    a, b = load_hf(tmp_path, seq=4, seed=3), load_hf(tmp_path / "config.json", seq=4, seed=3)
    for p, q in zip(nn.Sequential(*a.layers).parameters(), nn.Sequential(*b.layers).parameters(),
                    strict=True):
        assert torch.equal(p, q)  # random initialisation, the same from the same seed
    model.save_pretrained(tmp_path)  # now with weights: they are loaded, not drawn
    c = load_hf(tmp_path, seq=4, seed=3)
    assert torch.equal(c.layers[0].tokens.weight, model.model.embed_tokens.weight)


# ---- the split backward on HF graphs -----------------------------------------------------

SPLIT = ["zb-h1", "zb-h2", "zbv", "v-half", "v-min", "dualpipe", "dualpipev", "auto"]


def _schedule(name: str, ranks: int, m: int):
    if name == "auto":
        return auto_schedule(ranks, m, mip_windows=False)
    return get_schedule(name, ranks, m)


def _cut(n: int, stages: int, rng: random.Random) -> list[int]:
    """Random cut points, the first stage always holding the embedding and a layer."""
    return sorted(rng.sample(range(2, n), stages - 1))


@pytest.mark.parametrize("name", SPLIT)
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gpt2"])
def test_every_split_backward_family_gives_the_unsplit_gradients(name, kind):
    sched = _schedule(name, 2, 4)
    stages = sched.num_stages // sched.chains
    rng = random.Random(f"{name}{kind}")
    for trial in range(2):
        spec = hf_spec(tiny(kind, layers=stages + 1), seq=5)
        cuts = _cut(len(spec.layers), stages, rng) if trial else [2, *range(3, stages + 1)]
        ref = copy.deepcopy(nn.Sequential(*spec.layers))
        x, y = spec.make_batch(sched.total_microbatches, torch.Generator().manual_seed(trial))
        ref_loss = spec.loss_fn(ref(x), y)
        ref_loss.backward()
        mods = split_stages(spec.layers, stages, cuts)
        res = run_local(sched, mods, x, y, spec.loss_fn)
        assert res.loss == pytest.approx(ref_loss.item(), rel=1e-12)
        # per layer: a tied table (GPT-2) is listed under the embedding and the head alike
        got = [p for m in mods for layer in m.layers for p in layer.parameters()]
        want = [q for layer in ref for q in layer.parameters()]
        for i, (p, q) in enumerate(zip(got, want, strict=True)):
            assert p.grad is not None, f"{name} cut {cuts}: parameter {i} has no gradient"
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12,
                                       msg=f"{name} cut {cuts}: parameter {i}")
        kinds = {e.kind for e in res.timeline.events()}
        assert {"I", "W"} <= kinds, f"{name} did not split the backward ({kinds})"


class Tied(nn.Module):
    """An embedding and a head sharing one table, on one stage."""

    def __init__(self, square: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4)
        self.square = square

    def forward(self, ids):
        h = self.emb(ids)
        h = h * h if self.square else torch.tanh(h)
        return h @ self.emb.weight.t()


def _ce(o, t):
    return nn.functional.cross_entropy(o.flatten(0, 1), t.flatten())


def test_a_weight_used_twice_on_one_stage_splits_when_w_can_separate_it():
    # tanh(E[ids]) @ E^T: both uses lie on weight chains below one boundary node (the
    # matmul), so W computes the table's gradient in one pass: exact.
    x, y = torch.randint(0, 10, (4, 3)), torch.randint(0, 10, (4, 3))
    ref = Tied(False)
    _ce(ref(x), y).backward()
    mod = Tied(False)
    run_local(get_schedule("zb-h1", 1, 2), [mod], x, y, _ce)
    torch.testing.assert_close(mod.emb.weight.grad, ref.emb.weight.grad)


def test_a_weight_used_twice_across_an_activation_path_still_splits_exactly():
    # (E[ids])^2 @ E^T: the lookup feeds two inputs (an activation), so autograd.grad from
    # the matmul to the table would run down through the square to the lookup again; that
    # matmul's W calls its own backward alone instead.
    x, y = torch.randint(0, 10, (4, 3)), torch.randint(0, 10, (4, 3))
    ref = Tied(True)
    _ce(ref(x), y).backward()
    mod = Tied(True)
    res = run_local(get_schedule("zb-h1", 1, 2), [mod], x, y, _ce)
    assert {e.kind for e in res.timeline.events()} == {"F", "I", "W"}
    torch.testing.assert_close(mod.emb.weight.grad, ref.emb.weight.grad, rtol=1e-6, atol=1e-7)


def test_w_that_needs_freed_activations_is_a_one_line_error_naming_the_stage():
    from pipebubble.runtime.memory import SavedTensors
    from pipebubble.runtime.split import SplitError, backward_input

    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    saved = SavedTensors(lin.parameters())
    with saved:
        y = lin(x)
    _, work = backward_input(y, torch.ones(4, 2), x, saved, where="stage 5")
    saved.free()  # what a wrong classification would have done: W's tensors gone
    with pytest.raises(SplitError, match=r"^stage 5: .*weight gradient \(W\) of AddmmBackward0"):
        work.run()


def test_model_args_override_config_fields_and_unknown_ones_are_named(tmp_path):
    from pipebubble.models.loader import load_model

    tiny("llama", layers=3).config.save_pretrained(tmp_path)
    spec = load_model(f"hf:{tmp_path}", {"num_hidden_layers": "1"}, seq=4)
    assert spec.layer_names() == ["model.embed_tokens", "model.layers.0", "model.norm+lm_head"]
    with pytest.raises(UserError, match=r"model_args depth: not a field of the llama config; "
                                        r"valid are .*num_hidden_layers"):
        load_model(f"hf:{tmp_path}", {"depth": "2"})
