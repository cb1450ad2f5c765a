"""CLI refusals at the edges: a markers-only CSV, a zero-length timeline, inputs that once
exited 0, a full standard output and all-zero costs — each a one-line error (exit 2) or a
correct answer, never a traceback, a silent skip or exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.commands.common import closed_form_for


def _one_line_error(rc, out, err, needle):
    assert rc == 2, (out, err)
    assert err.startswith("pipebubble: error: ") and err.count("\n") == 1, err
    assert needle in err, err


@pytest.mark.parametrize("cells", ["0UNSHARD,0RESHARD\n1UNSHARD,\n", ",\n1REDUCE_GRAD,\n"])
@pytest.mark.parametrize("command", [["simulate"], ["run", "--local"]])
def test_a_csv_of_markers_only_is_one_line(tmp_path, run_cli, cells, command):
    path = tmp_path / "markers.csv"
    path.write_text(cells)
    _one_line_error(*run_cli(*command, "--csv", path), "no compute actions")


def test_rebalancing_from_a_zero_length_timeline_is_refused(tmp_path, run_cli):
    prof = tmp_path / "p.json"
    rc, _, err = run_cli("profile", "--analytic", "--layers", "4", "--hidden", "64", "--ffn",
                         "256", "--heads", "4", "--vocab", "100", "--seq", "16", "--tflops",
                         "100", "--mfu", "0.5", "--out", prof)
    assert rc == 0, err
    layers = len(json.loads(prof.read_text())["layers"])
    events = [{"rank": s, "stage": s, "kind": k, "microbatch": m, "start": 0, "end": 0}
              for m in range(2) for s in range(2) for k in "FB"]
    tl = tmp_path / "zero.json"
    tl.write_text(json.dumps({"schedule": "1f1b", "ranks": 2, "stages": 2, "microbatches": 2,
                              "events": events}))
    half = layers // 2
    _one_line_error(*run_cli("partition", "--profile", prof, "-p", "2", "--measured", tl,
                             "--current-cut", f"0-{half - 1},{half}-{layers - 1}"),
                    "all take 0 s")


@pytest.mark.parametrize("args, needle", [
    (["partition", "--profile", "P", "-p", "2", "--method", "uniform,,time"], "item 2 is empty"),
    (["partition", "--profile", "P", "-p", "2", "--method", "time,"], "item 2 is empty"),
    (["profile", "--analytic", "--layers", "2", "--hidden", "64", "--ffn", "256", "--heads",
      "4", "--vocab", "100", "--seq", "16", "--tflops", "100", "--mfu", "0.5", "--out", ""],
     "--out: empty file name"),
    (["run", "--local", "--backend", "nccl", "--schedule", "1f1b", "-p", "2", "-m", "2"],
     "--backend nccl applies to one process per rank"),
    (["run", "--local", "--device", "cpu:99", "--schedule", "1f1b", "-p", "2", "-m", "2"],
     "--device cpu:99: there is one CPU device"),
    (["profile", "--model", "sleep"], "--model sleep has no work to profile"),
    (["explore", "--host", "", "--no-browser"], "--host '' is empty"),
    (["explore", "--host", " ", "--no-browser"], "--host ' ' is empty"),
])
def test_what_used_to_exit_0_is_an_error(tmp_path, run_cli, args, needle):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"layers": [
        {"name": str(i), "forward": 1e-3, "backward": 2e-3, "params": 1,
         "activation_bytes": 1, "flops": 1} for i in range(4)]}))
    args = [str(prof) if a == "P" else a for a in args]
    _one_line_error(*run_cli(*args), needle)


def _to_dev_full(*args: str) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "pipebubble", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["--version"],
                                  ["sweep", "-p", "2", "-m", "1..4", "--csv", "-"],
                                  ["sweep", "-p", "2", "-m", "1..4"]])
@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_full_standard_output_is_one_line_and_exit_2(args, unbuffered, monkeypatch):
    monkeypatch.setenv("PYTHONUNBUFFERED", unbuffered)
    proc = _to_dev_full(*args)
    assert proc.returncode == 2
    assert proc.stderr == ("pipebubble: error: cannot write standard output: no space left on "
                           "the device (disk full)\n")


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2",
                                  "zbv", "dualpipev", "v-min", "v-half"])
def test_all_zero_costs_have_no_closed_form_and_a_zero_bubble(name):
    schedule = get_schedule(name, 4, 8)
    costs = CostModel(f=0.0, b=0.0, w=0.0)
    assert closed_form_for(schedule, costs) is None
    tl = simulate(schedule, costs)
    assert tl.step_time == 0 and tl.bubble_fraction == 0.0
    # with work, the 1F1B closed form is back: (p - 1) / (m + p - 1) = 3 / 11
    if name in ("gpipe", "1f1b"):
        assert closed_form_for(schedule, CostModel()) == pytest.approx(3 / 11)
