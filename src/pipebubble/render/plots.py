"""Matplotlib pictures of Timelines: Gantt charts, memory over time, timelines compared.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot, so nothing
needs a display (it renders with Agg) and figures do not leak between calls; save one with
:func:`save`.

The Gantt chart has one row per rank, rank 0 on top, time to the right. Each action is a box
coloured by kind (F, I, W, B; see ``style.py``), later chunks of a rank in darker shades,
labelled with its microbatch when the label fits inside the box. Grey lanes are idle time.
An overlapped F&B pair (DualPipe) is drawn as its two halves inside one black outline.
With all-to-all (``--a2a-f``/``--a2a-b``), a strip along the bottom of each box shows it:
hatched light red where an overlapped pair hides it behind the other half's compute, solid
dark red where the rank waits for it (every lone action's, and what outlasts a pair's
compute).

Sizes are laid out in inches, not left to the layout engine, so the chart reads the same at
p=2 and p=32: rows get shorter as ranks are added (0.42 in down to 0.16 in) and the label
font shrinks with them; labels that would not fit their box are left out rather than spill.

>>> from pipebubble import get_schedule, simulate
>>> fig = gantt_figure(simulate(get_schedule("1f1b", 4, 8)))
>>> [ax.get_ylabel() for ax in fig.axes]
['rank']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..errors import UserError
from ..timeline import Timeline
from .style import (
    A2A_EXPOSED,
    A2A_HIDDEN,
    IDLE_COLOR,
    KIND_NAMES,
    KIND_ORDER,
    MEMORY_CMAP,
    OVERLAP_EDGE,
    a2a_spans,
    describe,
    headline,
    kind_color,
    memory_scale,
    text_color,
    timeline_time_scale,
)
from .terminal import chunk_of_stage

WIDTH_IN = 12.0
LEFT_IN = 0.85
RIGHT_IN = 0.3
DPI = 100
MEMORY_IN = 1.6
_CHAR_EM = 0.64  # width of a digit or capital in DejaVu Sans, in ems (a little generous)


def new_figure(width: float, height: float) -> Figure:
    """A Figure on its own Agg canvas: headless, and independent of pyplot's state."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def row_height(total_rows: int) -> float:
    """Inches per rank row: 0.42 for a few ranks, shrinking to 0.16 for many."""
    return max(0.16, min(0.42, 6.0 / max(1, total_rows)))


class _Stack:
    """Blocks of known height (inches) stacked top to bottom in a figure of fixed width."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, float]] = []

    def add(self, name: str, height: float) -> None:
        self.blocks.append((name, height))

    def build(self) -> tuple[Figure, dict[str, tuple[float, float]]]:
        """The figure and, per block, (bottom, height) in figure fractions."""
        total = sum(h for _, h in self.blocks)
        fig = new_figure(WIDTH_IN, total)
        where, top = {}, total
        for name, h in self.blocks:
            top -= h
            where[name] = (top / total, h / total)
        return fig, where

    @staticmethod
    def axes(fig: Figure, box: tuple[float, float], sharex=None):
        left = LEFT_IN / WIDTH_IN
        width = 1 - (LEFT_IN + RIGHT_IN) / WIDTH_IN
        return fig.add_axes((left, box[0], width, box[1]), sharex=sharex)


# ---- drawing on an axes ------------------------------------------------------------------
def draw_gantt(ax, timeline: Timeline, *, factor: float, xmax: float, row_in: float) -> int:
    """Draw ``timeline`` as boxes on ``ax``; return how many microbatch labels fit.

    ``factor`` converts timeline time to axis units; ``xmax`` is the axis end (shared by
    stacked charts); ``row_in`` is the height of one rank row in inches (for font sizes).
    """
    p = timeline.num_ranks
    t0 = min(timeline.start, default=0.0)
    chunk = chunk_of_stage(timeline)
    chunks = max(chunk, default=0) + 1
    ax.set_xlim(0, xmax)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    row_pt = row_in * 72
    ax.tick_params(axis="y", length=0, labelsize=min(9.0, max(6.0, row_pt * 0.55)))
    ax.set_ylabel("rank")
    ax.yaxis.label.set_visible(False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    span = timeline.step_time * factor
    lanes = [[(0, r - 0.4), (span, r - 0.4), (span, r + 0.4), (0, r + 0.4)] for r in range(p)]
    ax.add_collection(PolyCollection(lanes, facecolors=IDLE_COLOR, edgecolors="none"))
    if not len(timeline):
        return 0

    x0 = [(s - t0) * factor for s in timeline.start]
    x1 = [(e - t0) * factor for e in timeline.end]
    colors = [kind_color(k, chunk[s], chunks) for k, s in zip(timeline.kind, timeline.stage,
                                                               strict=True)]
    boxes = [[(a, r - 0.4), (b, r - 0.4), (b, r + 0.4), (a, r + 0.4)]
             for a, b, r in zip(x0, x1, timeline.rank, strict=True)]
    ax_w_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    pt_per_unit = ax_w_pt / xmax if xmax > 0 else 0.0
    widths = sorted(b - a for a, b in zip(x0, x1, strict=True))
    typical_pt = widths[len(widths) // 2] * pt_per_unit
    edge = 0.6 if typical_pt >= 4 else (0.25 if typical_pt >= 1.5 else 0.0)
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="white",
                                     linewidths=edge))
    _outline_overlaps(ax, timeline, x0, x1)
    _draw_a2a(ax, timeline, x0, x1)
    return _label_boxes(ax, timeline, x0, x1, colors, pt_per_unit, row_pt)


def _draw_a2a(ax, timeline: Timeline, x0: list[float], x1: list[float]) -> None:
    """The all-to-all strip along the bottom of each box (module doc)."""
    if not timeline.has_a2a:
        return
    hidden, exposed = [], []
    for i, r in enumerate(timeline.rank):
        h, e = timeline.a2a_hidden[i], timeline.a2a_exposed[i]
        if not (h or e):
            continue
        dur = timeline.end[i] - timeline.start[i]
        scale = (x1[i] - x0[i]) / dur if dur > 0 else 0.0
        h_span, e_span = a2a_spans(x0[i], x1[i], h * scale, e * scale)
        for span, out in ((h_span, hidden), (e_span, exposed)):
            if span is not None:
                a, b = span
                out.append([(a, r + 0.18), (b, r + 0.18), (b, r + 0.4), (a, r + 0.4)])
    if hidden:
        ax.add_collection(PolyCollection(hidden, facecolors=A2A_HIDDEN, edgecolors=A2A_EXPOSED,
                                         linewidths=0.0, hatch="////"))
    if exposed:
        ax.add_collection(PolyCollection(exposed, facecolors=A2A_EXPOSED, edgecolors="none"))


def _outline_overlaps(ax, timeline: Timeline, x0: list[float], x1: list[float]) -> None:
    """One black outline around each overlapped F&B pair (consecutive overlapped events)."""
    ov = timeline.overlapped
    outlines = []
    for r in range(timeline.num_ranks):
        i, hi = timeline.offsets[r], timeline.offsets[r + 1]
        while i < hi:
            if ov[i] and i + 1 < hi and ov[i + 1]:
                a, b = x0[i], x1[i + 1]
                outlines.append([(a, r - 0.43), (b, r - 0.43), (b, r + 0.43), (a, r + 0.43)])
                i += 2
            else:
                i += 1
    if outlines:
        ax.add_collection(PolyCollection(outlines, facecolors="none", edgecolors=OVERLAP_EDGE,
                                         linewidths=1.3))


def _label_boxes(ax, timeline, x0, x1, colors, pt_per_unit: float, row_pt: float) -> int:
    """Write the microbatch number (``F3`` when every box has room) in the boxes it fits.

    The font follows the row height (at most 8.5 pt) and shrinks, down to 5 pt, until the
    widest label fits the wider boxes; a box gets a label only if the widest label would
    fit in it, so boxes of one width are all labelled or none is.
    """
    widths = sorted((b - a) * pt_per_unit for a, b in zip(x0, x1, strict=True))
    digits = len(str(max(timeline.microbatch, default=0)))
    wide = widths[int(0.9 * (len(widths) - 1))]
    size = min(8.5, row_pt * 0.42, (wide - 3) / (digits * _CHAR_EM))
    if size < 5.0:
        return 0
    with_kind = widths[0] >= (digits + 1) * _CHAR_EM * size + 3
    need = (digits + with_kind) * _CHAR_EM * size + 3
    count = 0
    for i, (a, b) in enumerate(zip(x0, x1, strict=True)):
        if (b - a) * pt_per_unit < need:
            continue
        text = f"{timeline.kind[i]}{timeline.microbatch[i]}" if with_kind else \
            str(timeline.microbatch[i])
        ax.text((a + b) / 2, timeline.rank[i], text, ha="center", va="center_baseline",
                fontsize=size, color=text_color(colors[i]), clip_on=True)
        count += 1
    return count


def memory_ranks(num_ranks: int) -> list[int]:
    """The ranks whose memory curves are drawn: all up to 8, else 6 spread from 0 to p-1."""
    if num_ranks <= 8:
        return list(range(num_ranks))
    return sorted({round(i * (num_ranks - 1) / 5) for i in range(6)})


def draw_memory(ax, timeline: Timeline, *, factor: float) -> None:
    """Activation memory over time (step curves), one colour per rank, legend above right.

    Up to 8 ranks are all drawn; with more, 6 ranks spread from first to last (the curves
    of neighbours nearly coincide, and 32 overlaid step curves are unreadable).
    """
    from matplotlib import colormaps

    cmap = colormaps[MEMORY_CMAP]
    p = timeline.num_ranks
    t0 = min(timeline.start, default=0.0)
    peak = max((s.peak_memory for s in timeline.rank_stats()), default=0.0)
    mfactor, label = memory_scale(timeline, peak)
    ranks = memory_ranks(p)
    for r in ranks:
        times, values = timeline.memory_curve(r)
        times = [t0] + times[1:]
        ax.plot([(t - t0) * factor for t in times], [v * mfactor for v in values],
                drawstyle="steps-post", color=cmap(0.85 * r / max(1, p - 1)),
                linewidth=1.5, label=f"rank {r}")
    ax.set_ylabel(label, fontsize=8)
    ax.set_ylim(bottom=0, top=max(peak * mfactor * 1.12, 1e-9))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 5, 10]))
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(ranks), fontsize=8,
              frameon=False, borderaxespad=0.1, handlelength=1.4, columnspacing=1.2)


def _legend_handles(timelines: Sequence[Timeline]) -> list:
    kinds = {k for t in timelines for k in t.kinds}
    handles = [Patch(facecolor=kind_color(k), label=f"{k}  {KIND_NAMES[k]}")
               for k in KIND_ORDER if k in kinds]
    chunks = max((max(chunk_of_stage(t), default=0) + 1 for t in timelines), default=1)
    # A rank's later stages are darker: its later chunks, or (DualPipe: one stage per rank
    # per chain) its stage of the second model copy.
    word = "chain" if all(t.chunks == 1 and t.chains > 1 for t in timelines) else "chunk"
    for c in range(1, chunks):
        handles.append(Patch(facecolor=kind_color("F", c, chunks),
                             label=f"{word} 1 (darker shade)" if chunks == 2 else f"{word} {c}"))
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    if any(any(t.overlapped) for t in timelines):
        handles.append(Patch(facecolor="white", edgecolor=OVERLAP_EDGE, linewidth=1.3,
                             label="overlapped F&B pair"))
    if any(t.has_a2a for t in timelines):
        handles.append(Patch(facecolor=A2A_HIDDEN, edgecolor=A2A_EXPOSED, hatch="////",
                             linewidth=0.0, label="all-to-all hidden"))
        handles.append(Patch(facecolor=A2A_EXPOSED, label="all-to-all exposed"))
    return handles


LEGEND_COLUMNS = 7


def _legend_height(timelines: Sequence[Timeline]) -> float:
    """Inches for the legend under the chart: one line per 7 entries."""
    rows = -(-len(_legend_handles(timelines)) // LEGEND_COLUMNS)
    return 0.18 + 0.22 * rows


def _finish(fig: Figure, where: dict, timelines: Sequence[Timeline], unit: str) -> None:
    """x label and the legend under the bottom axes."""
    bottom, h = where["legend"]
    handles = _legend_handles(timelines)
    fig.legend(handles=handles, loc="center", ncol=min(LEGEND_COLUMNS, len(handles)),
               frameon=False, fontsize=9, bbox_to_anchor=(0.5, bottom + h / 2),
               handlelength=1.4, columnspacing=1.4)
    b, h = where["xlabel"]
    left = LEFT_IN / WIDTH_IN
    fig.text(left + (1 - left - RIGHT_IN / WIDTH_IN) / 2, b + h * 0.2, f"time ({unit})",
             ha="center", va="bottom", fontsize=9)


# ---- figures -------------------------------------------------------------------------------
def gantt_figure(timeline: Timeline, title: str | None = None, memory: bool = False) -> Figure:
    """The Gantt chart of one timeline; with ``memory`` its memory curves stacked under it.

    The title is ``title`` (default: schedule, p, m, v) over the step time and the bubble.
    """
    factor, unit = timeline_time_scale([timeline])
    row = row_height(timeline.num_ranks)
    stack = _Stack()
    stack.add("title", 0.62)
    stack.add("gantt", row * timeline.num_ranks)
    if memory:
        stack.add("gap", 0.3)
        stack.add("memory", MEMORY_IN)
    stack.add("xlabel", 0.5)
    stack.add("legend", _legend_height([timeline]))
    fig, where = stack.build()
    ax = _Stack.axes(fig, where["gantt"])
    xmax = max(timeline.step_time * factor, 1e-12)
    draw_gantt(ax, timeline, factor=factor, xmax=xmax, row_in=row)
    if memory:
        ax.tick_params(axis="x", labelbottom=False)
        mem = _Stack.axes(fig, where["memory"], sharex=ax)
        draw_memory(mem, timeline, factor=factor)
        mem.set_xlim(0, xmax)
    b, h = where["title"]
    fig.text(LEFT_IN / WIDTH_IN, b + h * 0.62, title or describe(timeline), fontsize=11,
             fontweight="bold", va="bottom")
    fig.text(LEFT_IN / WIDTH_IN, b + h * 0.55, headline(timeline, factor, unit)
             + f" · lower bound {timeline.lower_bound * factor:.4g} {unit}"
             + f" · {timeline.source}", fontsize=9, va="top", color="#333333")
    _finish(fig, where, [timeline], unit)
    return fig


def memory_figure(timeline: Timeline, title: str | None = None) -> Figure:
    """Activation memory per rank over the step, alone."""
    factor, unit = timeline_time_scale([timeline])
    stack = _Stack()
    stack.add("title", 0.6)
    stack.add("memory", 2.4)
    stack.add("xlabel", 0.55)
    fig, where = stack.build()
    ax = _Stack.axes(fig, where["memory"])
    draw_memory(ax, timeline, factor=factor)
    ax.set_xlim(0, max(timeline.step_time * factor, 1e-12))
    b, h = where["title"]
    peaks = [s.peak_memory for s in timeline.rank_stats()]
    mfactor, _ = memory_scale(timeline, max(peaks, default=0.0))
    fig.text(LEFT_IN / WIDTH_IN, b + h * 0.3, (title or describe(timeline))
             + f" · activation memory, peak {max(peaks, default=0) * mfactor:.4g} on rank "
             f"{peaks.index(max(peaks)) if peaks else 0}", fontsize=11, fontweight="bold")
    b, h = where["xlabel"]
    fig.text(0.5, b + h * 0.1, f"time ({unit})", ha="center", va="bottom", fontsize=9)
    return fig


def timelines_figure(
    timelines: Sequence[Timeline],
    labels: Sequence[str] | None = None,
    title: str | None = None,
    memory: bool = False,
) -> Figure:
    """Several timelines stacked on one time axis: predicted over measured, or schedules.

    Each panel is titled with its label, step time and bubble; all share the x axis, so a
    shorter step ends visibly earlier. With ``memory`` each chart has its memory curves
    under it, on one memory scale when the timelines share units (GPipe's m against
    1F1B's p at a glance).
    """
    if not timelines:
        raise ValueError("timelines_figure needs at least one timeline")
    labels = list(labels) if labels is not None else default_labels(timelines)
    if len(labels) != len(timelines):
        raise ValueError(f"{len(labels)} labels for {len(timelines)} timelines")
    factor, unit = timeline_time_scale(timelines)
    row = row_height(sum(t.num_ranks for t in timelines))
    stack = _Stack()
    stack.add("title", 0.45 if title else 0.1)
    for k, t in enumerate(timelines):
        stack.add(f"head{k}", 0.3)
        stack.add(f"gantt{k}", row * t.num_ranks)
        if memory:
            stack.add(f"memgap{k}", 0.3)
            stack.add(f"memory{k}", 1.2)
        stack.add(f"gap{k}", 0.12)
    stack.add("xlabel", 0.5)
    stack.add("legend", _legend_height(timelines))
    fig, where = stack.build()
    xmax = max(max(t.step_time for t in timelines) * factor, 1e-12)
    first = None
    mem_axes = []
    for k, t in enumerate(timelines):
        ax = _Stack.axes(fig, where[f"gantt{k}"], sharex=first)
        first = first or ax
        draw_gantt(ax, t, factor=factor, xmax=xmax, row_in=row)
        if memory:
            ax.tick_params(axis="x", labelbottom=False)
            ax = _Stack.axes(fig, where[f"memory{k}"], sharex=first)
            draw_memory(ax, t, factor=factor)
            mem_axes.append(ax)
        if k < len(timelines) - 1:
            ax.tick_params(axis="x", labelbottom=False)
        b, h = where[f"head{k}"]
        fig.text(LEFT_IN / WIDTH_IN, b + h * 0.2, labels[k], fontsize=10, fontweight="bold",
                 va="bottom")
        fig.text(1 - RIGHT_IN / WIDTH_IN, b + h * 0.2, headline(t, factor, unit), fontsize=9,
                 ha="right", va="bottom", color="#333333")
    if mem_axes and len({a.get_ylabel() for a in mem_axes}) == 1:
        top = max(a.get_ylim()[1] for a in mem_axes)
        for a in mem_axes:
            a.set_ylim(0, top)
    first.set_xlim(0, xmax)
    if title:
        b, h = where["title"]
        fig.text(LEFT_IN / WIDTH_IN, b + h * 0.3, title, fontsize=11, fontweight="bold")
    _finish(fig, where, timelines, unit)
    return fig


def default_labels(timelines: Sequence[Timeline]) -> list[str]:
    """Schedule names when they differ, sources when they differ, else both and an index."""
    names = [t.schedule for t in timelines]
    if len(set(names)) == len(names):
        return names
    sources = [t.source for t in timelines]
    if len(set(sources)) == len(sources):
        return [f"{t.schedule} ({t.source})" for t in timelines]
    return [f"{k}: {t.schedule} ({t.source})" for k, t in enumerate(timelines)]


def save(fig: Figure, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``fig`` to ``path`` (format from ``fmt`` or the file's suffix); return the path."""
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower() or "png"
    if fmt not in ("png", "svg", "pdf"):
        raise UserError(f"cannot save a figure as {fmt!r}; valid are png, svg, pdf")
    from ..files import open_output

    meta = {"Software": None} if fmt == "png" else ({"Date": None} if fmt == "svg" else None)
    with open_output(path, f"--{fmt}", "wb") as f:  # every path check and error in one place
        fig.savefig(f, format=fmt, dpi=DPI, metadata=meta)
    return path
