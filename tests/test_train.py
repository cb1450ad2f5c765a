"""Training (``run --steps N --optimizer --lr``): the pipeline trains exactly as the unsplit
model does, step after step, for every schedule family and on both executors.

The reference here is written out by hand (an ``nn.Sequential`` of the same seeded layers,
torch's own AdamW/SGD, the batches of the documented data stream), not the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.models import mlp, transformer
from pipebubble.runtime.train import step_batch, step_generator

SMALL = ["--width", "16", "--warmup", "0"]


def run_json(capsys, *args):
    assert main(["run", "--local", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def hand_reference(spec, steps, batch, seed, optimizer="adamw", lr=1e-3, dtype=torch.float64):
    """The unsplit model trained by torch alone, on the documented batches."""
    model = nn.Sequential(*spec.layers).to(dtype)
    opt = (torch.optim.AdamW(model.parameters(), lr=lr) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=lr))
    losses = []
    for k in range(steps):
        x, y = spec.make_batch(batch, step_generator(seed, k))
        opt.zero_grad()
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("schedule,extra", [
    ("gpipe", []), ("1f1b", []), ("interleaved-1f1b", ["--chunks", "2"]),
    ("zb-h1", []),  # split backward: I then W
    ("zbv", []),  # V placement, split backward
    ("dualpipe", []),  # two model copies whose gradients are summed
])
def test_training_equals_unsplit_float64(capsys, schedule, extra):
    out = run_json(capsys, "--schedule", schedule, "-p", "2", "-m", "4", "--steps", "3",
                   "--optimizer", "adamw", "--lr", "0.01", "--dtype", "float64", "--check",
                   "--layers", "8", *extra, *SMALL)
    torch.set_default_dtype(torch.float64)
    try:
        ref, _ = hand_reference(mlp(layers=8, width=16, seed=0), 3, 32, 0, lr=0.01)
    finally:
        torch.set_default_dtype(torch.float32)
    assert len(out["losses"]) == 3
    assert out["losses"] == pytest.approx(ref, abs=1e-9)
    assert out["reference_losses"] == pytest.approx(ref, abs=1e-9)
    assert out["param_max_abs_diff"] < 1e-9
    assert out["grad_max_abs_diff"] < 1e-9
    assert out["losses"][0] != out["losses"][1]  # a fresh batch and new weights each step
    assert out["train"] == {"steps": 3, "first_step": 0, "optimizer": "adamw", "lr": 0.01,
                            "saved_to": None, "resumed_from": None}


def test_training_float32_transformer_sgd(capsys):
    out = run_json(capsys, "--schedule", "zb-h2", "-p", "2", "-m", "4", "--steps", "3",
                   "--model", "transformer", "--layers", "2", "--vocab", "64", "--seq", "8",
                   "--optimizer", "sgd", "--lr", "0.5", "--check", *SMALL)
    assert max(abs(a - b) for a, b in zip(out["losses"], out["reference_losses"],
                                          strict=True)) < 1e-5
    assert out["param_max_abs_diff"] < 1e-5
    ref, _ = hand_reference(transformer(layers=2, dim=16, vocab=64, seq=8), 3, 32, 0,
                            optimizer="sgd", lr=0.5, dtype=torch.float32)
    assert out["losses"] == pytest.approx(ref, abs=1e-5)


def test_lr_zero_changes_nothing_but_the_batch(capsys):
    """With lr 0 the weights stay put: step k's loss is the untrained model's on batch k."""
    out = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "3",
                   "--optimizer", "sgd", "--lr", "0", *SMALL)
    spec = mlp(layers=4, width=16, seed=0)
    model = nn.Sequential(*spec.layers)
    with torch.no_grad():
        want = [spec.loss_fn(model(x), y).item()
                for x, y in (step_batch(spec.make_batch, 16, 0, k) for k in range(3))]
    assert out["losses"] == pytest.approx(want, abs=1e-6)


def test_step_batches_are_seeded_and_distinct():
    spec = mlp(layers=1, width=4)
    a = step_batch(spec.make_batch, 8, 3, 2)
    b = step_batch(spec.make_batch, 8, 3, 2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    seen = {tuple(step_batch(spec.make_batch, 2, s, k)[0].flatten().tolist())
            for s in range(4) for k in range(4)}
    assert len(seen) == 16  # no two (seed, step) pairs share a batch
    # step 0 is the batch a one-step run has always used (seed + 1)
    x0, _ = spec.make_batch(8, torch.Generator().manual_seed(4))
    assert torch.equal(step_batch(spec.make_batch, 8, 3, 0)[0], x0)


def test_one_step_default_is_the_fastest_of_three(capsys):
    out = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", *SMALL)
    assert len(out["step_times"]) == 3 and len(out["losses"]) == 1
    out = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "4",
                   *SMALL)
    assert len(out["step_times"]) == 4 and len(out["losses"]) == 4


def test_terminal_report_has_a_line_per_step(capsys):
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps",
                 "3", "--check", "--chart-width", "60", *SMALL]) == 0
    text = capsys.readouterr().out
    for k in range(3):
        assert f"step {k}: loss" in text
    assert "largest parameter difference" in text


@pytest.mark.parametrize("argv,needle", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--lr", "-0.1"], "--lr must be a number in [0, 1000]"),
    (["--lr", "nan"], "--lr"),
    (["--optimizer", "lion"], "invalid choice"),
])
def test_bad_training_flags(capsys, argv, needle):
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("pipebubble: error:")


@pytest.mark.distributed
@pytest.mark.parametrize("extra", [["--schedule", "dualpipe"],  # V placement, two copies
                                   ["--schedule", "1f1b", "--dp", "2"]])
def test_distributed_training_equals_unsplit(extra):
    """Two ranks over gloo (four with --dp 2): the optimizer steps on every rank after the
    gradients are complete (model copies summed, replicas all-reduced)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", *extra, "-p", "2", "-m", "4", "--steps",
         "3", "--check", "--dtype", "float64", "--width", "16", "--layers", "8",
         "--warmup", "0", "--json"],
        capture_output=True, text=True, timeout=170, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    dp = 2 if "--dp" in extra else 1
    torch.set_default_dtype(torch.float64)
    try:
        ref, _ = hand_reference(mlp(layers=8, width=16, seed=0), 3, 32 * dp, 0)
    finally:
        torch.set_default_dtype(torch.float32)
    assert out["losses"] == pytest.approx(ref, abs=1e-9)
    assert out["reference_losses"] == pytest.approx(ref, abs=1e-9)
    assert out["param_max_abs_diff"] < 1e-9 and out["grad_max_abs_diff"] < 1e-9
