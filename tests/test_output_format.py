"""Output format: short reprs, exact JSON numbers, units, 80-column output, help on every
flag, warnings on noisy measurements."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.cli import build_parser, main
from pipebubble.commands._run_setup import noise_note
from pipebubble.commands.common import clean_floats
from pipebubble.commands.sweep import sample_ms


def test_timeline_repr_is_one_short_line():
    t = simulate(get_schedule("1f1b", 4, 8), CostModel(f=1, b=2))
    assert repr(t) == ("Timeline('1f1b', simulated, ranks=4, stages=4, microbatches=8, "
                       "events=64, step_time=33)")


def test_json_numbers_without_float_noise(capsys):
    # 1F1B, p=4, m=8, F=0.1, B=0.2: step (m + p - 1)(F + B) = 11 x 0.3 = 3.3 exactly in
    # decimal; the float sum is 3.3000000000000003.
    assert main(["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--f", "0.1",
                 "--b", "0.2", "--w", "0.1", "--json"]) == 0
    text = capsys.readouterr().out
    assert '"step_time": 3.3,' in text
    assert "0000000000" not in text and "9999999999" not in text
    out = json.loads(text)
    assert out["events"][1]["start"] == 0.1  # rank 0's second forward starts after one F


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_clean_floats_changes_a_number_by_at_most_its_twelfth_digit(x):
    y = clean_floats(x)
    assert abs(y - x) <= 5e-12 * abs(x)
    assert clean_floats([x, {"a": x}]) == [y, {"a": y}]


def test_clean_floats_leaves_non_finite_and_non_floats():
    out = clean_floats({"a": math.inf, "b": 3, "c": "0.30000000000000004", "d": None})
    assert out == {"a": math.inf, "b": 3, "c": "0.30000000000000004", "d": None}


def test_noise_note_compares_the_gap_with_the_spread():
    # steps 10, 11, 12 ms: spread 20%. Predicted 11 ms vs measured 10 ms: gap 10% (noise);
    # predicted 13 ms: gap 30% (a model error).
    assert "within the run-to-run spread of 20.0% over 3 steps: noise" in \
        noise_note([0.010, 0.011, 0.012], 0.010, 0.011)
    assert "differ by 30.0%, more than the run-to-run spread of 20.0%" in \
        noise_note([0.010, 0.011, 0.012], 0.010, 0.013)
    assert noise_note([0.010], 0.010, 0.013) is None  # one step has no spread


def test_measured_summary_has_units():
    from rich.console import Console

    from pipebubble.render.terminal import summary_lines, summary_table
    from pipebubble.timeline import Event, Timeline

    t = Timeline.from_events(
        [Event(0, 0, "F", 0, 0.0, 0.002, 3 * 2**10, 0), Event(0, 0, "B", 0, 0.002, 0.0065, 0,
                                                                -3 * 2**10)],
        schedule="x", num_ranks=1, num_stages=1, num_microbatches=1, stage_to_rank=[0])
    console = Console(width=100, record=True)
    console.print(summary_table(t))
    text = console.export_text()
    assert "6.500 ms" in text and "3.00 KiB" in text
    assert summary_lines(t)[0] == "step time 6.500 ms   lower bound 6.500 ms"


def test_sweep_table_fits_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sweep", "-p", "4", "-m", "1..32"]) == 0  # more m than 80 columns can show
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    assert "27.27%" in out  # gpipe at m = 8: 3/11


def test_sample_ms_keeps_ends_and_at_most_k():
    for n in (1, 5, 64, 1000):
        for k in (2, 3, 6, 16):
            got = sample_ms(list(range(1, n + 1)), k)
            assert len(got) == min(n, k) and got == sorted(set(got))
            assert got[0] == 1 and got[-1] == n


@pytest.mark.parametrize("width", [40, 60, 80])
def test_simulate_width_is_obeyed_when_piped(width, capsys):
    assert main(["simulate", "--schedule", "zbv", "-p", "4", "-m", "8", "--width",
                 str(width)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= width
    assert lines[1].startswith("rank 0 ")


def test_gantt_labels_never_run_together(capsys):
    """A label is drawn only with a blank cell before it, so ``F1F2`` cannot appear."""
    import re

    assert main(["simulate", "--schedule", "zbv", "-p", "4", "-m", "8", "--width",
                 "120"]) == 0
    chart = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rank")]
    assert chart
    for line in chart:
        assert not re.search(r"[FIWB]\d+[FIWB]\d", line), line


def test_every_flag_has_help():
    """``-p``, ``-m``, profile's ``--model``... every visible flag of every command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, cmd in sub.choices.items():
        for action in cmd._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_profile_warns_when_identical_layers_differ():
    from pipebubble.commands.profile import noisy_layers
    from pipebubble.plan.profile import LayerProfile, Profile

    def layer(i, fwd):
        return LayerProfile(f"l{i}", fwd, 2 * fwd, 10, 100.0, 1e3, "Linear")

    noisy = Profile([layer(0, 0.001), layer(1, 0.001), layer(2, 0.0031)])
    steady = Profile([layer(0, 0.001), layer(1, 0.0029)])
    warnings = noisy_layers(noisy)
    assert len(warnings) == 2  # forward and backward, both 3.1x apart
    assert warnings[0].startswith("3 identical Linear differ 3.1x in forward time")
    assert noisy_layers(steady) == []


def test_profile_uses_one_thread_and_cpu_time_by_default(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["profile", "--model", "mlp", "--layers", "2", "--width", "8", "--batch",
                     "2", "--warmup", "0", "--repeats", "1", "--json"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert json.loads(capsys.readouterr().out)["timer"] == "cpu"
