"""Bubble sweeps and the CLI's picture flags: numbers against closed forms, the CSV, the plot,
and one-line errors for bad ranges."""

from __future__ import annotations

import csv
import io
import json
import struct
import xml.etree.ElementTree as ET

import pytest

from pipebubble.cli import main
from pipebubble.ir.schedule import ScheduleError
from pipebubble.plan.sweep import parse_range, sweep, write_csv
from pipebubble.schedules import registry
from pipebubble.schedules.gpipe import gpipe


@pytest.mark.parametrize("text, values", [
    ("8", [8]), ("1..4", [1, 2, 3, 4]), ("1..10:3", [1, 4, 7, 10]), ("4,1..2,4", [1, 2, 4]),
    (" 2 .. 3 ", [2, 3]),
])
def test_parse_range(text, values):
    assert parse_range(text) == values


@pytest.mark.parametrize("text, message", [
    ("0..4", "must be >= 1, got 0"), ("8..2", "empty range '8..2'"), ("x", "cannot read 'x'"),
    ("1..", "cannot read '1..'"), ("1..8:0", "bad step"), ("4:2", "cannot read .4:2."),
    ("1..1000000", "too many values"), ("", "cannot read ''"),
])
def test_parse_range_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_range(text, "-m")


def test_sweep_matches_closed_forms_and_memory():
    """GPipe and 1F1B: bubble (p-1)/(m+p-1); peak memory m for GPipe, min(m, p) for 1F1B."""
    ms = [1, 2, 3, 5, 8, 13, 32]
    calls = []
    points = sweep(["gpipe", "1F1B"], 4, ms, on_point=lambda: calls.append(1))
    assert len(calls) == len(points) == 14
    for p in points:
        assert p.bubble_fraction == pytest.approx(3 / (p.microbatches + 3))
        assert p.closed_form_bubble == pytest.approx(3 / (p.microbatches + 3))
        assert p.step_time == (p.microbatches + 3) * 3
        want = p.microbatches if p.schedule == "gpipe" else min(p.microbatches, 4)
        assert p.peak_memory == want and p.peak_activations == want


def test_sweep_leaves_out_points_a_generator_refuses(monkeypatch):
    def even_only(ranks, microbatches, chunks=1):
        if microbatches % 2:
            raise ScheduleError(f"even-only needs an even m, got {microbatches}")
        return gpipe(ranks, microbatches)

    spec = registry.ScheduleSpec("even-only", even_only, "test family")
    monkeypatch.setitem(registry.SCHEDULES, "even-only", spec)
    monkeypatch.setitem(registry._ALIASES, "even-only", "even-only")
    calls = []
    points = sweep(["even-only"], 2, range(1, 7), on_point=lambda: calls.append(1))
    assert [p.microbatches for p in points] == [2, 4, 6]
    assert all(p.closed_form_bubble is None for p in points)
    assert len(calls) == 6  # the progress bar still reaches the end
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'"):
        sweep(["gpipe", "nope"], 2, [1])


def test_csv_round_trip():
    out = io.StringIO()
    write_csv(sweep(["gpipe"], 2, [1, 2]), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0]) == ["schedule", "ranks", "chunks", "microbatches", "step_time",
                             "bubble_fraction", "closed_form_bubble", "peak_activations",
                             "peak_memory"]
    assert [(r["microbatches"], float(r["bubble_fraction"])) for r in rows] == [
        ("1", 0.5), ("2", pytest.approx(1 / 3))]


def png_ok(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 300_000
    return struct.unpack(">II", data[16:24])


def test_sweep_command_writes_csv_png_svg(tmp_path, capsys):
    args = ["sweep", "-p", "4", "-m", "1..64", "--schedules", "gpipe,1f1b",
            "--csv", str(tmp_path / "s.csv"), "--png", str(tmp_path / "s.png"),
            "--svg", str(tmp_path / "s.svg")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "27.27%" in out and "closed form" not in out.split("mem")[0]  # m = 8 sampled; = closed
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 2 * 64
    assert png_ok(tmp_path / "s.png") == (1200, 415)  # 3.9 in + one legend row of 0.25 in
    ET.parse(tmp_path / "s.svg")
    assert main(["sweep", "-p", "2", "-m", "1..3", "--schedules", "gpipe", "--csv", "-"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("schedule,")


@pytest.mark.parametrize("args, needle", [
    (["-m", "0..8"], "--microbatches must be >= 1, got 0 in '0..8'"),
    (["-m", "9..2"], "--microbatches: empty range '9..2'"),
    (["-m", "a..b"], "--microbatches: cannot read 'a..b'"),
    (["--schedules", "gpipe,nope"], "unknown schedule 'nope'"),
    (["--schedules", "gpipe,,1f1b"], "--schedules: empty name"),
])
def test_sweep_bad_input_is_one_line_exit_2(args, needle, capsys):
    assert main(["sweep", "-p", "4", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_simulate_and_compare_write_figures(tmp_path, capsys):
    g = tmp_path / "g"
    assert main(["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--json", "--memory",
                 "--png", f"{g}.png", "--svg", f"{g}.svg", "--trace", f"{g}.json"]) == 0
    json.loads(capsys.readouterr().out)  # --json output stays one JSON object
    w, h = png_ok(tmp_path / "g.png")
    assert w == 1200 and h > 400
    ET.parse(f"{g}.svg")
    trace = json.loads((tmp_path / "g.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 64
    c = tmp_path / "c"
    assert main(["compare", "-p", "4", "-m", "8", "--json", "--png", f"{c}.png",
                 "--trace", f"{c}.json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    png_ok(tmp_path / "c.png")
    trace = json.loads((tmp_path / "c.json").read_text())
    pids = {e["pid"] for e in trace["traceEvents"]}
    assert len(pids) == 4 * len(rows)  # every schedule's ranks, side by side
    assert main(["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2",
                 "--png", str(tmp_path / "missing" / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sweep_trace_holds_each_schedule_at_the_largest_m(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    assert main(["sweep", "-p", "2", "-m", "1..4", "--schedules", "gpipe,1f1b",
                 "--trace", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 2 * (2 * 4 * 2)  # two schedules x 2 stages x 4 microbatches x F, B
    names = {e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"{s} m=4 rank {r}" for s in ("gpipe", "1f1b") for r in (0, 1)}
