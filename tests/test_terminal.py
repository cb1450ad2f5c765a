from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.render.terminal import _cells, _cells_one_by_one, chunk_of_stage, gantt
from strategies import schedules_and_costs


def render(timeline, width=80):
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    console.print(gantt(timeline))
    return console.export_text().splitlines()


def event_by_event(tl, r, scale, cols, chunk):
    """Rank ``r``'s cells painted one event at a time (the definition ``_cells`` vectorises):
    each event from column round(start x scale) to round(end x scale), at least one."""
    lo, hi = tl.offsets[r], tl.offsets[r + 1]
    c0 = [int(round(tl.start[i] * scale)) for i in range(lo, hi)]
    c1 = [min(max(a + 1, int(round(tl.end[i] * scale))), cols)
          for a, i in zip(c0, range(lo, hi), strict=True)]
    return _cells_one_by_one(tl, lo, hi, c0, c1, cols, chunk)


def test_one_row_per_rank_labels_and_idle():
    lines = render(simulate(get_schedule("gpipe", 2, 2), CostModel(f=1, b=2)))
    rows = [line for line in lines if line.startswith("rank")]
    assert len(rows) == 2
    assert "F0" in rows[0] and "B1" in rows[0]
    assert rows[1].split(" ", 2)[2].startswith("·")  # rank 1 waits for its first activation
    assert any("idle" in line and "forward" in line for line in lines)  # the legend


def test_long_timelines_are_scaled_not_wrapped():
    tl = simulate(get_schedule("1f1b", 8, 500))
    for width in (60, 80, 200):
        lines = render(tl, width)
        assert sum(line.startswith("rank") for line in lines) == 8
        assert all(len(line) <= width for line in lines)


def test_cells_follow_time():
    # p=1, m=1, F=1, B=2 at 6 columns per unit: F fills a third of the row, B the rest.
    lines = render(simulate(get_schedule("gpipe", 1, 1), CostModel(f=1, b=2)), width=40)
    row = lines[0][len("rank 0 "):]
    assert row.startswith(" F0") and "B0" in row[6:]


@settings(max_examples=150)
@given(schedules_and_costs(), st.integers(10, 130))
def test_cells_equal_the_event_by_event_definition(case, width):
    """The vectorised row (searchsorted over columns) paints exactly what painting event by
    event paints: fills, padded labels, first letters, idle dots."""
    schedule, costs = case
    tl = simulate(schedule, costs)
    step = tl.step_time or 1.0
    for scale in (width / step, float(max(1, min(6, width // max(1, int(step)))))):
        cols = max(1, int(round(step * scale)))
        chunk = chunk_of_stage(tl)
        for r in range(tl.num_ranks):
            assert _cells(tl, r, 0.0, scale, cols, chunk) == \
                event_by_event(tl, r, scale, cols, chunk)


def test_a_million_actions_draw_in_one_row_per_rank():
    tl = simulate(get_schedule("1f1b", 64, 8192))
    lines = render(tl, 100)
    rows = [line for line in lines if line.startswith("rank")]
    assert len(rows) == 64 and all(len(line) <= 100 for line in rows)
    assert not any("·" in row for row in rows)  # 1F1B at m >> p: no idle column anywhere
    cols = len(rows[0]) - len("rank 63 ")
    scale = cols / tl.step_time
    chunk = chunk_of_stage(tl)
    for r in (0, 63):  # the same cells as painting the 16,384 events one by one
        assert _cells(tl, r, 0.0, scale, cols, chunk) == event_by_event(tl, r, scale, cols, chunk)


def test_the_legend_explains_darker_boxes_whenever_a_rank_holds_several_stages():
    """1F1B: one stage per rank, nothing darker. Interleaved: later chunks. DualPipe: one
    stage of each chain per rank (chunks = 1), drawn darker for the second chain."""
    def legend(name):
        t = simulate(get_schedule(name, 4, 8))
        return "\n".join(render(t, width=200))

    assert "darker" not in legend("1f1b")
    assert "darker = the rank's later stage (chunk)" in legend("interleaved-1f1b")
    assert "darker = the rank's later stage (second chain)" in legend("dualpipe")
