"""Terminal Gantt chart and summary tables (rich).

One row per rank, time across. Each action fills the cells its time covers, coloured by kind
and labelled with kind and microbatch (``F3``) when it is wide enough; idle cells are a dim
dot. A long timeline is scaled to the terminal width rather than wrapped.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..timeline import Timeline

# Background colours per kind; chunks > 0 use the second shade.
STYLES = {
    "F": ("white on blue", "white on dark_blue"),
    "B": ("black on dark_orange", "black on orange4"),
    "I": ("black on cyan", "black on dark_cyan"),
    "W": ("black on green", "black on dark_green"),
}
IDLE = ("·", "grey37")
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


def gantt(timeline: Timeline, width: int | None = None, title: str | None = None) -> Group:
    """A rich renderable: the Gantt chart, its time axis and a legend.

    ``width`` is the number of columns for the time axis (default: fit the terminal).
    """
    label_w = len(f"rank {timeline.num_ranks - 1}") + 1
    fit = max(20, Console().width - label_w - 1)
    width = fit if width is None else max(10, min(width, fit))
    step = timeline.step_time or 1.0
    t0 = min(timeline.start, default=0.0)
    # Prefer a whole number of columns per time unit (at most 6) when the timeline fits.
    cols = width
    scale = cols / step
    if step == int(step) and step <= width:
        scale = float(min(6, width // int(step)))
        cols = int(step * scale)
    chunk = chunk_of_stage(timeline)
    lines = []
    for r in range(timeline.num_ranks):
        cells: list[tuple[str, str] | None] = [None] * cols
        labels: list[tuple[int, int, str, str]] = []
        for e in timeline.events(r):
            c0 = int(round((e.start - t0) * scale))
            c1 = max(c0 + 1, int(round((e.end - t0) * scale)))
            c1 = min(c1, cols)
            style = STYLES.get(e.kind, ("white on magenta",) * 2)[min(chunk[e.stage], 1)]
            for c in range(c0, c1):
                cells[c] = (" ", style)
            labels.append((c0, c1, f"{e.kind}{e.microbatch}", style))
        for c0, c1, text, style in labels:
            if c1 - c0 > len(text):  # a label only with a blank before it: never run together
                for i, ch in enumerate(text):
                    cells[c0 + 1 + i] = (ch, style)
            elif c1 - c0 >= 1:
                cells[c0] = (text[0], style)
        line = Text(f"rank {r}".ljust(label_w))
        for cell in cells:
            line.append(*(cell if cell is not None else IDLE))
        lines.append(line)
    unit = "s" if timeline.source == "measured" else ""
    end_label = f"{step:.4g}{unit}"
    axis = Text(" " * label_w + "0".ljust(max(1, cols - len(end_label))) + end_label, style="dim")
    legend = Text(" " * label_w)
    kinds = sorted(set(timeline.kind), key="FIBW".index) if timeline.kind else []
    for k in kinds:
        legend.append(f" {k} ", STYLES[k][0])
        legend.append(f" {KIND_NAMES[k]}  ")
    legend.append("·", IDLE[1])
    legend.append(" idle")
    if timeline.chunks > 1:
        legend.append("   darker = later chunk")
    parts = [Text(title, style="bold")] if title else []
    return Group(*parts, *lines, axis, legend)


def summary_table(timeline: Timeline, closed_form: float | None = None) -> Table:
    """Per-rank busy, idle, bubble, span and peaks, then the overall figures.

    A measured timeline's times are seconds and its memory bytes: shown as ms and KiB/MiB.
    """
    measured = timeline.source == "measured"
    table = Table(title=None, show_edge=False)
    for col in ("rank", "busy", "idle", "bubble", "span", "peak act.", "peak mem"):
        table.add_column(col, justify="right")
    for s in timeline.rank_stats():
        table.add_row(
            str(s.rank), _time(s.busy, measured), _time(s.idle, measured),
            f"{s.bubble_fraction:.2%}", _time(s.span, measured), str(s.peak_activations),
            _memory(s.peak_memory, measured),
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


def summary_lines(timeline: Timeline, closed_form: float | None = None) -> list[str]:
    measured = timeline.source == "measured"
    lines = [
        f"step time {_time(timeline.step_time, measured)}   lower bound "
        f"{_time(timeline.lower_bound, measured)}",
        f"bubble {timeline.bubble_fraction:.2%}"
        + (f" (closed form {closed_form:.2%})" if closed_form is not None else ""),
    ]
    return lines
