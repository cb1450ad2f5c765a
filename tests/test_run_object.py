"""The run object (runtime/run.py): RunConfig in, Run's set-up, batches, training, verdict.

The command line is a thin layer over it: the same config gives the CLI's figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from pipebubble import get_schedule
from pipebubble.cli import main
from pipebubble.runtime.dist.worker import RankRun, Worker
from pipebubble.runtime.run import Run, RunConfig
from pipebubble.runtime.torch_engine import TorchWorker
from pipebubble.runtime.train import step_batch

DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"


def test_the_design_docs_example_runs(capsys):
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("## A run: `RunConfig` and `Run`"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "docs/design.md", "exec"), {})  # noqa: S102 - our own docs
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "cut --boundaries 3 (balanced by FLOPs)"
    losses, ref = json.loads(out[1]), json.loads(out[2])
    assert len(losses) == 3 and max(abs(a - b) for a, b in zip(losses, ref, strict=True)) < 1e-12
    assert out[3].startswith("check: PASS")


def test_the_command_line_is_the_same_run(capsys):
    flags = ["--schedule", "zb-h1", "-p", "2", "-m", "4", "--layers", "5", "--width", "8",
             "--steps", "2", "--optimizer", "sgd", "--lr", "0.05", "--seed", "3",
             "--warmup", "0", "--repeat", "1"]
    assert main(["run", "--local", "--json", *flags]) == 0
    cli = json.loads(capsys.readouterr().out)
    run = Run(RunConfig(get_schedule("zb-h1", 2, 4), model_args={"layers": 5, "width": 8},
                        steps=2, optimizer="sgd", lr=0.05, seed=3, warmup=0, repeat=1))
    trained = run.train()
    assert trained.losses == pytest.approx(cli["losses"], rel=1e-10)  # JSON: 12 digits
    assert run.setup.boundaries == cli["boundaries"] and run.setup.cut_by == cli["cut_by"]
    assert trained.summary == cli["train"]


def test_one_batch_seeding_for_every_replica_count():
    run = Run(RunConfig(get_schedule("1f1b", 2, 2), model_args={"layers": 2, "width": 4},
                        batch=4, seed=7))
    x0, y0 = run.batch(0)
    assert torch.equal(x0, run.setup.inputs) and torch.equal(y0, run.setup.targets)
    xg, _ = run.batch(5, dp=2)  # the global batch of step 5: both replicas' samples
    want, _ = step_batch(run.setup.spec.make_batch, 8, 7, 5)
    assert xg.shape[0] == 8 and torch.equal(xg, want)


def test_torch_engine_shares_the_set_up_not_our_transport():
    # TorchWorker runs torch's own sends and receives: it is a RankRun, not our Worker
    assert issubclass(TorchWorker, RankRun) and not issubclass(TorchWorker, Worker)
    assert "transport" not in TorchWorker.__init__.__code__.co_names
