"""Layer names and roles from the model to the profile to the paste blocks, and profiling
from Python as the CLI does (one CPU thread, a warning when identical layers disagree)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipebubble.models import transformer
from pipebubble.models.spec import ModelSpec
from pipebubble.plan.layouts import megatron_layout, megatron_symbols, torchtitan_fqns
from pipebubble.plan.profile import LayerProfile, Profile, profile_layers, profile_model


class Emb(nn.Module):  # a class name without "embed": the role says what it is
    role = "embedding"

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(20, 8)

    def forward(self, ids):
        return self.table(ids)


class Out(nn.Linear):
    role = "head"


def _spec() -> ModelSpec:
    torch.manual_seed(0)
    layers = [Emb(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 8)),
              Out(8, 20)]

    def make_batch(n, gen):
        idx = torch.randint(0, 20, (n, 5), generator=gen)
        return idx, idx

    return ModelSpec("roles", layers, make_batch,
                     lambda o, t: nn.functional.cross_entropy(o.flatten(0, 1), t.flatten()),
                     names=["tok", "h.0", "h.1", "norm+out"])


def test_roles_not_class_names_give_megatrons_e_and_l():
    prof = profile_model(_spec(), batch=2, warmup=0, repeats=1)
    assert [layer.extra.get("role") for layer in prof.layers] == ["embedding", "layer", "layer",
                                                                  "head"]
    assert megatron_layout(prof, [(0, 1), (2, 3)]) == "Et|tL"
    # a profile saved and read back keeps them
    assert megatron_symbols(Profile.from_dict(prof.as_dict())) == ["E", "t", "t", "L"]


def test_a_role_overrides_what_the_type_name_suggests():
    prof = Profile([LayerProfile("a", 1, 1, 1, 0, 0, "EmbeddingLike", {"role": "layer"}),
                    LayerProfile("b", 1, 1, 1, 0, 0, "Head", {"role": "layer"})])
    assert megatron_symbols(prof) == ["t", "t"]
    untyped = Profile([LayerProfile("a", 1, 1, 1, 0, 0, "Emb"),
                       LayerProfile("b", 1, 1, 1, 0, 0, "Block"),
                       LayerProfile("c", 1, 1, 1, 0, 0, "OutputHead")])
    assert megatron_symbols(untyped) == ["E", "t", "L"]  # another tool's file: by type


def test_builtin_transformer_layers_carry_roles():
    spec = transformer(layers=2, dim=8, heads=2, vocab=16, seq=4)
    assert spec.layer_roles() == ["embedding", "layer", "layer", "head"]


def test_a_composite_layer_lists_each_module_for_torchtitan():
    prof = profile_model(_spec(), batch=2, warmup=0, repeats=1)
    assert prof.layers[3].extra["modules"] == ["norm", "out"]
    assert torchtitan_fqns(prof, [(0, 1), (2, 3)]) == (
        'module_fqns_per_model_part = [["tok", "h.0"], ["h.1", "norm", "out"]]')


def test_profiling_from_python_pins_one_thread_and_restores_it():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        prof = profile_layers([nn.Linear(4, 4)], torch.randn(2, 4), warmup=0, repeats=1)
        assert prof.metadata["threads"] == 1 and prof.metadata["timer"] == "cpu"
        assert torch.get_num_threads() == 2
        kept = profile_layers([nn.Linear(4, 4)], torch.randn(2, 4), warmup=0, repeats=1,
                              threads=None)
        assert kept.metadata["threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_noisy_identical_layers_warn_from_python(monkeypatch):
    import pipebubble.plan.profile as prof_mod

    real = prof_mod._timed_pass
    calls = {"n": 0}

    def skewed(*args):  # the last of two identical layers (1 and 2) measured 10x slower
        f, b = real(*args)
        calls["n"] += 1
        return [*f[:2], 10 * f[1] + 1e-3], [*b[:2], 10 * b[1] + 1e-3]

    monkeypatch.setattr(prof_mod, "_timed_pass", skewed)
    torch.manual_seed(0)
    layers = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)]  # the first computes no dx
    with pytest.warns(UserWarning, match="2 identical Linear differ .* the measurement is noisy"):
        profile_layers(layers, torch.randn(2, 4), warmup=0, repeats=1)
    assert calls["n"] == 1
