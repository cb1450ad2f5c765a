from rich.console import Console

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.render.terminal import gantt


def render(timeline, width=80):
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    console.print(gantt(timeline))
    return console.export_text().splitlines()


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
