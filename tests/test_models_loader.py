"""``--model SPEC``: your own model by file, module or HuggingFace config, and every way to
get it wrong (one line, exit 2)."""

from __future__ import annotations

import copy
import json
import sys
import textwrap

import pytest
import torch
from torch import nn

from pipebubble import get_schedule
from pipebubble.errors import UserError
from pipebubble.models.loader import check_layers, load_model, parse_model_args, parse_value
from pipebubble.runtime.local import run_local
from pipebubble.runtime.stages import split_stages

MODEL_FILE = '''
import torch
from torch import nn
from pipebubble import ModelSpec


def build(layers: int = 3, width: int = 8, relu: bool = False):
    """A ModelSpec of its own: an MLP with a loss of its own (L1)."""
    mods = [nn.Sequential(nn.Linear(width, width), nn.ReLU() if relu else nn.Tanh())
            for _ in range(layers)]

    def make_batch(n, gen):
        return torch.randn(n, width, generator=gen), torch.randn(n, width, generator=gen)

    return ModelSpec("mine", mods, make_batch, nn.functional.l1_loss)


def seq():
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 4))


class GPT(nn.Module):
    """A GPT-style block with nn.MultiheadAttention (causal)."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        h = self.ln(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(x)


def gpt():
    return nn.Sequential(nn.Embedding(50, 16), GPT(), GPT(), nn.Linear(16, 50))


def mismatch():
    return nn.Sequential(nn.Linear(6, 12), nn.Linear(10, 4))


def raises():
    raise ValueError("no GPU\\nfound here")


def wrong():
    return 42


def module():
    return GPT()


sequential_object = nn.Sequential(nn.Linear(6, 6))
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(MODEL_FILE))
    return path


def test_parse_value_and_model_args():
    assert [parse_value(v) for v in ("3", "-2", "1e-3", "True", "no")] == [3, -2, 1e-3, True,
                                                                          "no"]
    assert parse_model_args(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    for bad in (["a"], ["1a=2"], ["a=1", "a=2"]):
        with pytest.raises(UserError, match="^model_args"):
            parse_model_args(bad)


def test_a_file_function_gets_its_arguments_parsed(model_file):
    spec = load_model(f"{model_file}:build", {"layers": "5", "relu": "true"})
    assert spec.name == "mine" and len(spec.layers) == 5
    assert isinstance(spec.layers[0][1], nn.ReLU)
    a = load_model(f"{model_file}:build", seed=7)
    b = load_model(f"{model_file}:build", seed=7)  # every rank builds the same model
    assert torch.equal(a.layers[0][0].weight, b.layers[0][0].weight)


def test_a_module_path_and_the_builtins_resolve():
    spec = load_model("pipebubble.models:mlp", {"layers": "2", "width": "4"})
    assert len(spec.layers) == 2 and spec.layers[0].linear.in_features == 4
    assert len(load_model("mlp", {"layers": 3}).layers) == 3


def test_an_nn_sequential_takes_its_input_from_the_flags(model_file):
    spec = load_model(f"{model_file}:seq", input_shape="6")
    assert spec.layer_names() == ["0", "1", "2"]
    x, y = spec.make_batch(5, torch.Generator().manual_seed(0))
    assert x.shape == (5, 6) and y.shape == (5, 4)  # targets shaped like the output
    assert "mean squared error" in spec.description
    with pytest.raises(UserError, match="give input_shape"):
        load_model(f"{model_file}:seq")
    obj = load_model(f"{model_file}:sequential_object", input_shape=[6])
    assert len(obj.layers) == 1


def test_a_gpt_style_sequential_with_token_ids_runs_split_backward_exactly(model_file):
    spec = load_model(f"{model_file}:gpt", input_shape="5", input_dtype="int64")
    assert spec.layer_roles() == ["embedding", "layer", "layer", "layer"]
    layers = [m.double() for m in spec.layers]
    ref = copy.deepcopy(nn.Sequential(*layers))
    x, _ = spec.make_batch(4, torch.Generator().manual_seed(1))
    y = torch.randn(4, 5, 50, dtype=torch.float64)
    nn.functional.mse_loss(ref(x), y).backward()
    mods = split_stages(layers, 2, [2])  # embedding + block | block + head
    run_local(get_schedule("zb-h1", 2, 4), mods, x, y, spec.loss_fn)
    for p, q in zip([p for m in mods for p in m.parameters()], ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12)


def test_a_function_returning_a_huggingface_model(tmp_path):
    tf = pytest.importorskip("transformers")
    path = tmp_path / "hfmodel.py"
    path.write_text(textwrap.dedent('''
        import transformers as tf
        def build(layers=2):
            c = tf.LlamaConfig(vocab_size=30, hidden_size=8, intermediate_size=16,
                               num_hidden_layers=layers, num_attention_heads=2)
            return tf.LlamaForCausalLM(c)
    '''))
    spec = load_model(f"{path}:build", {"layers": "3"}, seq=6)
    assert spec.layer_names()[1:4] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert tf is not None


@pytest.mark.parametrize("spec_tail, args, pattern", [
    (":missing", {}, r"has no 'missing'; it defines build, gpt, .*seq"),
    (":build", {"depth": "3"}, r"model_args depth: not a parameter of .*valid are layers, "
                               "width, relu"),
    (":raises", {}, r"raised ValueError: no GPU found here$"),
    (":wrong", {}, r"gave a int; it must give a pipebubble.ModelSpec, an nn.Sequential"),
    (":module", {}, r"gave a GPT; .*other than nn.Sequential"),
    (":sequential_object", {"a": "1"}, r"model_args needs a function"),
])
def test_bad_specs_name_the_value_and_what_is_valid(model_file, spec_tail, args, pattern):
    with pytest.raises(UserError, match=pattern) as err:
        load_model(f"{model_file}{spec_tail}", args, input_shape="6")
    assert "\n" not in str(err.value)


def test_missing_file_module_and_a_bare_file_name(tmp_path, model_file):
    with pytest.raises(UserError, match="does not exist"):
        load_model(f"{tmp_path}/nope.py:build")
    with pytest.raises(UserError, match="no module 'no_such_pkg_xyz.mod'"):
        load_model("no_such_pkg_xyz.mod:build")
    with pytest.raises(UserError, match=r"say which object builds the model, e.g. .*:build "
                                        r"\(the file defines build, seq, gpt"):
        load_model(str(model_file))
    with pytest.raises(UserError, match="unknown model 'resnet'; valid are mlp"):
        load_model("resnet")


def test_a_shape_mismatch_names_the_layers_and_the_stages(model_file):
    with pytest.raises(UserError, match=r"layer 1 \('1'\) cannot take the output of layer 0 "
                                        r"\('0'\), shape \(2, 12\)"):
        load_model(f"{model_file}:mismatch", input_shape="6")
    spec = load_model(f"{model_file}:mismatch", input_shape="6", check=False)
    with pytest.raises(UserError, match=r"\(between stage 0 and stage 1\)"):
        check_layers(spec, [1])


def _one_error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1, err
    assert lines[0].startswith("pipebubble: error: ")
    return lines[0]


@pytest.mark.parametrize("command", ["profile", "partition", "run"])
def test_every_command_says_bad_models_in_one_line(run_cli, model_file, tmp_path, command):
    extra = {"profile": [], "partition": ["--ranks", "2"],
             "run": ["--local", "--schedule", "1f1b", "-p", "2", "-m", "2"]}[command]
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert"}))
    for spec, more, needle in [
        (f"{model_file}:raises", [], "raised ValueError: no GPU found here"),
        (f"{model_file}:build", ["--model-arg", "depth=2"], "not a parameter"),
        (f"{model_file}:mismatch", ["--input-shape", "6"], "cannot take the output"),
        (f"{tmp_path}/bert.json".join(["hf:", ""]), [], "model type 'bert'"),
        (f"{tmp_path}/none.py:build", [], "does not exist"),
    ]:
        rc, out, err = run_cli(command, "--model", spec, *more, *extra)
        assert rc == 2, (spec, err)
        assert needle in _one_error_line(err)


def test_builtin_only_flags_are_refused_for_your_model(run_cli, model_file):
    rc, _, err = run_cli("run", "--local", "--schedule", "1f1b", "--model", f"{model_file}:build",
                         "--layers", "4",
                         "-p", "2", "-m", "2")
    assert rc == 2 and "--layers apply to the built-in models" in _one_error_line(err)
    rc, _, err = run_cli("profile", "--model", "mlp", "--model-arg", "layers=2")
    assert rc == 2 and "not the built-in mlp" in _one_error_line(err)


def test_run_local_on_a_file_model_checks_against_the_unsplit_model(run_cli, model_file):
    rc, out, err = run_cli("run", "--local", "--model", f"{model_file}:build", "--model-arg",
                           "layers=4", "--schedule", "zb-h1", "-p", "2", "-m", "4", "--check",
                           "--json", "--repeat", "1", "--warmup", "0")
    assert rc == 0, err
    report = json.loads(out)
    assert report["grad_max_abs_diff"] < 1e-5


def test_profile_and_partition_use_the_model_names(run_cli, model_file, tmp_path):
    out_file = tmp_path / "p.json"
    rc, _, err = run_cli("profile", "--model", f"{model_file}:seq", "--input-shape", "6",
                         "--repeats", "1", "--warmup", "0", "--out", out_file, "--json")
    assert rc == 0, err
    prof = json.loads(out_file.read_text())
    assert [x["name"] for x in prof["layers"]] == ["0", "1", "2"]
    rc, out, err = run_cli("partition", "--model", f"{model_file}:build", "--ranks", "3",
                           "--method", "uniform", "--json", "--batch", "2")
    assert rc == 0, err
    stages = json.loads(out)[0]["stages"]
    assert [(st["first_layer"], st["last_layer"]) for st in stages] == [(0, 0), (1, 1), (2, 2)]
    assert "pipebubble_user_model" in " ".join(sys.modules)  # imported once, by path


def test_partition_rebalances_a_measured_run_of_your_model(run_cli, model_file, tmp_path):
    model = ["--model", f"{model_file}:build", "--model-arg", "layers=4"]
    rc, out, err = run_cli("run", "--local", *model, "--schedule", "1f1b", "-p", "2", "-m", "4",
                           "--boundaries", "1", "--json", "--repeat", "1", "--warmup", "0")
    assert rc == 0, err
    timeline = tmp_path / "timeline.json"
    timeline.write_text(out)
    rc, out, err = run_cli("partition", *model, "--ranks", "2", "--measured", timeline,
                           "--current-cut", "0-0,1-3", "--json", "--batch", "2")
    assert rc == 0, err
    before, after = json.loads(out)
    assert [(s["first_layer"], s["last_layer"]) for s in before["stages"]] == [(0, 0), (1, 3)]
    assert after["predicted_step_time"] <= before["predicted_step_time"]


@pytest.mark.slow
@pytest.mark.distributed
def test_plan_validate_runs_the_plan_on_your_model(run_cli, model_file, tmp_path):
    model = ["--model", f"{model_file}:build", "--model-arg", "layers=4"]
    prof = tmp_path / "p.json"
    rc, _, err = run_cli("profile", *model, "--batch", "2", "--repeats", "1", "--out", prof,
                         "--json")
    assert rc == 0, err
    rc, out, err = run_cli("plan", "--profile", prof, "--gpus", "2", "--global-batch", "8",
                           "--microbatch-size", "2", "--schedules", "1f1b", "--validate", "1",
                           *model, "--max-processes", "2", "--json")
    assert rc in (0, 1), err  # 1: the verdict FAIL (a loaded machine may miss the prediction)
    assert rc == (0 if json.loads(out)["validation"]["passed"] else 1)
    v = json.loads(out)["plans"][0]["validation"]
    assert v["error"] is None and v["measured_scaled"] > 0 and v["scale"] == 1.0, v
    rc, _, err = run_cli("plan", "--profile", prof, "--gpus", "2", "--global-batch", "8",
                         "--validate", "1", "--model", f"{model_file}:build", "--model-arg",
                         "layers=6")
    assert rc == 2 and "has 6 layers but the profile has 4" in err


def test_a_model_file_imports_its_neighbours_and_a_failing_import_is_one_line(tmp_path):
    (tmp_path / "blocks.py").write_text("from torch import nn\nWIDTH = 5\n")
    (tmp_path / "net.py").write_text(textwrap.dedent('''
        from torch import nn
        import blocks
        def build():
            return nn.Sequential(nn.Linear(blocks.WIDTH, 3))
    '''))
    (tmp_path / "broken.py").write_text("import no_such_module_xyz\n")
    spec = load_model(f"{tmp_path}/net.py:build", input_shape="5")
    assert spec.layers[0].in_features == 5
    with pytest.raises(UserError, match=r"importing .*broken.py raised ModuleNotFoundError: "
                                        r"No module named 'no_such_module_xyz'$"):
        load_model(f"{tmp_path}/broken.py:build")
