"""Tables at 80 columns: headers give way, values never do (render/table.py).

The property: at any width where each column fits beside the key column, every line of the
table is at most that wide and every cell's text appears whole on one line, never cut
(``4.5… s``) or wrapped. Then the two tables a new user met cut at 80 columns: ``plan``'s
(every number of each plan in ``plan --json`` appears whole in the text) and ``profile``'s
(every layer's name and figures).
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from pipebubble.render.table import Column, fit_table

CELL = st.text(alphabet="0123456789.,%-sGiBmµ abcdefghij", min_size=1, max_size=12).map(
    str.strip).filter(bool)


def render(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@given(st.integers(1, 14).flatmap(lambda n: st.tuples(
    st.lists(st.text(alphabet="abcdefgh /()", min_size=1, max_size=18).filter(str.strip),
             min_size=n, max_size=n),
    st.lists(st.lists(CELL, min_size=n, max_size=n), min_size=1, max_size=6))),
    st.integers(30, 160))
def test_every_cell_is_whole_and_no_line_is_too_wide(table, width):
    headers, rows = table
    columns = [Column(h, h[:3]) for h in headers]
    text = render(fit_table(columns, rows, width, title="a title"), width)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width
    assert "…" not in text
    for row in rows:
        for cell in row:
            assert any(cell in line for line in lines), (cell, text)
    # each row's cells sit on one line of each (sub)table, in order
    for row in rows:
        key = row[0]
        assert any(line.lstrip("│┃ ").startswith(key) for line in lines)


def test_a_wide_enough_terminal_keeps_the_full_headers():
    columns = [Column("#"), Column("peak memory", "mem")]
    text = render(fit_table(columns, [["1", "80.0 GiB"]], 80), 80)
    assert "peak memory" in text and "mem:" not in text


def test_short_headers_are_spelled_out_below():
    columns = [Column("#")] + [Column(f"column number {i}", f"c{i}") for i in range(8)]
    text = " ".join(render(fit_table(columns, [["1"] + ["123.4 ms"] * 8], 80), 80).split())
    assert "c0: column number 0" in text and "c7: column number 7" in text


def _wide_cells(text: str) -> list[list[str]]:
    """The data rows of the boxed tables in ``text`` (a render wide enough for every table
    to keep its full layout), as lists of cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("│") and line.rstrip().endswith("│"):
            rows.append([c.strip() for c in line.strip().strip("│").split("│")])
    return rows


def _assert_whole_at_80(run_cli, monkeypatch, args: list[str], until: str = "\0") -> str:
    """Render ``args`` wide and at 80 columns: every cell of the wide tables appears whole
    on one line of the narrow output, and no line of the tables (the output before
    ``until``) is over 80 columns."""
    monkeypatch.setenv("COLUMNS", "300")
    rc, wide, _ = run_cli(*args)
    assert rc == 0
    rows = _wide_cells(wide.split(until)[0])
    assert rows, wide
    monkeypatch.setenv("COLUMNS", "80")
    rc, text, _ = run_cli(*args)
    assert rc == 0
    lines = text.split(until)[0].splitlines()
    assert "…" not in text
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    for row in rows:
        for cell in row:
            assert any(cell in line for line in lines), (cell, row)
    return text


def test_plan_table_at_80_columns_shows_every_number_whole(run_cli, tmp_path, monkeypatch):
    from pipebubble.commands.plan import _t

    prof = tmp_path / "p.json"
    rc, _, _ = run_cli("profile", "--analytic", "--layers", "8", "--hidden", "1024", "--ffn",
                       "4096", "--heads", "16", "--vocab", "32000", "--seq", "2048",
                       "--tflops", "300", "--mfu", "0.4", "--out", str(prof))
    assert rc == 0
    args = ["plan", "--profile", str(prof), "--gpus", "8", "--gpu-memory", "24GiB",
            "--global-batch", "32", "--top", "5"]
    rc, out, _ = run_cli(*args, "--json")
    assert rc == 0
    plans = json.loads(out)["plans"]
    text = _assert_whole_at_80(run_cli, monkeypatch, args, until="best:")
    table = text.split("best:")[0]
    for plan in plans[:5]:  # the JSON's own numbers, as the table prints them
        assert _t(plan["predicted_step_time"]) in table
        assert f"{plan['bubble_fraction']:.1%}" in table


def test_profile_table_at_80_columns_shows_every_value_whole(run_cli, monkeypatch):
    from pipebubble.commands.partition import fmt_bytes, fmt_count, fmt_time

    args = ["profile", "--analytic", "--layers", "12", "--hidden", "4096", "--ffn", "11008",
            "--heads", "32", "--vocab", "32000", "--seq", "4096", "--tflops", "989", "--mfu",
            "0.4"]
    rc, out, _ = run_cli(*args, "--json")
    assert rc == 0
    layers = json.loads(out)["layers"]
    text = _assert_whole_at_80(run_cli, monkeypatch, args)
    lines = text.splitlines()
    for i, layer in enumerate(layers):
        row = next(line for line in lines if f" {layer['name']} " in f" {line} ")
        for cell in (layer["name"], fmt_time(layer["forward"]), fmt_time(layer["backward"]),
                     fmt_count(layer["params"]), fmt_bytes(layer["activation_bytes"]),
                     fmt_count(layer["flops"])):
            assert cell in row, (i, cell, row)


def test_fit_keeps_a_built_tables_rows_title_and_styles():
    from rich.table import Table

    from pipebubble.render.table import fit

    t = Table(title="plans")
    for col in ("#", "schedule", "peak memory"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    t.add_row("1", "interleaved-1f1b", "80.0 GiB")
    t.add_row("", "total", "[bold]1.2 GiB[/bold]", style="bold")
    text = render(fit(t, 30), 30)
    assert "plans" in text and "interleaved-1f1b" in text and "1.2 GiB" in text
    assert "[bold]" not in text and max(map(len, text.splitlines())) <= 30
