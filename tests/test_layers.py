"""Layers a newcomer can see: the import graph of the package, read from the source (ast).

- no import cycles, between modules or between subpackages (every import counts, also the
  ones made lazily inside a function);
- nothing in the library layers imports ``commands/`` or ``cli`` (only the command line
  knows argparse and the command modules);
- ``ir/`` imports nothing from the rest of the package (it is the bottom layer) but
  ``errors`` (the user-error type, which imports nothing).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pipebubble

ROOT = Path(pipebubble.__file__).parent
LIBRARY = ("ir", "schedules", "sim", "plan", "models", "runtime", "render", "interop", "web")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module of the package ``name`` refers to (a module, or an attribute of one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Package modules ``module`` imports, wherever the import statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _target(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> str:
    """``pipebubble.sim.kernel`` -> ``sim``; top-level modules are their own layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pipebubble"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_scan_sees_the_imports():
    # the scanner itself: known edges, relative and absolute, lazy ones included
    assert "pipebubble.ir.schedule" in GRAPH["pipebubble.ir.deps"]
    assert "pipebubble.sim.kernel" in GRAPH["pipebubble.sim.wire"]
    assert "pipebubble.models.spec" in GRAPH["pipebubble.models.sleep"]
    assert "pipebubble.commands._run_dist" in GRAPH["pipebubble.commands.run"]  # lazy
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_round_a_cycle():
    assert _cycle(GRAPH) is None


def test_no_cycle_between_subpackages():
    layers: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        if m == "pipebubble":  # the package's front door re-exports from below
            continue
        layers.setdefault(_layer(m), set()).update(
            _layer(t) for t in targets if _layer(t) != _layer(m) and t != "pipebubble")
    assert _cycle(layers) is None


def test_library_layers_never_import_the_command_line():
    bad = [(m, t) for m, targets in GRAPH.items() if _layer(m) in LIBRARY
           for t in targets if _layer(t) in ("commands", "cli")]
    assert bad == []


def test_ir_is_the_bottom_layer():
    # below ir only pipebubble.errors: the one user-error type, which imports nothing
    bad = [(m, t) for m, targets in GRAPH.items() if _layer(m) == "ir"
           for t in targets if _layer(t) not in ("ir", "errors")]
    assert bad == []
    assert GRAPH["pipebubble.errors"] == set()


def test_library_layers_take_plain_values_not_argparse():
    # renderers, the runtime, the simulator take plain values; the flags live in commands/
    # (selfcheck is a ``python -m`` entry point of its own)
    allowed = {"pipebubble.runtime.dist.selfcheck"}
    users = {m for m, p in MODULES.items()
             if _layer(m) in LIBRARY and m not in allowed
             and "argparse" in p.read_text(encoding="utf-8")}
    assert users == set()
