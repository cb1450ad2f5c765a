"""Tables that fit the terminal without cutting a value: headers give way, cells never do.

rich shrinks a table that is wider than the terminal by wrapping and then cutting its cells
(``4.5… s``, ``sch…``), which turns numbers into wrong numbers. :func:`fit_table` instead
tries, in order, until the table's natural width fits:

1. the full headers, wrapped at their spaces (``peak`` over ``memory``), in a boxed table;
2. the short headers (``recomp.`` for ``recompute``; a line under the table spells each
   one out);
3. both again without the box, two spaces between columns;
4. the columns split over several tables, each repeating the first ``keys`` columns (the
   row's name), one after the other.

Every cell keeps its full text on one line in every step: a value is never wrapped,
abbreviated or cut. ``Column.numeric`` only sets the default alignment (right).

A command that already builds a ``rich.table.Table`` prints ``fit(table, console.width)``
instead of the table: the same columns, rows and title, with the short headers of
:data:`SHORT` (or its own).

>>> from rich.console import Console
>>> console = Console(width=30, record=True, color_system=None)
>>> cols = [Column("#"), Column("schedule", "sched.", numeric=False),
...         Column("step time"), Column("peak memory", "mem")]
>>> rows = [["1", "interleaved-1f1b", "4.563 s", "80.0 GiB"]]
>>> console.print(fit_table(cols, rows, 30))  # doctest: +NORMALIZE_WHITESPACE
#  sched.            step time
──────────────────────────────
1  interleaved-1f1b    4.563 s
#       mem
───────────
1  80.0 GiB
sched.: schedule; mem: peak
memory
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    """One column: its ``header``, a ``short`` header for narrow terminals, and whether it
    holds numbers (right-aligned) or names (left-aligned)."""

    header: str
    short: str | None = None
    numeric: bool = True

    def title(self, short: bool) -> str:
        return self.short if short and self.short else self.header


_STYLES = (  # (short headers, boxed with an edge, padding)
    (False, True, (0, 1)),
    (True, True, (0, 1)),
    (False, False, (0, 0)),
    (True, False, (0, 0)),
)


def _widest(cells: Sequence[str]) -> str:
    return max(cells, key=cell_len, default="")


def _build(columns: Sequence[Column], rows: Sequence[Sequence[str]], short: bool, edge: bool,
           padding: tuple[int, int], widths: Sequence[int], title: str | None,
           caption: str | None, styles: Sequence[str | None] | None) -> Table:
    table = Table(title=title, caption=caption, box=box.HEAVY_HEAD if edge else box.SIMPLE_HEAD,
                  show_edge=edge, padding=padding if edge else (0, 1),
                  collapse_padding=not edge, pad_edge=edge)
    for col, width in zip(columns, widths, strict=True):
        table.add_column(col.title(short), justify="right" if col.numeric else "left",
                         no_wrap=True, min_width=width, overflow="fold")
    for i, row in enumerate(rows):
        table.add_row(*row, style=styles[i] if styles else None)
    return table


def _width(table: Table) -> int:
    console = Console(width=1_000_000)
    return console.measure(table).maximum


def _column_widths(columns: Sequence[Column], rows: Sequence[Sequence[str]],
                   short: bool) -> list[int]:
    """Each column as wide as its widest cell and its header's longest word (headers wrap
    at spaces, so a header never needs more)."""
    out = []
    for j, col in enumerate(columns):
        words = col.title(short).split() or [""]
        out.append(max(cell_len(_widest([row[j] for row in rows])), *map(cell_len, words)))
    return out


def _probe(columns: Sequence[Column], rows: Sequence[Sequence[str]], short: bool, edge: bool,
           padding: tuple[int, int], widths: Sequence[int]) -> int:
    """The natural width of the table, measured on one row of each column's widest cell
    (a 100,000-row profile is measured as fast as a 5-row plan)."""
    widest = [_widest([row[j] for row in rows]) for j in range(len(columns))]
    return _width(_build(columns, [widest], short, edge, padding, widths, None, None, None))


def _legend(columns: Sequence[Column]) -> str:
    """``recomp.: recompute; mem: peak memory`` for the short headers in use."""
    return "; ".join(f"{c.short}: {c.header}" for c in columns
                     if c.short and c.short != c.header)


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
              title: str | None = None, caption: str | None = None, keys: int = 1,
              row_styles: Sequence[str | None] | None = None) -> RenderableType:
    """A rich renderable of ``rows`` under ``columns`` at most ``width`` cells wide (see the
    module doc), every cell whole. ``keys``: leading columns repeated when the table has
    to be split. ``row_styles``: a style per row (e.g. ``"bold"`` for a total)."""
    rows = [[str(c) for c in row] for row in rows]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns")
    for short, edge, padding in _STYLES:
        widths = _column_widths(columns, rows, short)
        if _probe(columns, rows, short, edge, padding, widths) <= width:
            table = _build(columns, rows, short, edge, padding, widths, title, caption,
                           row_styles)
            return Group(table, Text(_legend(columns))) if short else table
    # split: key columns + as many others as fit, table after table
    short, edge, padding = _STYLES[-1]
    widths = _column_widths(columns, rows, short)
    key_idx = list(range(min(keys, len(columns))))
    rest = [j for j in range(len(columns)) if j not in key_idx]
    groups: list[list[int]] = []
    current: list[int] = []
    for j in rest:
        trial = key_idx + current + [j]
        cols = [columns[k] for k in trial]
        sub = [[row[k] for k in trial] for row in rows]
        if current and _probe(cols, sub, short, edge, padding,
                              [widths[k] for k in trial]) > width:
            groups.append(current)
            current = [j]
        else:
            current.append(j)
    if current or not groups:
        groups.append(current)
    parts: list[RenderableType] = []
    for n, group in enumerate(groups):
        idx = key_idx + group
        parts.append(_build([columns[k] for k in idx], [[row[k] for k in idx] for row in rows],
                            short, edge, padding, [widths[k] for k in idx],
                            title if n == 0 else None,
                            caption if n == len(groups) - 1 else None, row_styles))
    if legend := _legend(columns):
        parts.append(Text(legend))
    return Group(*parts)


SHORT = {
    "schedule": "sched.", "recompute": "recomp.", "samples/s": "smp/s", "bubble": "bub.",
    "all-reduce": "AR", "peak memory": "mem", "mb size": "mbs", "layer": "#",
    "forward": "fwd", "backward": "bwd", "activations": "act.", "processes": "procs",
    "predicted": "pred.", "measured (median)": "meas.", "vs best measured": "vs best",
    "fastest step": "fastest", "sharding": "shard.", "tok/s/GPU": "tok/s", "memory": "mem",
}
"""Short headers for the columns pipebubble's tables use (``fit`` looks a header up here)."""


def fit(table: Table, width: int, short: dict[str, str] | None = None,
        keys: int = 1) -> RenderableType:
    """``table`` (a built ``rich.table.Table`` of plain-text cells) re-laid out by
    :func:`fit_table` to at most ``width`` columns: its headers, alignment (right-justified
    columns count as numbers), rows, row styles, title and caption are kept."""
    names = {**SHORT, **(short or {})}
    columns = [Column(str(c.header), names.get(str(c.header)), numeric=c.justify == "right")
               for c in table.columns]
    cells = [[_plain(cell) for cell in c._cells] for c in table.columns]
    rows = [list(row) for row in zip(*cells, strict=True)] if cells else []
    styles = [getattr(r, "style", None) for r in table.rows]
    return fit_table(columns, rows, width, title=_plain(table.title) or None,
                     caption=_plain(table.caption) or None, keys=keys,
                     row_styles=styles if any(styles) else None)


def _plain(cell: object) -> str:
    """A cell as its text: markup strings rendered to plain text, ``Text`` as its plain."""
    if cell is None:
        return ""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain
