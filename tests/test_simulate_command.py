"""``pipebubble simulate`` prints what the library computes: the JSON object's figures and
events are those of ``simulate()`` on the same schedule and costs, and every chart row is
the event-by-event painting (``_cells_one_by_one``) of the library's timeline. The command's
fast paths (the kernel's numpy-backed columns, the Gantt chart painting only the events that
can show, the metrics from the kernel's codes) must not change a character."""

import json

import pytest

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.render.terminal import _cells_one_by_one, chunk_of_stage

CASES = [  # (flags, the same schedule and costs for the library)
    (["--schedule", "1f1b", "-p", "8", "-m", "600"], ("1f1b", 8, 600, None), CostModel()),
    (["--schedule", "dualpipe", "-p", "4", "-m", "40", "--comm", "0.1", "--overlap", "0.7"],
     ("dualpipe", 4, 40, None), CostModel(comm=0.1, overlap=0.7)),
    (["--schedule", "dualpipev", "-p", "4", "-m", "300", "--f", "1.3", "--b", "2.2"],
     ("dualpipev", 4, 300, None), CostModel(f=1.3, b=2.2)),
    (["--schedule", "zbv", "-p", "4", "-m", "16", "--comm", "0.25", "--mem-w", "0.3"],
     ("zbv", 4, 16, None), CostModel(comm=0.25, weight_memory=0.3)),
    (["--schedule", "interleaved-1f1b", "-p", "2", "-m", "8", "-v", "2", "--f",
      "1,1.5,1.25,2"], ("interleaved-1f1b", 2, 8, 2), CostModel(f=[1, 1.5, 1.25, 2])),
]


@pytest.mark.parametrize("flags, spec, costs", CASES)
def test_json_is_the_library_timeline(run_cli, flags, spec, costs):
    rc, out, _ = run_cli("simulate", *flags, "--json")
    assert rc == 0
    got = json.loads(out)
    tl = simulate(get_schedule(*spec), costs)
    assert got["step_time"] == pytest.approx(tl.step_time, rel=1e-11)
    assert got["bubble_fraction"] == pytest.approx(tl.bubble_fraction, rel=1e-11)
    for row, s in zip(got["per_rank"], tl.rank_stats(), strict=True):
        assert row["peak_activations"] == s.peak_activations
        assert row["peak_memory"] == pytest.approx(s.peak_memory, rel=1e-11)
        assert row["busy"] == pytest.approx(s.busy, rel=1e-11)
    events = got["events"]
    assert len(events) == len(tl)
    for e, lib in zip(events, tl.events(), strict=True):
        assert (e["rank"], e["stage"], e["kind"], e["microbatch"]) == \
            (lib.rank, lib.stage, lib.kind, lib.microbatch)
        assert e["start"] == pytest.approx(lib.start, rel=1e-11, abs=1e-12)
        assert e["end"] == pytest.approx(lib.end, rel=1e-11, abs=1e-12)


@pytest.mark.parametrize("width", [61, 100, 157])
@pytest.mark.parametrize("flags, spec, costs", CASES)
def test_chart_rows_paint_the_library_timeline_event_by_event(run_cli, monkeypatch, flags,
                                                               spec, costs, width):
    monkeypatch.setenv("COLUMNS", "400")  # the terminal is wide: --width decides
    rc, out, _ = run_cli("simulate", *flags, "--width", width)
    assert rc == 0
    tl = simulate(get_schedule(*spec), costs)
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(rows) == tl.num_ranks
    label_w = len(f"rank {tl.num_ranks - 1}") + 1
    axis = width - label_w - 1  # what the command gives the time axis
    step = tl.step_time
    cols, scale = axis, axis / step  # as gantt scales (a whole number of columns per unit
    if step == int(step) and step <= axis:  # when the step fits)
        scale = float(min(6, axis // int(step)))
        cols = int(step * scale)
    chunk = chunk_of_stage(tl)
    for r, row in enumerate(rows):
        lo, hi = tl.offsets[r], tl.offsets[r + 1]
        c0 = [int(round(tl.start[i] * scale)) for i in range(lo, hi)]
        c1 = [min(max(a + 1, int(round(tl.end[i] * scale))), cols)
              for a, i in zip(c0, range(lo, hi), strict=True)]
        cells = _cells_one_by_one(tl, lo, hi, c0, c1, cols, chunk)
        assert row == f"rank {r}".ljust(label_w) + "".join(ch for ch, _ in cells)
