"""A new schedule family is one file (docs/new_family.md): register the worked example,
docs/examples/gpipe_lifo.py, and simulate, export, plan and run --local take it like a
built-in family. Its numbers are checked by hand: GPipe-LIFO's bubble is GPipe's,
(p - 1)/(m + p - 1), and its CSV is every rank's forwards in order, then its backwards in
reverse."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipebubble.cli import main
from pipebubble.schedules import lookup, schedule_names
from pipebubble.schedules.registry import unregister

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "docs" / "examples" / "gpipe_lifo.py"


@pytest.fixture
def lifo():
    """The example registered for one test (its module imported from the file), then gone."""
    spec = importlib.util.spec_from_file_location("gpipe_lifo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield "gpipe-lifo"
    finally:
        unregister("gpipe-lifo")


def test_the_doc_shows_the_file_it_talks_about():
    doc = (REPO / "docs" / "new_family.md").read_text(encoding="utf-8")
    assert EXAMPLE.read_text(encoding="utf-8") in doc


def test_simulate_and_export(lifo, capsys, tmp_path):
    assert lifo in schedule_names() and schedule_names()[-1] == "auto"  # a family, auto last
    assert main(["simulate", "--schedule", lifo, "-p", "4", "-m", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bubble_fraction"] == pytest.approx(3 / 11)  # (p - 1)/(m + p - 1)
    assert out["closed_form_bubble"] == pytest.approx(3 / 11)
    assert out["step_time"] == pytest.approx((8 + 4 - 1) * (1 + 2))  # (m + p - 1)(F + B)
    path = tmp_path / "lifo.csv"
    assert main(["export", "--schedule", "lifo", "-p", "2", "-m", "3", "--csv", str(path)]) == 0
    assert path.read_text().split() == ["0F0,0F1,0F2,0B2,0B1,0B0", "1F0,1F1,1F2,1B2,1B1,1B0"]
    assert main(["simulate", "--csv", str(path), "--json"]) == 0  # read back, same order
    back = json.loads(capsys.readouterr().out)
    assert back["step_time"] == pytest.approx((3 + 2 - 1) * (1 + 2))
    assert back["step_time"] == pytest.approx(
        json.loads(_simulate_json(capsys, lifo, 2, 3))["step_time"])


def _simulate_json(capsys, name: str, p: int, m: int) -> str:
    assert main(["simulate", "--schedule", name, "-p", str(p), "-m", str(m), "--json"]) == 0
    return capsys.readouterr().out


def test_plan_searches_it_and_pastes_it(lifo, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the pastes' torch CSV is written where plan runs)
    from pipebubble.plan.analytic import analytic_profile

    profile = tmp_path / "small.json"
    analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000, seq=1024,
                     batch=1, tflops=300, mfu=0.4).save(profile)
    assert main(["plan", "--profile", str(profile), "--gpus", "4", "--gpu-memory", "12GiB",
                 "--global-batch", "16", "--schedules", lifo, "--pp", "2", "--sharding",
                 "fsdp", "--top", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert (plan["schedule"], plan["pp"], plan["chunks"]) == (lifo, 2, 1)
    assert plan["runnable_in"] == ["torchtitan"]  # from its CSV; Megatron-LM has no such
    par = plan["torchtitan"]["parallelism"]
    assert par["pipeline_parallel_schedule"] == "1F1B"  # a class placing stages as it does
    assert "pipeline_parallel_schedule_csv" in par
    assert plan["megatron"] is None
    assert plan["megatron_reason"].endswith(f"not {lifo}")
    assert lookup(lifo).torchtitan is None and lookup(lifo).megatron is None


def test_run_local_checks_its_gradients(lifo, capsys):
    pytest.importorskip("torch")
    assert main(["run", "--local", "--schedule", lifo, "-p", "2", "-m", "4", "--steps", "1",
                 "--json", "--check"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == lifo
    assert out["check"]["passed"] is True


def test_a_module_named_in_the_environment_registers_in_a_fresh_process():
    env = dict(os.environ, PIPEBUBBLE_SCHEDULES="gpipe_lifo, no_such_family_module",
               PYTHONPATH=os.pathsep.join([str(EXAMPLE.parent), str(REPO / "src")]))
    res = subprocess.run([sys.executable, "-m", "pipebubble", "export", "--schedule", "lifo",
                          "-p", "2", "-m", "2", "--csv", "-"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0F0,0F1,0B1,0B0", "1F0,1F1,1B1,1B0"]
    assert res.stderr.strip() == ("pipebubble: PIPEBUBBLE_SCHEDULES names "
                                  "'no_such_family_module', which does not import: "
                                  "ModuleNotFoundError: No module named "
                                  "'no_such_family_module'")
