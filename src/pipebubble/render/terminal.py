"""Terminal Gantt chart and summary tables (rich).

One row per rank, time across. Each action fills the cells its time covers, coloured by kind
and labelled with kind and microbatch (``F3``) when it is wide enough; idle cells are a dim
dot. A long timeline is scaled to the terminal width rather than wrapped.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from rich.console import Console, Group
from rich.table import Table
from rich.text import Span, Text

from ..timeline import Timeline

# Background colours per kind; chunks > 0 use the second shade.
STYLES = {
    "F": ("white on blue", "white on dark_blue"),
    "B": ("black on dark_orange", "black on orange4"),
    "I": ("black on cyan", "black on dark_cyan"),
    "W": ("black on green", "black on dark_green"),
}
IDLE = ("·", "grey37")
_POWERS_OF_TEN = 10 ** np.arange(1, 19)
KIND_NAMES = {"F": "forward", "B": "backward (I+W)", "I": "backward input", "W": "backward weight"}


def chunk_of_stage(timeline: Timeline) -> list[int]:
    """Index of each stage among the stages of its rank (0 for the first chunk)."""
    seen: dict[int, int] = {}
    out = []
    for s in range(timeline.num_stages):
        r = timeline.stage_to_rank[s]
        out.append(seen.get(r, 0))
        seen[r] = seen.get(r, 0) + 1
    return out


def gantt(timeline: Timeline, width: int | None = None, title: str | None = None,
          styled: bool = True) -> Group:
    """A rich renderable: the Gantt chart, its time axis and a legend.

    ``width`` is the number of columns for the time axis (default: fit the terminal).
    Each row costs a few numpy operations over the rank's events and Python work per
    column only, so a million-action timeline draws as fast as a small one. ``styled``
    False leaves the rows' colours out (for a console without colours, which would drop
    them: the same text, without the work of a style per run of cells).
    """
    label_w = len(f"rank {timeline.num_ranks - 1}") + 1
    fit = max(20, Console().width - label_w - 1)
    width = fit if width is None else max(10, min(width, fit))
    step = timeline.step_time or 1.0
    columns = _Columns.of(timeline)
    t0 = float(columns.start.min()) if len(timeline.start) else 0.0
    # Prefer a whole number of columns per time unit (at most 6) when the timeline fits.
    cols = width
    scale = cols / step
    if step == int(step) and step <= width:
        scale = float(min(6, width // int(step)))
        cols = int(step * scale)
    chunk = chunk_of_stage(timeline)
    lines = []
    for r in range(timeline.num_ranks):
        # one Text per row with a span per run: what appending run by run builds, without
        # rich's per-append work (a million-action row has a run per label)
        cells = _cells(timeline, r, t0, scale, cols, chunk, columns)
        if not styled:
            lines.append(Text(f"rank {r}".ljust(label_w) + "".join(ch for ch, _ in cells)))
            continue
        parts, spans, at = [f"rank {r}".ljust(label_w)], [], label_w
        for text, style in _runs(cells):
            parts.append(text)
            spans.append(Span(at, at + len(text), style))
            at += len(text)
        lines.append(Text("".join(parts), spans=spans))
    unit = "s" if timeline.source == "measured" else ""
    end_label = f"{step:.4g}{unit}"
    axis = Text(" " * label_w + "0".ljust(max(1, cols - len(end_label))) + end_label, style="dim")
    legend = Text(" " * label_w)
    kinds = sorted(timeline.kinds, key="FIBW".index)
    for k in kinds:
        legend.append(f" {k} ", STYLES[k][0])
        legend.append(f" {KIND_NAMES[k]}  ")
    legend.append("·", IDLE[1])
    legend.append(" idle")
    if any(chunk):  # a rank holds several stages: chunks, or DualPipe's two chains
        legend.append("   darker = the rank's later stage"
                      + (" (second chain)" if len(timeline.chain_starts) > 1 else " (chunk)"))
    parts = [Text(title, style="bold")] if title else []
    return Group(*parts, *lines, axis, legend)


def _cells(timeline: Timeline, r: int, t0: float, scale: float, cols: int,
           chunk: list[int], columns: _Columns | None = None) -> list[tuple[str, str]]:
    """Rank ``r``'s row: one (character, style) per column.

    Each event fills the columns ``c0 = round(start x scale)`` up to ``c1 = round(end x
    scale)`` (at least one; a later event paints over an earlier one) and writes its label
    (``F3``) there after one blank column when it has room for both (so two labels never
    run together), or only its first letter when it does not. Events are in time order, so
    ``c0`` and ``c1`` only grow along a row and the owner of column c is the last event with
    ``c0 <= c``, if its ``c1 > c``.

    Only a few events per column can show: the last to start in each column (it owns the
    column, or its first letter is there), the last letter-only one in each column, and
    those long enough for a label. A row of many short events paints those only (a handful
    of passes over its starts and ends, then work per column); :func:`_paint` gives each
    the same cells as painting every event would. ``columns``: the timeline's
    :class:`_Columns` (built here when not given).
    """
    lo, hi = timeline.offsets[r], timeline.offsets[r + 1]
    col = _Columns.of(timeline) if columns is None else columns
    start, end = col.start[lo:hi], col.end[lo:hi]
    c0 = np.rint((start - t0) * scale).astype(np.int64)
    if hi - lo > 1 and not (c0[0] >= 0 and np.isfinite(start[[0, -1]]).all()
                            and np.isfinite(end[[0, -1]]).all()
                            and (start[1:] >= start[:-1]).all() and (end[1:] >= end[:-1]).all()):
        # not in time order (or before t0, or not finite): as painting every event
        c1 = np.minimum(np.maximum(c0 + 1, np.rint((end - t0) * scale).astype(np.int64)), cols)
        if len(c1) > 1 and (np.diff(c1) < 0).any():  # events overlap (a measured oddity)
            return _cells_one_by_one(timeline, lo, hi, c0.tolist(), c1.tolist(), cols, chunk)
        return _paint(timeline, lo, np.arange(hi - lo), c0, c1, t0, scale, cols, chunk, col)
    # Starts and ends in time order: c0 and c1 only grow. The events that can show: the
    # last to start at or before each column, and those long enough for a label (which
    # needs round(end) - round(start) >= 3, so more than 1.5 columns) with the event
    # before each (the last letter-only one of its column may be followed by labelled ones).
    column = np.arange(cols)
    last = np.searchsorted(c0, column, side="right") - 1
    long = np.flatnonzero((end - start) * scale > 1.5)
    shows = np.zeros(hi - lo, dtype=bool)
    shows[last[last >= 0]] = shows[long] = True
    shows[long[long > 0] - 1] = True
    keep = np.flatnonzero(shows)
    c0 = c0[keep]
    c1 = np.minimum(np.maximum(c0 + 1, np.rint((end[keep] - t0) * scale).astype(np.int64)),
                    cols)
    return _paint(timeline, lo, keep, c0, c1, t0, scale, cols, chunk, col)


class _Columns(NamedTuple):
    """A timeline's starts, ends and microbatches as numpy arrays, read once per chart
    (the simulator's C arrays without a copy)."""

    start: np.ndarray
    end: np.ndarray
    microbatch: np.ndarray

    @classmethod
    def of(cls, timeline: Timeline) -> _Columns:
        return cls(np.asarray(timeline.start, dtype=np.float64),
                   np.asarray(timeline.end, dtype=np.float64),
                   np.asarray(timeline.microbatch, dtype=np.int64))


def _paint(timeline: Timeline, lo: int, events: np.ndarray, c0: np.ndarray, c1: np.ndarray,
           t0: float, scale: float, cols: int, chunk: list[int],
           col: _Columns) -> list[tuple[str, str]]:
    """The row's cells from ``events`` (indices into the rank's events, ascending, with
    their ``c0`` and ``c1``, both non-decreasing): each column's owner is the last of them
    with ``c0 <= c`` (if its ``c1 > c``); labels as :func:`_cells` says."""
    column = np.arange(cols)
    owner = np.searchsorted(c0, column, side="right") - 1  # last event starting at or before
    owner = np.where((owner >= 0) & (c1[np.maximum(owner, 0)] > column), owner, -1)
    # Labels: wide enough events write "F3" (padded), the others their first letter at c0.
    mb = col.microbatch[lo + events]
    text_len = 2 + np.searchsorted(_POWERS_OF_TEN, mb, side="right")  # "F" and the digits
    room = c1 - c0
    wide = np.flatnonzero(room > text_len)
    narrow = np.flatnonzero((room <= text_len) & (room >= 1))
    writer = np.full(cols + 1, -1, dtype=np.int64)  # the last event whose label covers c
    offset = np.zeros(cols + 1, dtype=np.int64)  # which character of that label
    at = c0[narrow]
    last = np.flatnonzero(np.diff(at, append=at[-1] + 1 if len(at) else 0) != 0)
    writer[at[last]] = narrow[last]
    for e in wide.tolist():  # at most one per two columns
        first = int(c0[e]) + 1  # the blank before the label
        span = slice(first, first + int(text_len[e]))
        later = writer[span] < e
        writer[span] = np.where(later, e, writer[span])
        offset[span] = np.where(later, np.arange(int(text_len[e])), offset[span])
    cells = []
    kind, stage, micro = timeline.kind, timeline.stage, timeline.microbatch
    index = (lo + events).tolist()
    for e, w, k in zip(owner.tolist(), writer[:cols].tolist(), offset[:cols].tolist(),
                       strict=True):
        if w >= 0:  # labels are written over the fills
            i = index[w]
            cells.append((f"{kind[i]}{micro[i]}"[k], _style(kind[i], chunk[stage[i]])))
        elif e >= 0:
            i = index[e]
            cells.append((" ", _style(kind[i], chunk[stage[i]])))
        else:
            cells.append(IDLE)
    return cells


def _cells_one_by_one(timeline: Timeline, lo: int, hi: int, c0: list[int], c1: list[int],
                      cols: int, chunk: list[int]) -> list[tuple[str, str]]:
    """:func:`_cells` the plain way, event by event (for rows whose events overlap)."""
    cells: list[tuple[str, str]] = [IDLE] * cols
    labels = []
    for i, a, b in zip(range(lo, hi), c0, c1, strict=True):
        style = _style(timeline.kind[i], chunk[timeline.stage[i]])
        cells[a:b] = [(" ", style)] * max(0, b - a)
        labels.append((a, b, f"{timeline.kind[i]}{timeline.microbatch[i]}", style))
    for a, b, text, style in labels:
        if b - a > len(text):  # a label only with a blank before it
            for j, ch in enumerate(text):
                cells[a + 1 + j] = (ch, style)
        elif b - a >= 1:
            cells[a] = (text[0], style)
    return cells


def _style(kind: str, chunk: int) -> str:
    return STYLES.get(kind, ("white on magenta",) * 2)[min(chunk, 1)]


def _runs(cells: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Neighbouring cells of one style joined: fewer segments for rich to lay out."""
    runs: list[tuple[str, str]] = []
    for ch, style in cells:
        if runs and runs[-1][1] == style:
            runs[-1] = (runs[-1][0] + ch, style)
        else:
            runs.append((ch, style))
    return runs


def summary_table(timeline: Timeline, closed_form: float | None = None) -> Table:
    """Per-rank busy, idle, bubble, span and peaks, then the overall figures.

    A measured timeline's times are seconds and its memory bytes: shown as ms and KiB/MiB.
    """
    measured = timeline.source == "measured"
    comm = timeline.has_a2a
    table = Table(title=None, show_edge=False)
    for col in ("rank", "busy", "idle", "bubble", "span", "peak act.", "peak mem",
                *(("a2a hidden", "a2a exposed") if comm else ())):
        table.add_column(col, justify="right")
    for s in timeline.rank_stats():
        table.add_row(
            str(s.rank), _time(s.busy, measured), _time(s.idle, measured),
            f"{s.bubble_fraction:.2%}", _time(s.span, measured), str(s.peak_activations),
            _memory(s.peak_memory, measured),
            *((_time(s.a2a_hidden or 0.0, measured), _time(s.a2a_exposed or 0.0, measured))
              if comm else ()),
        )
    return table


def _time(t: float, measured: bool) -> str:
    """Seconds as ms (µs below 0.1 ms) for a measured run; model units as they are."""
    if not measured:
        return f"{t:.4g}"
    return f"{t * 1e3:.3f} ms" if abs(t) >= 1e-4 or t == 0 else f"{t * 1e6:.1f} µs"


def _memory(n: float, measured: bool) -> str:
    """Bytes as B/KiB/MiB/GiB for a measured run; rank-shares of M_B as they are."""
    if not measured:
        return f"{n:.4g}"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def summary_lines(timeline: Timeline, closed_form: float | None = None,
                  bound: tuple[float, str] | None = None,
                  unit: str | None = None) -> list[str]:
    """Step time, lower bound and bubble. ``bound``: a provable lower bound and its kind
    (auto's) instead of the timeline's busiest rank, with the gap to it. A measured
    timeline's times are seconds (shown as ms); a simulated one's are in the unit of its cost
    model, which ``unit`` names (e.g. ``"in the time unit of --f/--b/--w/--comm"``)."""
    measured = timeline.source == "measured"
    lower = (f"{_time(timeline.lower_bound, measured)}" if bound is None else
             f"{_time(bound[0], measured)} ({bound[1]}), gap "
             f"{timeline.step_time / bound[0] - 1 if bound[0] > 0 else 0.0:.2%}")
    lines = [
        f"step time {_time(timeline.step_time, measured)}   lower bound {lower}"
        + (f"   ({unit})" if unit and not measured else ""),
        f"bubble {timeline.bubble_fraction:.2%}"
        + (f" (closed form {closed_form:.2%})" if closed_form is not None else ""),
    ]
    if timeline.has_a2a:
        stats = timeline.rank_stats()
        hidden = sum(s.a2a_hidden or 0.0 for s in stats)
        exposed = sum(s.a2a_exposed or 0.0 for s in stats)
        whole = hidden + exposed
        lines.append(f"all-to-all {_time(whole, measured)} over the ranks: "
                     f"{_time(hidden, measured)} hidden in overlapped F&B pairs "
                     f"({hidden / whole if whole > 0 else 0.0:.0%}), "
                     f"{_time(exposed, measured)} exposed")
    return lines
