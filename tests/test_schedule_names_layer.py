"""The registry is the one place that knows schedule families by name.

Outside ``schedules/`` the package asks a family's spec (``lookup(name).placement``,
``.chains``, ``.split_only``, ``.torch_class``, ``.megatron``, ``.searched`` ...), never
its name: no string literal in code outside ``schedules/`` is a registered name or alias
(``auto`` included). Docstrings may name families (doctests run them); longer strings (help
text, messages) may mention them. ``auto`` is also the word for two policies that are not
schedules, torchtitan's FSDP reshard policy and the profiler's timer: a literal ``"auto"``
on a line (or in a function) about one of those is not a schedule name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pipebubble
from pipebubble.schedules import SCHEDULES

ROOT = Path(pipebubble.__file__).parent
NOT_A_SCHEDULE = ("reshard", "timer")  # policies whose value may be "auto"


def _names() -> set[str]:
    out: set[str] = set()
    for spec in SCHEDULES.values():
        out |= {spec.name.lower(), *(a.lower() for a in spec.aliases)}
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as a statement (docstrings, and the
    attribute docstrings written under a constant)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def name_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in ``source`` that is one of ``names``,
    docstrings and the policies' ``"auto"`` aside."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    lines = source.splitlines()
    functions = [fn for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        value = node.value.strip().lower()
        if id(node) in docs or value not in names:
            continue
        held_by = " ".join(fn.name for fn in functions
                           if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno))
        context = (lines[node.lineno - 1] + " " + held_by).lower()
        if value == "auto" and any(word in context for word in NOT_A_SCHEDULE):
            continue
        out.append((node.lineno, node.value))
    return out


def test_the_scan_finds_a_family_name_and_lets_docstrings_and_policies_be():
    names = _names()
    source = '''
"""Module doc naming 1f1b and auto."""
X = ("zbv", "other")
def f(timer="auto"):
    """gpipe"""
    return name == "AUTO" or help == "runs 1f1b first"
def resolve_reshard(policy):
    return policy == "auto"
'''
    assert name_literals(source, names) == [(3, "zbv"), (6, "AUTO")]


def test_no_family_name_literal_outside_schedules():
    names = _names()
    assert {"gpipe", "1f1b", "zbv", "dualpipe", "auto", "interleaved"} <= names
    quoted = re.compile("|".join(f"[\"']{re.escape(n)}[\"']" for n in names), re.I)
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        if rel.parts[0] == "schedules" or not quoted.search(text):
            continue  # no quoted name at all: nothing to parse
        for line, value in name_literals(text, names):
            found.append(f"{rel}:{line}: {value!r}")
    assert not found, "ask the spec (schedules.lookup(name)), not the name:\n" + "\n".join(
        found)
