"""One fit test: whether a memory level fits a limit is asked of ``costs.fits_limit`` (or its
bound, ``costs.fit_bound``, for a cap an inner loop compares many levels with), never
retyped. Read from the source (ast):

- ``FIT_TOLERANCE`` is named in ``costs.py`` only (anywhere else it would be the formula
  written again);
- outside ``costs.py`` no comparison or arithmetic that names a memory limit, a budget, a
  cap, a room or a peak carries a tolerance literal of its own (a float of magnitude
  1e-6 or less: ``peak <= limit + 1e-9``, ``budget * (1 + 1e-9)``).

Time tolerances (``t < end - 1e-12``) and solver gaps are not fit tests, and pass.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pipebubble

ROOT = Path(pipebubble.__file__).parent
HOME = ROOT / "costs.py"
MEMORY_WORDS = re.compile(r"limit|^lim|budget|room|cap$|^cap|peak|memory|held", re.I)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def tolerance_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comparison or arithmetic that names a memory quantity and holds
    a tolerance literal (the outermost such expression of a statement)."""
    found, seen = [], set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare | ast.BinOp) or id(node) in seen:
            continue
        inside = list(ast.walk(node))
        small = any(isinstance(n, ast.Constant) and isinstance(n.value, float)
                    and 0 < abs(n.value) <= 1e-6 for n in inside)
        names = [x for x in map(_name, inside) if x]
        if small and any(MEMORY_WORDS.search(x) for x in names):
            found.append((node.lineno, ast.unparse(node)))
            seen.update(id(n) for n in inside)
    return found


def test_the_detector_sees_a_retyped_fit_test():
    assert len(tolerance_literals("ok = peak <= limit + 1e-9")) == 1
    assert len(tolerance_literals("cap = budget / n * (1 + 1e-9)")) == 1
    assert len(tolerance_literals("k = int(lim / c + 1e-9)")) == 1
    assert tolerance_literals("late = start > end + 1e-12") == []  # a time, not memory
    assert tolerance_literals("ok = fits_limit(peak, limit)") == []


def test_fit_tests_go_through_fits_limit():
    retyped, named = [], []
    for path in sorted(ROOT.rglob("*.py")):
        if path == HOME:
            continue
        source = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        retyped += [f"{where}:{line}: {text}" for line, text in tolerance_literals(source)]
        named += [f"{where}:{n.lineno}" for n in ast.walk(ast.parse(source))
                  if _name(n) == "FIT_TOLERANCE"]
    assert not retyped, "tolerance literals in fit tests (use costs.fits_limit):\n" + \
        "\n".join(retyped)
    assert not named, "FIT_TOLERANCE outside costs.py (use fits_limit / fit_bound):\n" + \
        "\n".join(named)
