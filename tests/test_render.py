"""Matplotlib pictures: every figure kind renders for registry and hand-built schedules, the
files are sane, and what is drawn matches the Timeline (boxes, idle, labels, memory)."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET

import pytest
import torch
from matplotlib.collections import PolyCollection

from pipebubble import CostModel, Pipeline, PipelineStage, get_schedule, simulate
from pipebubble.ir.schedule import ScheduleError
from pipebubble.plan.calibrate import costs_from_timeline
from pipebubble.render import figures
from pipebubble.render.plots import (
    DPI,
    WIDTH_IN,
    gantt_figure,
    memory_figure,
    memory_ranks,
    row_height,
    save,
    timelines_figure,
)
from pipebubble.render.style import IDLE_COLOR, kind_color
from pipebubble.render.terminal import chunk_of_stage
from pipebubble.schedules import schedule_names
from render_cases import hand_built

COSTS = CostModel(f=1, b=2, w=1, overlap=0.8)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def cases() -> dict:
    out = {}
    for name in schedule_names(searched=False):
        try:
            out[name] = get_schedule(name, 4, 8)
        except ScheduleError:  # a family that needs other p, m or chunks
            continue
    out.update(hand_built())
    return out


CASES = cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gantt_png_and_svg_files_are_sane(name, tmp_path):
    timeline = simulate(CASES[name], COSTS)
    fig = gantt_figure(timeline, memory=True)
    png, svg = save(fig, tmp_path / "g.png"), save(fig, tmp_path / "g.svg")
    w, h = png_size(png)
    assert w == WIDTH_IN * DPI
    assert 250 < h < 2000
    assert 5_000 < png.stat().st_size < 300_000
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    # Each action is one box, plus one grey idle lane per rank.
    ax = fig.axes[0]
    lanes, boxes = ax.collections[:2]
    assert len(lanes.get_paths()) == timeline.num_ranks
    assert len(boxes.get_paths()) == len(timeline)


@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_and_stacked_figures_render(name, tmp_path):
    timeline = simulate(CASES[name], COSTS)
    mem = memory_figure(timeline)
    w, h = png_size(save(mem, tmp_path / "m.png"))
    assert (w, h) == tuple(round(x * DPI) for x in mem.get_size_inches())  # saved uncropped
    # one curve per drawn rank, peaking at that rank's simulated peak activation memory
    peaks = [s.peak_memory for s in timeline.rank_stats()]
    drawn = memory_ranks(timeline.num_ranks)
    assert [max(line.get_ydata()) for line in mem.axes[0].lines] == [peaks[r] for r in drawn]
    other = simulate(get_schedule("gpipe", timeline.num_ranks, timeline.num_microbatches))
    fig = timelines_figure([timeline, other])
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # one time axis
    ET.parse(save(fig, tmp_path / "t.svg"))


def boxes_of(ax) -> PolyCollection:
    return ax.collections[1]


def test_boxes_cover_busy_time_and_lanes_cover_the_step():
    """Idle is what the lanes show and no box covers: box widths per rank sum to busy."""
    timeline = simulate(get_schedule("1f1b", 4, 8))
    ax = gantt_figure(timeline).axes[0]
    lanes = ax.collections[0]
    assert tuple(lanes.get_facecolor()[0][:3]) == pytest.approx(kind_rgb(IDLE_COLOR))
    for path in lanes.get_paths():
        xs = path.vertices[:, 0]
        assert (xs.min(), xs.max()) == (0, 33)
    busy = [0.0] * 4
    for path in boxes_of(ax).get_paths():
        xs, ys = path.vertices[:, 0], path.vertices[:, 1]
        busy[round(ys.mean())] += xs.max() - xs.min()
    assert busy == [s.busy for s in timeline.rank_stats()] == [24.0] * 4


def kind_rgb(color):
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def test_chunks_are_shaded_and_overlaps_outlined():
    schedule = hand_built()["overlap-v"]
    timeline = simulate(schedule, COSTS)
    ax = gantt_figure(timeline).axes[0]
    faces = [x for c in boxes_of(ax).get_facecolor() for x in c[:3]]
    chunk = chunk_of_stage(timeline)
    expected = [x for k, s in zip(timeline.kind, timeline.stage, strict=True)
                for x in kind_color(k, chunk[s], 2)]
    assert faces == pytest.approx(expected)
    assert kind_color("F", 1, 2) != kind_color("F", 0, 2)
    outlines = ax.collections[2]
    pairs = sum(1 for order in schedule.orders for step in order if hasattr(step, "backward"))
    assert pairs == 3
    assert len(outlines.get_paths()) == pairs
    # Each outline spans exactly its F and its B, back to back.
    spans = sorted(x for p in outlines.get_paths()
                   for x in (p.vertices[:, 0].min(), p.vertices[:, 0].max()))
    ov = [e for e in timeline.events() if e.overlapped]
    pair_spans = sorted(x for i in range(0, len(ov), 2) for x in (ov[i].start, ov[i + 1].end))
    assert spans == pytest.approx(pair_spans)
    assert all(ov[i].kind == "F" and ov[i + 1].kind == "B" for i in range(0, len(ov), 2))


def texts_of(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = [t for t in fig.texts]
    for ax in fig.axes:
        out += ax.texts + [ax.title, ax.xaxis.label, ax.yaxis.label]
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        out += [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
        out += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
        if ax.get_legend():
            out += ax.get_legend().get_texts()
    for leg in fig.legends:
        out += leg.get_texts()
    return [(t, t.get_window_extent(renderer)) for t in out
            if t.get_visible() and t.get_text().strip() and t.get_window_extent(renderer).width]


def assert_legible(fig) -> None:
    """No two pieces of text overlap, and none runs off the figure."""
    texts = texts_of(fig)
    width, height = fig.canvas.get_width_height()
    for t, bb in texts:
        assert bb.x0 >= -0.5 and bb.y0 >= -0.5, t
        assert bb.x1 <= width + 0.5 and bb.y1 <= height + 0.5, t
    boxes = [b for _, b in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            overlap_x = min(a.x1, b.x1) - max(a.x0, b.x0)
            overlap_y = min(a.y1, b.y1) - max(a.y0, b.y0)
            assert overlap_x <= 0.5 or overlap_y <= 0.5, (texts[i][0], texts[j][0])


@pytest.mark.parametrize("p, m, labelled", [(2, 4, 16), (8, 32, 256), (32, 128, 0)])
def test_labels_fit_boxes_and_no_text_overlaps(p, m, labelled):
    """At p=2..32, m=4..128 no two pieces of text overlap and every label sits in its box.

    Hand check of the label counts: at p=2, m=4 every box is wide (12 in for 15 units); at
    p=8, m=32 the B boxes (2 of 117 units, 13 pt) fit two digits and the F boxes do not; at
    p=32, m=128 a B box is 3 pt wide and nothing fits."""
    timeline = simulate(get_schedule("1f1b", p, m))
    fig = gantt_figure(timeline, memory=True)
    ax = fig.axes[0]
    assert len(ax.texts) == labelled
    assert_legible(fig)
    # Each label lies inside the box of the event it names.
    to_px = ax.transData
    events = {(e.rank, (e.start + e.end) / 2): e for e in timeline.events()}
    for t in ax.texts:
        x, r = t.get_position()
        e = events[r, x]
        assert t.get_text() in (str(e.microbatch), f"{e.kind}{e.microbatch}")
        bb = t.get_window_extent()
        (x0, y0), (x1, y1) = to_px.transform([(e.start, r + 0.4), (e.end, r - 0.4)])
        assert x0 <= bb.x0 and bb.x1 <= x1 and min(y0, y1) <= bb.y0 and bb.y1 <= max(y0, y1)


def test_row_height_shrinks_with_ranks():
    assert row_height(2) == 0.42 and row_height(32) == 0.1875 and row_height(200) == 0.16


def test_memory_lines_are_the_timelines_curves():
    timeline = simulate(get_schedule("gpipe", 4, 8))
    ax = gantt_figure(timeline, memory=True).axes[1]
    assert len(ax.lines) == 4
    for r, line in enumerate(ax.lines):
        times, values = timeline.memory_curve(r)
        assert list(line.get_xdata()) == times
        assert list(line.get_ydata()) == values
    assert max(ax.lines[0].get_ydata()) == 8  # GPipe: rank 0 holds all m microbatches
    stacked = timelines_figure([timeline, simulate(get_schedule("1f1b", 4, 8))], memory=True)
    gpipe_mem, one_f_mem = stacked.axes[1], stacked.axes[3]
    assert max(one_f_mem.lines[0].get_ydata()) == 4  # 1F1B: at most p on rank 0
    assert gpipe_mem.get_ylim() == one_f_mem.get_ylim()  # one memory scale to compare by eye
    assert memory_ranks(32) == [0, 6, 12, 19, 25, 31]
    assert memory_ranks(5) == [0, 1, 2, 3, 4]


def test_predicted_vs_measured_on_a_real_run(tmp_path):
    """A real (tiny) run with the measured clock, its calibrated prediction, one figure."""
    torch.manual_seed(0)
    stages = [PipelineStage(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(2)]
    pipe = Pipeline(stages, 4, "1f1b")
    measured = pipe.step(torch.randn(8, 16), torch.randn(8, 16)).timeline
    assert measured.source == "measured"
    predicted = simulate(pipe.schedule, costs_from_timeline(measured))
    fig = timelines_figure([predicted, measured])
    assert [t.get_text() for t in fig.texts[:4:2]] == ["1f1b (simulated)", "1f1b (measured)"]
    label = [t.get_text() for t in fig.texts if t.get_text().startswith("time (")]
    assert label and label[0] in ("time (s)", "time (ms)", "time (µs)")
    save(fig, tmp_path / "pm.png")
    assert png_size(tmp_path / "pm.png") == tuple(round(x * DPI) for x in fig.get_size_inches())


def test_figures_write_draws_what_the_flags_ask(tmp_path):
    one = simulate(get_schedule("1f1b", 2, 4))
    two = simulate(get_schedule("gpipe", 2, 4))
    figures.write([one], "title", png=str(tmp_path / "a.png"), svg=str(tmp_path / "a.svg"),
                  trace=str(tmp_path / "a.json"), memory=True)
    assert png_size(tmp_path / "a.png")[1] > png_size(save(gantt_figure(one),
                                                           tmp_path / "b.png"))[1]
    ET.parse(tmp_path / "a.svg")
    figures.write([one, two], "p=2 m=4", png=str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").exists() and not (tmp_path / "c.svg").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        figures.write([one], "t", png=str(tmp_path / "no" / "x.png"))
    with pytest.raises(ValueError, match="cannot save a figure as 'gif'"):
        save(gantt_figure(one), tmp_path / "x.gif")


def test_stacked_hand_built_and_sweep_figures_are_legible():
    from pipebubble.plan.sweep import sweep
    from pipebubble.render.sweep_plot import sweep_figure

    timelines = [simulate(s, COSTS) for s in hand_built().values()]
    fig = timelines_figure(timelines, title="hand-built")
    assert_legible(fig)
    assert len(fig.legends[0].get_texts()) == 7  # F I W B, chunk 1, idle, overlapped pair
    assert_legible(sweep_figure(sweep(["gpipe", "1f1b"], 4, range(1, 129))))
    assert_legible(memory_figure(simulate(get_schedule("gpipe", 32, 8))))


def test_legend_names_chains_for_dualpipe_and_chunks_otherwise():
    from pipebubble.render.plots import _legend_handles

    def labels(name):
        return [h.get_label() for h in _legend_handles([simulate(get_schedule(name, 4, 8))])]

    # DualPipe: one stage per rank per chain, the darker one is the second model copy's
    assert "chain 1 (darker shade)" in labels("dualpipe")
    assert "chunk 1 (darker shade)" in labels("zbv")  # one chain, two chunks per rank
    assert not any("darker" in x for x in labels("1f1b"))
