"""Analytic profiles: parameter counts of known models, Korthikanti's activation bytes, FLOPs
and time by hand, scaling with the microbatch size, and the CLI."""

import json

import pytest

from pipebubble.cli import main
from pipebubble.plan.analytic import TransformerShape, analytic_profile
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.profile import Profile

LLAMA_7B = dict(layers=32, hidden=4096, ffn=11008, heads=32, vocab=32000)


def test_llama_7b_has_6_74_billion_parameters():
    prof = analytic_profile(**LLAMA_7B, seq=2048, batch=1, tflops=989, mfu=0.4)
    total = sum(layer.params for layer in prof.layers)
    # 2 x 32000 x 4096 (embedding, head) + 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096)
    # + 4096 (final norm)
    assert total == 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert total == 6_738_415_616
    assert round(total / 1e9, 2) == 6.74
    assert prof.metadata["params"] == total
    assert [layer.name for layer in prof.layers[:2]] == ["tok_embeddings", "layers.0"]
    assert prof.layers[-1].name == "output" and len(prof) == 34


def test_grouped_query_attention_llama2_70b():
    # 80 layers, h 8192, ffn 28672, 64 heads, 8 key/value heads: K and V are 8192 x 1024.
    shape = TransformerShape(80, 8192, 28672, 64, 32000, kv_heads=8)
    assert shape.total_params() == 68_976_648_192


def test_tied_embeddings_drop_the_head_matrix():
    untied = TransformerShape(**LLAMA_7B).total_params()
    assert TransformerShape(**LLAMA_7B, tied_embeddings=True).total_params() == \
        untied - 32000 * 4096


def test_korthikanti_activation_bytes_per_block():
    s, b, h, a = 1024, 2, 512, 8
    gpt = dict(swiglu=False, dropout=True, attention="unfused")  # Korthikanti's GPT block
    prof = analytic_profile(layers=2, hidden=h, ffn=4 * h, heads=a, vocab=1000, seq=s,
                            batch=b, tflops=100, mfu=0.5, **gpt)
    block = prof.layers[1]
    assert block.activation_bytes == s * b * h * (34 + 5 * a * s / h)
    flash = analytic_profile(layers=2, hidden=h, ffn=4 * h, heads=a, vocab=1000, seq=s,
                             batch=b, tflops=100, mfu=0.5, swiglu=False, dropout=True)
    assert flash.layers[1].activation_bytes == 34 * s * b * h  # FlashAttention: no scores
    assert block.extra["activation_bytes_selective"] == 34 * s * b * h
    assert block.extra["activation_bytes_full"] == 2 * s * b * h
    # fp32 activations: twice the 16-bit bytes (the logits are fp32 either way)
    wide = analytic_profile(layers=2, hidden=h, ffn=4 * h, heads=a, vocab=1000, seq=s,
                            batch=b, tflops=100, mfu=0.5, dtype="fp32", **gpt)
    assert wide.layers[1].activation_bytes == 2 * block.activation_bytes
    assert prof.layers[-1].activation_bytes == 4 * s * b * h + 4 * s * b * 1000


def test_flops_and_time_by_hand():
    s, b, h, f, a, V = 128, 1, 64, 256, 4, 100
    T, U = 2.0, 0.5  # 2 TFLOP/s at 50 %: 1e12 FLOP/s
    prof = analytic_profile(layers=1, hidden=h, ffn=f, heads=a, vocab=V, seq=s, batch=b,
                            tflops=T, mfu=U)
    t = s * b
    matrices = 4 * h * h + 3 * h * f
    forward = 2 * t * matrices + 4 * b * s * s * h
    block = prof.layers[1]
    assert block.flops == 3 * forward
    assert block.forward == pytest.approx(forward / 1e12)
    assert block.backward == pytest.approx(2 * forward / 1e12)
    assert block.extra["weight_backward"] == pytest.approx(2 * t * matrices / 1e12)
    assert prof.layers[-1].flops == 3 * 2 * t * h * V
    assert prof.layers[0].flops == 0


def test_linear_scaling_with_one_profile():
    prof = analytic_profile(**LLAMA_7B, seq=512, batch=2, tflops=989, mfu=0.4)
    table = ProfileSet([prof])
    two, six = table.at(2, "none"), table.at(6, "none")
    assert six.f[5] == pytest.approx(3 * two.f[5])
    assert six.act[5] == pytest.approx(3 * two.act[5])
    assert list(six.params) == list(two.params)
    full = table.at(2, "full")
    assert full.act[5] == prof.layers[5].extra["activation_bytes_full"]
    assert full.i[5] == pytest.approx(two.i[5] + prof.layers[5].forward)  # recompute F first


def _measured(batch: int, forward: float) -> Profile:
    return Profile.from_dict({"batch": batch, "layers": [
        {"name": "a", "forward": forward, "backward": 2 * forward, "params": 10,
         "activation_bytes": 100 * batch, "flops": 0}]})


def test_interpolation_between_profiles():
    # Not linear in the batch: 1 -> 1.0 s, 4 -> 2.5 s. At 2: 1 + (2.5 - 1) / 3 = 1.5 s;
    # at 8, extrapolated from the two nearest: 1 + 1.5 / 3 x 7 = 4.5 s.
    table = ProfileSet([_measured(4, 2.5), _measured(1, 1.0)])
    assert table.at(2, "none").f[0] == pytest.approx(1.5)
    assert table.at(8, "none").f[0] == pytest.approx(4.5)
    assert table.at(2, "none").w[0] == pytest.approx(1.5)  # default W = half of B
    with pytest.raises(ValueError, match="activation_bytes_full"):
        table.at(2, "full")


def test_cli_writes_the_profile(tmp_path, capsys):
    out = tmp_path / "p.json"
    args = ["profile", "--analytic", "--layers", "4", "--hidden", "256", "--ffn", "688",
            "--heads", "4", "--kv-heads", "2", "--vocab", "1000", "--seq", "64", "--batch", "2",
            "--tflops", "100", "--mfu", "0.5", "--out", str(out), "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    loaded = Profile.load(out)
    assert loaded.as_dict() == printed
    expect = analytic_profile(layers=4, hidden=256, ffn=688, heads=4, kv_heads=2, vocab=1000,
                              seq=64, batch=2, tflops=100, mfu=0.5)
    assert [x.params for x in loaded.layers] == [x.params for x in expect.layers]


@pytest.mark.parametrize("extra, message", [
    (["--kv-heads", "3"], "--kv-heads must divide --heads 4 (valid: 1, 2, 4)"),
    (["--mfu", "1.5"], "--mfu must be a number in [0.001, 1]"),
    (["--dtype", "int4"], "unknown --dtype 'int4'"),
])
def test_cli_errors_are_one_line(extra, message, capsys):
    base = {"--layers": "2", "--hidden": "64", "--ffn": "128", "--heads": "4",
            "--vocab": "10", "--seq": "8", "--tflops": "1", "--mfu": "0.5"}
    for k, v in zip(extra[::2], extra[1::2], strict=True):
        base[k] = v
    args = ["profile", "--analytic"] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipebubble: error: ") and message in err


def test_cli_names_missing_shape_flags(capsys):
    assert main(["profile", "--analytic", "--layers", "2"]) == 2
    assert "--analytic needs --hidden, --ffn, --heads" in capsys.readouterr().err


def test_flops_agree_with_torchs_counter_on_the_builtin_transformer():
    """The built-in transformer is a GPT block (4h GELU MLP, multi-head attention): torch's
    FlopCounterMode, run by ``profile_layers``, counts its matrix multiplies exactly as the
    formula does. (On CPU it counts no FLOPs for the fused attention kernel, so the score
    term 3 x 4 b s^2 h is left out of the comparison; the head has none.)"""
    import torch

    from pipebubble.models import build_model
    from pipebubble.plan.profile import profile_layers

    b, s, h, a, V = 3, 32, 64, 4, 500
    spec = build_model("transformer", layers=2, dim=h, heads=a, vocab=V, seq=s)
    x, y = spec.make_batch(b, torch.Generator().manual_seed(0))
    measured = profile_layers(spec.layers, x, target=y, loss_fn=spec.loss_fn, warmup=0,
                              repeats=1)
    formula = analytic_profile(layers=2, hidden=h, ffn=4 * h, heads=a, vocab=V, seq=s,
                               batch=b, tflops=1, mfu=1, swiglu=False)
    scores = 3 * 4 * b * s * s * h
    assert [m.flops for m in measured.layers] == [
        0, formula.layers[1].flops - scores, formula.layers[2].flops - scores,
        formula.layers[3].flops]
    assert measured.layers[0].activation_bytes == formula.layers[0].activation_bytes  # ids
