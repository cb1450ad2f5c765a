"""``profile --model FILE:NAME``: a layer's own failure while profiling is one line naming it.

Found by the generated fuzz (tests/fuzz_cases.py, the spec surface): a layer raising on its
third forward call, or calling ``sys.exit``, ended ``profile`` in a traceback, where ``run``
already named the layer (``pipebubble.usercode``).
"""

from __future__ import annotations

import textwrap

import pytest

MODEL = '''
import sys

import torch
from torch import nn
from pipebubble import ModelSpec


class Fails(nn.Module):
    """Its ``at``-th forward raises (a message over two lines) or exits."""

    def __init__(self, at, exit=False):
        super().__init__()
        self.lin, self.at, self.calls, self.exit = nn.Linear(4, 4), at, 0, exit

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            if self.exit == "none":
                return None
            if self.exit:
                sys.exit(7)
            raise ValueError("bad\\nwidth")
        return self.lin(x)


def build(at: int = 3, exit: bool | str = False, talk: bool = False):
    if talk:
        print("the builder talks")

    def batch(n, g):
        if talk:
            print("so does make_batch")
        return torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)
    return ModelSpec("pf", [nn.Linear(4, 4), Fails(at, exit), nn.Linear(4, 4)], batch,
                     nn.functional.mse_loss)
'''
PROFILE = ["profile", "--batch", "2", "--warmup", "0", "--repeats", "1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "pf.py"
    path.write_text(textwrap.dedent(MODEL))
    return f"{path}:build"


@pytest.mark.parametrize(("args", "cause"), [
    ([], "ValueError: bad width"),
    (["--model-arg", "exit=true"], "SystemExit (exit code 7)"),
])
def test_a_failing_layer_is_one_line_naming_it(run_cli, model, args, cause):
    rc, out, err = run_cli(*PROFILE, "--model", model, *args)
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"pipebubble: error: model 'pf': layer 1 ('1', Fails) raised {cause} during profiling"]


def test_a_layer_that_does_not_fail_is_profiled(run_cli, model):
    rc, out, err = run_cli(*PROFILE, "--model", model, "--model-arg", "at=1000", "--json")
    assert rc == 0, err
    assert '"name": "1"' in out


def test_the_model_prints_to_stderr_while_json_owns_stdout(run_cli, model):
    """A model's print() went into profile --json's standard output."""
    import json

    rc, out, err = run_cli(*PROFILE, "--model", model, "--model-arg", "at=1000",
                           "--model-arg", "talk=true", "--json")
    assert rc == 0, err
    assert json.loads(out)["format"] == "pipebubble-profile"
    assert "the builder talks" in err and "so does make_batch" in err


def test_a_layer_returning_no_tensor_is_one_line(run_cli, model):
    """Layer 1 returning None on its 3rd call was a TypeError traceback in profile's own code."""
    rc, out, err = run_cli(*PROFILE, "--model", model, "--model-arg", "exit=none")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "pipebubble: error: layer 1 returned a NoneType, not a tensor; every layer but the "
        "last must return the next layer's input tensor"]
