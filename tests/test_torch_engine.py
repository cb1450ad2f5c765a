"""``run --engine torch`` and ``pipebubble.torch_schedule``: our orders run by torch's own
``_PipelineScheduleRuntime`` (torch is the independent party: its runtime, its stages, its
send/receive lowering), measured into our Timeline, with gradients and training equal to the
unsplit model's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.interop.torch_csv import to_torch_csv
from pipebubble.ir.schedule import step_actions
from pipebubble.models import mlp
from pipebubble.runtime.torch_engine import check_engine, torch_actions
from pipebubble.schedules import get_schedule, schedule_names

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.parametrize("name", [n for n in schedule_names() if n != "dualpipe"])
def test_actions_are_the_csv_cells(name):
    s = get_schedule(name, 2, 4)
    rows = to_torch_csv(s).splitlines()
    got = torch_actions(s)
    assert [",".join(str(a) for a in got[r]) for r in range(2)] == rows
    assert sum(len(v) for v in got.values()) == sum(len(o) for o in s.orders)


def test_two_chains_and_recompute_are_refused(capsys):
    with pytest.raises(Exception, match="two model copies"):
        check_engine(get_schedule("dualpipe", 2, 4))
    for argv, needle in ((["--schedule", "dualpipe"], "use dualpipev"),
                         (["--schedule", "1f1b", "--recompute"], "does not recompute"),
                         (["--schedule", "1f1b", "--local"], "drop --local")):
        assert main(["run", *argv, "-p", "2", "-m", "4", "--engine", "torch"]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and err.startswith("pipebubble: error:")


def _run(*args, timeout=170):
    proc = subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", *args, "--engine", "torch", "--json"],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.distributed
@pytest.mark.parametrize("extra", [
    ["--schedule", "zb-h1"],  # split backward (I, W) in torch's runtime
    ["--schedule", "dualpipev", "--layers", "8"],  # V placement, overlapped F&B pairs
])
def test_torch_engine_trains_like_the_unsplit_model(extra):
    out = _run(*extra, "-p", "2", "-m", "4", "--steps", "3", "--check", "--dtype", "float64",
               "--width", "16", "--warmup", "0")
    assert out["engine"] == "torch"
    assert out["grad_max_abs_diff"] < 1e-9 and out["param_max_abs_diff"] < 1e-9
    assert out["losses"] == pytest.approx(out["reference_losses"], abs=1e-9)
    # the measured Timeline holds every compute action of the order, once, on its rank
    s = get_schedule(extra[1], 2, 4)
    got = sorted((e["rank"], e["stage"], e["kind"], e["microbatch"]) for e in out["events"])
    want = sorted((r, a.stage, a.kind, a.microbatch) for r, order in enumerate(s.orders)
                  for step in order for a in step_actions(step))
    assert got == want
    for r in range(2):  # compute actions on one rank never overlap in time
        ev = sorted((e["start"], e["end"]) for e in out["events"] if e["rank"] == r)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(ev, ev[1:], strict=False))
    assert out["predicted"]["step_time"] > 0 and out["step_time"] > 0


@pytest.mark.distributed
def test_torch_engine_runs_a_csv_and_the_same_batches_as_ours(tmp_path, capsys):
    """A CSV order through torch's runtime gives the losses our runtime gives."""
    csv = tmp_path / "zbv.csv"
    assert main(["export", "--schedule", "zbv", "-p", "2", "-m", "4", "--csv",
                 str(csv)]) == 0
    capsys.readouterr()
    theirs = _run("--csv", str(csv), "--steps", "2", "--dtype", "float64", "--width", "16",
                  "--warmup", "0")
    assert main(["run", "--local", "--csv", str(csv), "--steps", "2", "--dtype", "float64",
                 "--width", "16", "--warmup", "0", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert theirs["losses"] == pytest.approx(ours["losses"], abs=1e-10)


def readme_example() -> str:
    """The Python block under the README's "torch's engine" heading."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### torch's engine"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.distributed
def test_readme_example_runs_and_trains_like_the_unsplit_model(tmp_path):
    code = readme_example()
    assert 10 <= len(code.strip().splitlines()) <= 30
    script = tmp_path / "train_pp.py"
    script.write_text(code)
    launcher = ("import sys; from pipebubble.runtime.dist.launch import launch; "
                f"sys.exit(launch([sys.executable, {str(script)!r}], 2))")
    proc = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [float(v) for v in re.findall(r"step \d: loss ([0-9.]+)", proc.stdout)]
    # the same model trained unsplit by torch alone, on the same batches
    spec = mlp(layers=4, width=32)
    model = nn.Sequential(*spec.layers)
    opt = torch.optim.AdamW(model.parameters())
    want = []
    for step in range(3):
        x, y = spec.make_batch(16, torch.Generator().manual_seed(step))
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    assert got == pytest.approx(want, abs=1e-5)
