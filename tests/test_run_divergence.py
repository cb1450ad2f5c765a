"""A diverging run (``--lr 1000``) is a failed run whose results survive: ``--json`` keeps every
figure, shows each loss that is not a finite number as ``null`` and names the first such step
in ``diverged_at_step``; the table says it too; both exit 1 (not 2: the input was valid)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from pipebubble.commands._run_setup import RunReport, diverged_at, diverged_line

# SGD at lr 1000 on the small MLP: the loss overflows within a few steps (deterministic: the
# same seed, the same batches, the same weights)
DIVERGING = ["--schedule", "1f1b", "-p", "2", "-m", "2", "--warmup", "0",
             "--repeat", "1", "--steps", "6", "--optimizer", "sgd", "--lr", "1000"]


def _check_diverged(got: dict) -> int:
    step = got["diverged_at_step"]
    losses = got["losses"]
    assert isinstance(step, int) and 0 < step < len(losses)
    assert all(isinstance(v, float) and math.isfinite(v) for v in losses[:step])
    assert losses[step] is None and got["loss"] is None  # the last step's loss: diverged too
    assert got["train"]["steps"] == 6 and got["train"]["lr"] == 1000
    # every other figure is kept: the measured and predicted timelines, memory
    assert got["step_time"] > 0 and 0 <= got["bubble_fraction"] < 1
    assert got["predicted"]["step_time"] > 0 and len(got["peak_activation_bytes"]) == 2
    return step


def test_json_keeps_the_figures_and_names_the_step_the_loss_diverged(run_cli):
    rc, out, err = run_cli("run", "--local", *DIVERGING, "--json")
    assert rc == 1
    step = _check_diverged(json.loads(out))
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"pipebubble: error: training diverged: the loss is {lines[0].split()[7]} "
                     f"at step {step} (a learning rate too large for the model? try a smaller "
                     "--lr); the run's other figures are kept"]


def test_the_table_says_it_diverged_and_exits_1(run_cli):
    rc, out, err = run_cli("run", "--local", *DIVERGING)
    assert rc == 1
    assert "training diverged: the loss is" in out and "step 5: loss nan" in out
    assert "training diverged" in err and "Traceback" not in err


def test_a_run_that_converges_says_null_and_exits_0(run_cli):
    rc, out, _ = run_cli("run", "--local", *DIVERGING[:-2], "--lr", "0.01", "--json")
    assert rc == 0
    got = json.loads(out)
    assert got["diverged_at_step"] is None and all(math.isfinite(v) for v in got["losses"])


def test_the_first_non_finite_loss_counts_from_the_resumed_step():
    report = RunReport(None, None, None, None, float("nan"), [],
                       losses=[1.0, float("inf"), float("nan")], train={"first_step": 10})
    assert diverged_at(report) == 11
    assert "the loss is inf at step 11" in diverged_line(report)
    report.losses = [1.0, 0.5]
    assert diverged_at(report) is None and diverged_line(report) is None


@pytest.mark.slow
@pytest.mark.distributed
def test_a_distributed_run_that_diverges_reports_once_and_exits_1():
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", *DIVERGING, "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr
    got = json.loads(proc.stdout)
    assert got["world_size"] == 2
    _check_diverged(got)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "training diverged" in lines[0], proc.stderr
