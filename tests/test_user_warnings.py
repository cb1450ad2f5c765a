"""A warning torch raises in the user's model code (``mse_loss`` with mismatched sizes warns
with ``stacklevel=2``, so it names the user's file, or pipebubble's FLOP counter) is held:
after the result on success, dropped when the command then fails, whose error stays one line.
"""

from __future__ import annotations

import textwrap
import warnings

import pytest

MODEL = textwrap.dedent('''
    import torch
    from torch import nn
    from pipebubble import ModelSpec

    WIDTH = {width}

    def build():
        layers = [nn.Linear(4, 4), nn.Linear(4, WIDTH)]

        def make_batch(n, g):
            return torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)

        def loss(out, target):  # (n, 1) against (n, 4) broadcasts; (n, 8) fails
            return nn.functional.mse_loss(out, target)

        return ModelSpec("warns", layers, make_batch, loss)
''')
WARNING = "UserWarning: Using a target size (torch.Size([2, 4])) that is different"


@pytest.mark.parametrize("command", [
    ["profile", "--batch", "2", "--warmup", "0", "--repeats", "1", "--json"],
    ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "4", "--warmup",
     "0", "--repeat", "1", "--json"],
])
def test_a_failing_model_is_one_line_without_the_warning(run_cli, tmp_path, command):
    (tmp_path / "m.py").write_text(MODEL.format(width=8))
    with warnings.catch_warnings(record=True) as escaped:  # what would print before the line
        warnings.simplefilter("always")
        rc, _, err = run_cli(command[0], "--model", f"{tmp_path}/m.py:build", *command[1:])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("pipebubble: error: ")
    assert "loss" in err and "Warning" not in err
    assert [str(w.message) for w in escaped] == []


def test_a_working_model_shows_the_warning_after_its_result(run_cli, tmp_path):
    (tmp_path / "m.py").write_text(MODEL.format(width=1))
    rc, out, err = run_cli("profile", "--model", f"{tmp_path}/m.py:build", "--batch", "2",
                           "--warmup", "0", "--repeats", "1", "--json")
    assert rc == 0 and out.startswith("{")
    lines = err.splitlines()
    assert lines and all(line.startswith("pipebubble: warning: ") for line in lines), lines
    assert any(WARNING in line and "(m.py)" in line for line in lines), lines
