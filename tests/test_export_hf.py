"""``pipebubble export-hf``: a checkpoint of an ``hf:`` model back as a ``save_pretrained``
folder that transformers' own ``from_pretrained`` loads, with exactly the trained weights.

One tiny tied LLaMA (``tie_word_embeddings``) trains 2 steps in float64 across 2 stages with
``run --local --save``; the export is loaded by ``AutoModelForCausalLM.from_pretrained`` and
compared, bit for bit, with the checkpoint's tensors read by DCP and with the logits of the
pipebubble layers holding them.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from pipebubble.cli import main  # noqa: E402


def cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from transformers import LlamaConfig

    d = tmp_path_factory.mktemp("export")
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1,
                tie_word_embeddings=True).save_pretrained(d / "tiny")
    rc, err = cli("run", "--local", "--model", f"hf:{d / 'tiny'}", "--seq", "8", "--batch", "4",
                  "-p", "2", "-m", "2", "--schedule", "1f1b", "--steps", "2", "--dtype",
                  "float64", "--lr", "0.01", "--save", d / "ckpt", "--json")
    assert rc == 0, err
    return d


def checkpoint_layers(d, load: bool = True):
    """The pipebubble layers of the tiny model holding the checkpoint's tensors (float64;
    without ``load``, the initial ones of seed 0)."""
    from pipebubble.models.hf import load_hf
    from pipebubble.runtime import checkpoint as ckpt

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        spec = load_hf(d / "tiny", seq=8, seed=0)
    finally:
        torch.set_default_dtype(old)
    if not load:
        return spec.layers, {}
    named = [(f"{spec.names[i]}.{pn}", p) for i, layer in enumerate(spec.layers)
             for pn, p in layer.named_parameters(remove_duplicate=False)]
    state = {f"model.{n}": torch.empty_like(p) for n, p in named}
    ckpt.load(str(d / "ckpt"), state, meta=ckpt.read_meta(str(d / "ckpt")), no_dist=True)
    with torch.no_grad():
        for n, p in named:
            p.copy_(state[f"model.{n}"])
    return spec.layers, state


def test_export_loads_in_transformers_with_the_trained_weights(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    rc, err = cli("export-hf", trained / "ckpt", out)
    assert rc == 0, err
    assert f"wrote {out}: llama" in err and "2 steps trained" in err
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    assert model.config.tie_word_embeddings
    layers, state = checkpoint_layers(trained)
    sd = model.state_dict()
    # every tensor exactly the checkpoint's (the names: pipebubble's layer, then HF's own)
    assert torch.equal(sd["model.embed_tokens.weight"],
                       state["model.model.embed_tokens.tokens.weight"])
    assert torch.equal(sd["lm_head.weight"], state["model.model.norm+lm_head.proj.weight"])
    assert torch.equal(sd["model.layers.1.mlp.up_proj.weight"],
                       state["model.model.layers.1.layer.mlp.up_proj.weight"])
    # and trained: step 2's weights are not the initial ones of the same seed
    fresh = checkpoint_layers(trained, load=False)[0]  # --seed 0's initial weights
    assert not torch.equal(sd["model.layers.0.mlp.up_proj.weight"],
                           fresh[1].layer.mlp.up_proj.weight)
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    h = ids
    with torch.no_grad():
        for layer in layers:
            h = layer(h)
        logits = model(ids).logits
    assert logits.dtype == torch.float64 and torch.equal(logits, h)


def test_bad_inputs_are_one_line(trained, tmp_path):
    def refused(*argv):
        rc, err = cli("export-hf", *argv)
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        return err

    assert "not a pipebubble checkpoint (no pipebubble.json)" in refused(trained / "tiny",
                                                                         tmp_path / "a")
    (tmp_path / "taken").mkdir()
    assert "exists; pass --overwrite" in refused(trained / "ckpt", tmp_path / "taken")
    assert cli("export-hf", trained / "ckpt", tmp_path / "taken", "--overwrite")[0] == 0
    (tmp_path / "file").write_text("x")
    assert "exists and is not a folder" in refused(trained / "ckpt", tmp_path / "file")
    # a checkpoint of a model that is not hf:
    rc, err = cli("run", "--local", "--model", "mlp", "--layers", "2", "-p", "1", "-m", "1",
                  "--schedule", "gpipe", "--steps", "1", "--save", tmp_path / "mlp")
    assert rc == 0, err
    assert "is of model 'mlp', not an hf: model" in refused(tmp_path / "mlp", tmp_path / "b")


def test_a_checkpoint_without_its_config_takes_hf_config(trained, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(trained / "ckpt", old)
    meta = json.loads((old / "pipebubble.json").read_text())
    del meta["hf_config"]  # as a checkpoint written before export-hf records it
    (old / "pipebubble.json").write_text(json.dumps(meta))
    rc, err = cli("export-hf", old, tmp_path / "x")
    assert rc == 2 and "records no HF config" in err and "--hf-config" in err
    rc, err = cli("export-hf", old, tmp_path / "y", "--hf-config", trained / "tiny")
    assert rc == 0, err
    # a config of another shape is named, not loaded
    cfg = json.loads((trained / "tiny" / "config.json").read_text())
    (tmp_path / "wide.json").write_text(json.dumps({**cfg, "intermediate_size": 48}))
    rc, err = cli("export-hf", old, tmp_path / "z", "--hf-config", tmp_path / "wide.json")
    assert rc == 2 and "has shape" in err and "--hf-config" in err, err
