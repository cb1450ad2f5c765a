"""Tied weights across stages (``runtime/tied.py``): a weight used on two stages (a head
tied to the embedding) keeps one value, and the pipeline trains as the tied model does.

The reference is written out here, not taken from the code under test: the same seeded
layers as one ``nn.Sequential`` (the tie is one parameter, as the user wrote it) or the
HuggingFace model itself with its own forward, trained by torch's AdamW on the documented
batches (``runtime.train.step_generator``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.models.loader import load_model
from pipebubble.runtime.local import run_local
from pipebubble.runtime.stages import split_stages
from pipebubble.runtime.tied import find_ties, sum_tied_gradients, untie_stages
from pipebubble.runtime.train import layer_names, step_generator
from pipebubble.schedules import get_schedule, schedule_names

# A hand-written tied language model: embedding | 6 blocks | norm + head, the head's weight
# the embedding's table (one nn.Parameter), 8 layers: 2 or 4 stages cut evenly.
MODEL = textwrap.dedent('''
    import torch
    from torch import nn
    from pipebubble.models.spec import ModelSpec

    V, D, T = 16, 8, 5

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, h):
            return h + torch.tanh(self.lin(h))

    class Head(nn.Module):
        role = "head"

        def __init__(self, table):
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.proj = nn.Linear(D, V, bias=False)
            self.proj.weight = table          # tied: the embedding's own parameter

        def forward(self, h):
            return self.proj(self.norm(h))

    def _batch(n, gen):
        idx = torch.randint(0, V, (n, T + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    def _loss(logits, y):
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def build(declared=False, head_rows=V):
        torch.manual_seed(0)
        emb = nn.Embedding(V, D)
        emb.role = "embedding"
        head = Head(emb.weight)
        layers = [emb, *[Block() for _ in range(6)], head]
        ties = []
        if declared:   # a distinct parameter, declared to be the same weight
            head.proj = nn.Linear(D, head_rows, bias=False)
            ties = [("layers.0.weight", "layers.7.proj.weight")]
        return ModelSpec("tied", layers, _batch, _loss, ties=ties)

    def build_reused():   # one block applied as layer 1 and as layer 6 (ALBERT-style)
        spec = build()
        spec.layers[6] = spec.layers[1]
        return spec

    def build_declared():
        return build(declared=True)

    def build_mismatched():
        return build(declared=True, head_rows=V + 1)
''')

# every runnable schedule of the registry on 2 ranks; 8 layers cut evenly into its stages
LOCAL = schedule_names()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tied") / "tied_lm.py"
    path.write_text(MODEL)
    return path


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def torch_reference(model: nn.Module, make_batch, loss_fn, steps: int, batch: int,
                    lr: float = 1e-3):
    """``model`` trained by torch alone (AdamW, the documented batches): losses, params."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for k in range(steps):
        x, y = make_batch(batch, step_generator(0, k))
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


# ---- the pieces ---------------------------------------------------------------------------
def test_a_shared_parameter_is_found_under_both_names(model_file):
    spec = load_model(f"{model_file}:build", {})
    names = layer_names(spec, 8)
    ties = find_ties(spec.layers, names)
    assert [t.names for t in ties] == [("layers.0.weight", "layers.7.proj.weight")]


def test_each_stage_gets_a_copy_and_one_stage_keeps_the_model_tied(model_file):
    spec = load_model(f"{model_file}:build", {})
    names = layer_names(spec, 8)
    ties = find_ties(spec.layers, names)
    one = split_stages(spec.layers, 1)
    copies = untie_stages(one, [0], names, ties)
    assert copies[0].stages == [0]  # -p 1: not split, simply tied
    assert one[0].layers[7].proj.weight is one[0].layers[0].weight
    two = split_stages(spec.layers, 2, [4])
    copies = untie_stages(two, [0, 4], names, ties)
    assert copies[0].stages == [0, 1]
    a, b = two[0].layers[0].weight, two[1].layers[3].proj.weight
    assert a is not b and torch.equal(a, b)  # copies start equal


def test_the_gradient_sum_over_copies_is_the_tied_models_gradient(model_file, float64):
    spec = load_model(f"{model_file}:build", {})
    ref = nn.Sequential(*load_model(f"{model_file}:build", {}).layers)
    x, y = spec.make_batch(8, torch.Generator().manual_seed(3))
    spec.loss_fn(ref(x), y).backward()
    names = layer_names(spec, 8)
    ties = find_ties(spec.layers, names)
    stages = split_stages(spec.layers, 2, [4])
    copies = untie_stages(stages, [0, 4], names, ties)
    run_local(get_schedule("1f1b", 2, 4), stages, x, y, spec.loss_fn)
    emb, head = stages[0].layers[0].weight, stages[1].layers[3].proj.weight
    # each copy alone holds its own use's gradient: not the tied model's
    assert not torch.allclose(emb.grad, ref[0].weight.grad)
    sum_tied_gradients(dict(enumerate(stages)), copies)
    for p in (emb, head):
        torch.testing.assert_close(p.grad, ref[0].weight.grad, rtol=1e-12, atol=1e-14)


def test_copies_stay_bitwise_equal_over_training(model_file):
    spec = load_model(f"{model_file}:build", {})
    names = layer_names(spec, 8)
    stages = split_stages(spec.layers, 4, [2, 4, 6])
    copies = untie_stages(stages, [0, 2, 4, 6], names, find_ties(spec.layers, names))
    opt = torch.optim.AdamW([p for st in stages for p in st.parameters()], lr=0.01)
    sched = get_schedule("zbv", 2, 4)  # V placement: both copies on rank 0, split backward
    for k in range(3):
        opt.zero_grad()
        x, y = spec.make_batch(8, step_generator(0, k))
        run_local(sched, stages, x, y, spec.loss_fn)
        sum_tied_gradients(dict(enumerate(stages)), copies)
        opt.step()
    emb, head = stages[0].layers[0].weight, stages[3].layers[1].proj.weight
    assert emb is not head and torch.equal(emb, head)


def test_a_declared_tie_of_two_shapes_is_one_line_naming_it(model_file, capsys):
    spec = load_model(f"{model_file}:build_mismatched", {})
    with pytest.raises(UserError, match=r"tied weight 'layers.0.weight': its copies differ in "
                                        r"shape: layers.0.weight is \[16, 8\], "
                                        r"layers.7.proj.weight is \[17, 8\]"):
        find_ties(spec.layers, layer_names(spec, 8), spec.ties)
    rc = main(["run", "--local", "--model", f"{model_file}:build_mismatched", "--schedule",
               "1f1b", "-p", "2", "-m", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "differ in shape" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# ---- training through every schedule, against torch alone -----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("schedule", LOCAL)
def test_every_schedule_trains_the_tied_model_as_torch_does(model_file, capsys, schedule):
    out = run_json(capsys, "--local", "--model", f"{model_file}:build", "--schedule", schedule,
                   "-p", "2", "-m", "4", "--batch", "16", "--steps", "3", "--dtype", "float64",
                   "--check", "--warmup", "0")
    torch.set_default_dtype(torch.float64)
    try:
        spec = load_model(f"{model_file}:build", {})
        ref = torch_reference(nn.Sequential(*spec.layers), spec.make_batch, spec.loss_fn, 3, 16)
    finally:
        torch.set_default_dtype(torch.float32)
    assert out["losses"] == pytest.approx(ref, rel=1e-12, abs=0)
    assert out["reference_losses"] == pytest.approx(ref, rel=1e-12, abs=0)
    assert out["grad_max_abs_diff"] < 1e-13 and out["param_max_abs_diff"] < 1e-13


@pytest.mark.slow
def test_a_layer_applied_on_two_stages_trains_as_one_layer(model_file, capsys):
    out = run_json(capsys, "--local", "--model", f"{model_file}:build_reused", "--schedule",
                   "zbv", "-p", "2", "-m", "4", "--batch", "16", "--steps", "3", "--dtype",
                   "float64", "--check", "--warmup", "0")
    torch.set_default_dtype(torch.float64)
    try:
        spec = load_model(f"{model_file}:build_reused", {})
        ref = torch_reference(nn.Sequential(*spec.layers), spec.make_batch, spec.loss_fn, 3, 16)
    finally:
        torch.set_default_dtype(torch.float32)
    assert out["losses"] == pytest.approx(ref, rel=1e-12, abs=0)
    assert out["check"]["passed"]


@pytest.mark.slow
def test_a_declared_tie_trains_as_one_weight(model_file, capsys):
    out = run_json(capsys, "--local", "--model", f"{model_file}:build_declared", "--schedule",
                   "zb-h1", "-p", "2", "-m", "4", "--batch", "16", "--steps", "3", "--dtype",
                   "float64", "--check", "--warmup", "0")
    torch.set_default_dtype(torch.float64)
    try:
        spec = load_model(f"{model_file}:build", {})  # the same model, tied by sharing
        ref = torch_reference(nn.Sequential(*spec.layers), spec.make_batch, spec.loss_fn, 3, 16)
    finally:
        torch.set_default_dtype(torch.float32)
    assert out["losses"] == pytest.approx(ref, rel=1e-12, abs=0)


def test_one_stage_is_simply_tied(model_file, capsys):
    out = run_json(capsys, "--local", "--model", f"{model_file}:build", "--schedule", "gpipe",
                   "-p", "1", "-m", "2", "--batch", "8", "--steps", "2", "--dtype", "float64",
                   "--check", "--warmup", "0")
    assert out["grad_max_abs_diff"] < 1e-13 and out["param_max_abs_diff"] < 1e-13


@pytest.mark.slow
def test_copies_stay_equal_over_training_and_a_resumed_run_continues_it(model_file, capsys,
                                                                        tmp_path):
    common = ["--local", "--model", f"{model_file}:build", "-m", "4", "--batch", "16",
              "--dtype", "float64", "--warmup", "0", "--optimizer", "adamw", "--lr", "0.01"]
    whole = run_json(capsys, *common, "--schedule", "1f1b", "-p", "2", "--steps", "4")
    run_json(capsys, *common, "--schedule", "1f1b", "-p", "2", "--steps", "2",
             "--save", str(tmp_path / "ck"))
    # resumed into another cut and schedule: 4 stages, V placement (head on rank 0)
    rest = run_json(capsys, *common, "--schedule", "zbv", "-p", "2", "--steps", "2",
                    "--resume", str(tmp_path / "ck"), "--check")
    assert rest["losses"] == pytest.approx(whole["losses"][2:], rel=1e-12, abs=0)
    assert rest["param_max_abs_diff"] < 1e-13


# ---- a HuggingFace config with tie_word_embeddings -----------------------------------------
QWEN = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("qwen") / "config.json"
    path.write_text(json.dumps(QWEN))
    return path


def hf_reference(path, steps: int, batch: int, seq: int = 8) -> list[float]:
    """The HF model itself (its own forward and tied lm_head), trained by torch alone."""
    import transformers as tf

    fields = {k: v for k, v in QWEN.items() if k != "model_type"}
    torch.manual_seed(0)  # load_hf's seed 0, drawn in float64 as under --dtype float64
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = tf.AutoModelForCausalLM.from_config(tf.Qwen2Config(**fields)).double()
    finally:
        torch.set_default_dtype(before)
    assert model.lm_head.weight is model.get_input_embeddings().weight

    def make_batch(n, gen):
        idx = torch.randint(0, QWEN["vocab_size"], (n, seq + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for k in range(steps):
        x, y = make_batch(batch, step_generator(0, k))
        opt.zero_grad()
        loss = loss_fn(model(input_ids=x).logits, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("schedule", LOCAL)
def test_a_tied_qwen2_trains_as_hf_does_through_every_schedule(qwen, capsys, schedule):
    out = run_json(capsys, "--local", "--model", f"hf:{qwen}", "--seq", "8", "--schedule",
                   schedule, "-p", "2", "-m", "4", "--batch", "8", "--steps", "3", "--dtype",
                   "float64", "--check", "--warmup", "0")
    ref = hf_reference(qwen, 3, 8)
    # HF's own forward rounds a little differently from the flat layers (~1e-12)
    assert out["losses"] == pytest.approx(ref, rel=1e-10, abs=0)
    assert out["grad_max_abs_diff"] < 1e-13 and out["param_max_abs_diff"] < 1e-13


# ---- over gloo: the tie group, with data parallelism and torch's engine ---------------------
def _dist(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [p for p in [os.environ.get("PYTHONPATH"), *sys.path] if p])}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", *args, "--json",
                           "--warmup", "0", "--repeat", "1"],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("extra", [
    ["--schedule", "1f1b", "--dp", "2"],  # a tie group per replica, after the dp sum
    ["--schedule", "zbv"],  # V placement: both copies on rank 0
    ["--schedule", "zb-h1", "--engine", "torch"],  # torch's runtime, our sum
    ["--schedule", "dualpipe"],  # two model copies: each rank holds an embedding and a head
], ids=["1f1b-dp2", "zbv", "torch-engine", "dualpipe"])
def test_over_gloo_the_tied_model_trains_as_torch_does(model_file, extra):
    out = _dist("--model", f"{model_file}:build", "-p", "2", "-m", "4", "--batch", "16",
                "--steps", "3", "--dtype", "float64", "--check", *extra)
    torch.set_default_dtype(torch.float64)
    try:
        spec = load_model(f"{model_file}:build", {})
        dp = 2 if "--dp" in extra else 1
        ref = torch_reference(nn.Sequential(*spec.layers), spec.make_batch, spec.loss_fn, 3,
                              16 * dp)
    finally:
        torch.set_default_dtype(torch.float32)
    assert out["losses"] == pytest.approx(ref, rel=1e-12, abs=0)
    assert out["grad_max_abs_diff"] < 1e-13 and out["param_max_abs_diff"] < 1e-13
