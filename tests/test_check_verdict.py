"""``run --check`` as a gate (``runtime/check.py``): a pass/fail verdict against a stated
tolerance with exit 1 on failure, and layers it cannot judge (dropout, any layer drawing
random numbers) named before the run.

The failing case is real, not forced: BatchNorm normalises each microbatch by its own
statistics, so a pipeline (4 microbatches) and the unsplit model (one batch) compute other
gradients, which the check must catch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.runtime.check import (
    check_tolerance,
    dropout_off,
    random_layers,
    refuse_random,
    verdict,
)

MODELS = textwrap.dedent('''
    import torch
    from torch import nn

    def _mlp(*middle):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), *middle, nn.Linear(8, 8), nn.Tanh(),
                             nn.Linear(8, 4))

    def batchnorm():      # per-microbatch statistics: not the unsplit model's
        return _mlp(nn.BatchNorm1d(8))

    def dropout():
        return _mlp(nn.Dropout(0.1))

    class Noise(nn.Module):
        def forward(self, x):
            return x + 0.01 * torch.rand_like(x)

    def noisy():
        return _mlp(Noise())
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("check") / "models.py"
    path.write_text(MODELS)
    return path


def own(models, name: str) -> list[str]:
    """``--model`` flags of one of MODELS (5 layers: cut after the second)."""
    return ["--model", f"{models}:{name}", "--input-shape", "4", "--boundaries", "2"]


def run(capsys, *args):
    rc = main(["run", "--local", "--warmup", "0", "--repeat", "1", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- the verdict ---------------------------------------------------------------------------
def test_the_tolerance_follows_the_dtype_unless_given():
    assert check_tolerance(None, "float32") == 1e-5
    assert check_tolerance(None, "float64") == 1e-10
    assert check_tolerance(1e-3, "float64") == 1e-3
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(UserError, match="^check_tol must be a finite number > 0"):
            check_tolerance(bad, "float32")


def test_a_verdict_passes_only_within_the_tolerance():
    assert verdict({"gradients": 1e-5, "loss": 0.0}, "float32").passed  # <= passes
    v = verdict({"gradients": 2e-5, "loss": 1e-9}, "float32")
    assert not v.passed and v.failed == ["gradients"]
    assert "FAIL against tolerance 1e-05" in v.line() and "gradients 2e-05 > 1e-05" in v.line()
    assert not verdict({"loss": math.nan}, "float64").passed  # NaN is not within anything
    v = verdict({"gradients": 1e-12, "loss": 0.0}, "float64", tolerance=1e-13)
    assert v.failed == ["gradients"] and "--check-tol" in v.line()


def test_parameters_are_judged_in_float64_and_shown_in_float32():
    assert not verdict({"parameters": 1e-3}, "float64").passed
    v = verdict({"gradients": 1e-7, "parameters": 1e-3}, "float32")
    assert v.passed and v.shown == ["parameters"] and "not judged in float32" in v.line()


# ---- layers the check cannot judge ------------------------------------------------------------
def test_dropout_is_named_with_its_rate_and_a_random_layer_by_its_draws(models):
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_models", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    layers = list(mod.dropout())
    names = [f"layers.{i}" for i in range(len(layers))]
    found = random_layers(layers, names, torch.randn(2, 4))
    assert [(r.layer, r.p) for r in found] == [("layers.1", 0.1)]
    with pytest.raises(UserError, match=r"^dropout p=0.1 in layer layers.1: the check cannot be "
                                        r"exact; set it to 0 or pass check_dropout off$"):
        refuse_random(found)
    assert dropout_off(layers) == 1 and layers[1].p == 0.0
    assert random_layers(layers, names, torch.randn(2, 4)) == []
    noisy = list(mod.noisy())  # no dropout module: found because its forward draws
    found = random_layers(noisy, names, torch.randn(2, 4))
    assert [(r.layer, r.p) for r in found] == [("layers.1", None)]
    assert "draws random numbers" in found[0].describe()
    state = torch.get_rng_state()
    random_layers(noisy, names, torch.randn(2, 4))
    assert not torch.equal(state, torch.get_rng_state())  # randn drew; the layers did not:
    state = torch.get_rng_state()
    random_layers(noisy, names, torch.ones(2, 4))
    assert torch.equal(state, torch.get_rng_state())  # the generator is restored


def test_an_attention_dropout_rate_is_found_by_name():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_dropout = 0.1  # used as F.scaled_dot_product_attention(dropout_p=)

    layer = nn.Sequential(Attention())
    assert [(r.where, r.p) for r in random_layers([layer], ["model.layers.0"])] == \
        [("0.attention_dropout", 0.1)]
    dropout_off([layer])
    assert layer[0].attention_dropout == 0.0


# ---- the command ---------------------------------------------------------------------------
def test_a_passing_check_prints_its_verdict_and_tolerance(capsys):
    rc, out, _ = run(capsys, "--schedule", "zb-h1", "-p", "2", "-m", "4", "--width", "16",
                     "--check")
    assert rc == 0 and "check: PASS against tolerance 1e-05 (relative; float32" in out


@pytest.mark.parametrize("steps", ["1", "3"])
def test_a_failing_check_exits_1_for_one_step_and_for_training(models, capsys, steps):
    rc, out, _ = run(capsys, *own(models, "batchnorm"),
                     "--schedule", "1f1b", "-p", "2", "-m", "4", "--batch", "16", "--steps",
                     steps, "--check", "--json")
    report = json.loads(out)
    assert rc == 1 and report["check"]["passed"] is False
    assert "gradients" in report["check"]["failed"]
    assert report["check"]["relative"]["gradients"] > 1e-3  # not rounding: other statistics
    # a loose tolerance, set by the flag, lets it pass
    rc, out, _ = run(capsys, *own(models, "batchnorm"),
                     "--schedule", "1f1b", "-p", "2", "-m", "4", "--batch", "16", "--steps",
                     steps, "--check", "--check-tol", "1", "--json")
    assert rc == 0 and json.loads(out)["check"]["tolerance"] == 1.0


def test_float64_is_judged_at_1e_10(capsys):
    rc, out, _ = run(capsys, "--schedule", "zbv", "-p", "2", "-m", "4", "--width", "16",
                     "--steps", "3", "--dtype", "float64", "--check", "--json")
    check = json.loads(out)["check"]
    assert rc == 0 and check["tolerance"] == 1e-10 and check["not_judged"] == []
    assert set(check["relative"]) == {"gradients", "loss", "parameters"}


def test_dropout_is_refused_by_name_unless_switched_off(models, capsys):
    args = [*own(models, "dropout"), "--schedule", "1f1b", "-p", "2", "-m", "2", "--check"]
    rc, _, err = run(capsys, *args)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "dropout p=0.1 in layer 1: the check cannot be exact; set it to 0 or pass " \
           "--check-dropout off" in err  # an nn.Sequential's layers are named 0, 1, ...
    rc, out, _ = run(capsys, *args, "--check-dropout", "off", "--json")
    report = json.loads(out)
    assert rc == 0 and report["check"]["passed"]
    rc, _, err = run(capsys, *own(models, "noisy"), "--schedule", "1f1b", "-p", "2", "-m", "2",
                     "--check", "--check-dropout", "off")
    assert rc == 2 and "layer 1 draws random numbers in its forward" in err


def test_check_flags_without_check_or_out_of_range_are_one_line(capsys):
    rc, _, err = run(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--check-dropout",
                     "off")
    assert rc == 2 and "--check-dropout applies to --check only" in err
    rc = main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--check",
               "--check-tol", "0"])
    assert rc == 2 and "--check-tol" in capsys.readouterr().err


@pytest.mark.slow
def test_gpt2s_default_dropout_is_named_and_off_makes_the_check_exact(capsys, tmp_path):
    tf = pytest.importorskip("transformers")
    tf.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                  bos_token_id=0, eos_token_id=0).save_pretrained(tmp_path)  # dropout 0.1
    args = ["--model", f"hf:{tmp_path}", "--seq", "8", "--schedule", "1f1b", "-p", "2", "-m",
            "2", "--check"]
    rc, _, err = run(capsys, *args)
    assert rc == 2 and "dropout p=0.1 in layer transformer.wte+transformer.wpe (dropout)" in err
    rc, out, _ = run(capsys, *args, "--check-dropout", "off", "--json")
    assert rc == 0 and json.loads(out)["check"]["passed"]


@pytest.mark.slow
@pytest.mark.distributed
def test_over_gloo_a_failing_check_exits_1_after_a_complete_run(models):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [p for p in [os.environ.get("PYTHONPATH"), *sys.path] if p])}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run",
                           *own(models, "batchnorm"), "--schedule", "1f1b", "-p", "2", "-m",
                           "4", "--batch", "16", "--steps", "2", "--check", "--warmup", "0",
                           "--repeat", "1"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "check: FAIL against tolerance 1e-05" in proc.stdout
    assert "exited" not in proc.stderr and "stopped" not in proc.stderr  # no rank crashed
