"""The planner's degrees and shardings have one owner each, read from the source (ast):

- a product of two parallel degrees (``tp * cp``, ``c.dp * c.cp``, ``pp * dp`` ...) is written
  only in :mod:`pipebubble.plan.dims`; everywhere else reads ``ParallelDims``'s derived sizes
  (``world``, ``model_parallel``, ``data_context``, ``stage_distance`` ...), so a new axis is
  one field there;
- a comparison with a sharding's name (``sharding == "fsdp"``, ``in ("zero2", "fsdp")``) is
  written only in :mod:`pipebubble.plan.shardings`; everywhere else asks the member
  (``shards_params``, ``hybrid``, ``state_bytes`` ...).

The scan covers the planner (``plan/`` and ``commands/plan.py``); ``ALLOWED`` names the few
formulas that take a degree as a plain number, each with why.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pipebubble

ROOT = Path(pipebubble.__file__).parent
DEGREES = {"tp", "cp", "pp", "dp", "ep", "dp_shard", "dp_replicate"}
NAMES = {"ddp", "zero1", "zero2", "fsdp", "hsdp"}
ALLOWED = {
    # Korthikanti et al.'s activation formula: attention scores of s/cp local queries over
    # a/tp local heads, degrees passed as numbers by the compute model.
    ("plan/memory.py", "(cp * tp)"),
}


def _degree(node: ast.AST) -> bool:
    """A degree (``tp``, ``c.cp``), or a product of degrees."""
    if isinstance(node, ast.Name):
        return node.id in DEGREES
    if isinstance(node, ast.Attribute):
        return node.attr in DEGREES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _degree(node.left) and _degree(node.right)
    return False


def _sharding_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_sharding_name(e) for e in node.elts)
    return False


def _findings(source: str) -> tuple[list[str], list[str]]:
    """(degree products, sharding-name comparisons) of ``source``, as source text."""
    products, switches = [], []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
                and _degree(node.left) and _degree(node.right)):
            products.append(f"({ast.unparse(node)})")
        if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops
        ) and any(_sharding_name(x) for x in (node.left, *node.comparators)):
            switches.append(ast.unparse(node))
    return products, switches


@cache
def _scan() -> tuple[list, list]:
    products, switches = [], []
    for path in sorted([*(ROOT / "plan").rglob("*.py"), ROOT / "commands" / "plan.py"]):
        rel = path.relative_to(ROOT).as_posix()
        found_p, found_s = _findings(path.read_text(encoding="utf-8"))
        if rel != "plan/dims.py":
            products += [(rel, x) for x in found_p if (rel, x) not in ALLOWED]
        if rel != "plan/shardings.py":
            switches += [(rel, x) for x in found_s]
    return products, switches


def test_the_scan_sees_products_and_switches():
    src = ('a = c.tp * c.cp\nb = tp * cp * pp\nd = dp * size\ne = k * x.stage_ranks\n'
           'if s == "fsdp" or s in ("zero2", "fsdp") or "hsdp" != s: pass\n'
           'if s == "1f1b": pass\n')
    products, switches = _findings(src)
    assert products == ["(c.tp * c.cp)", "(tp * cp * pp)", "(tp * cp)"]
    assert switches == ["s == 'fsdp'", "s in ('zero2', 'fsdp')", "'hsdp' != s"]


def test_degree_products_only_in_dims():
    products, _ = _scan()
    assert products == []


def test_sharding_switches_only_in_shardings():
    _, switches = _scan()
    assert switches == []


def test_the_owners_do_the_work():
    """The exceptions are where they say they are (an exception nobody needs is dropped)."""
    for rel, text in ALLOWED:
        assert text in _findings((ROOT / rel).read_text(encoding="utf-8"))[0]
    products, _ = _findings((ROOT / "plan/dims.py").read_text(encoding="utf-8"))
    assert products  # the derived sizes are computed there
