"""What a ``ScheduleSpec`` says about its family, checked against what the family generates
and against torch: the rest of the package trusts these facts without generating anything.
(Placement and chains: tests/test_plan_scale_bounds.py.)"""

from __future__ import annotations

import functools

import pytest

from pipebubble import CostModel
from pipebubble.ir.schedule import ScheduleError, step_actions
from pipebubble.schedules import SCHEDULES, get_schedule, lookup, schedule_names
from pipebubble.schedules.registry import ScheduleSpec, register, unregister

FAMILIES = schedule_names(searched=False)


def _kinds(sched) -> set[str]:
    return {str(getattr(a.kind, "value", a.kind)) for o in sched.orders for st in o
            for a in step_actions(st)}


@pytest.mark.parametrize("name", FAMILIES)
def test_backward_facts_match_the_orders(name):
    """``split_backward`` False: no I or W anywhere; ``split_only``: no B anywhere."""
    spec, seen = lookup(name), 0
    for p in (2, 4):
        for m in (2 * p, 2 * p + 2):
            for v in spec.chunk_options(3):
                try:
                    kinds = _kinds(get_schedule(name, p, m, v))
                except ScheduleError:
                    continue
                seen += 1
                if not spec.split_backward:
                    assert not kinds & {"I", "W"}, (name, p, m, v)
                if spec.split_only:
                    assert "B" not in kinds and {"I", "W"} <= kinds, (name, p, m, v)
    assert seen


@functools.lru_cache(maxsize=1)
def _torch_schedules() -> tuple[dict[str, str], dict[str, list[str]]]:
    """torch.distributed.pipelining's own name -> class map (``get_schedule_class``, what
    torchtitan's ``pipeline_parallel_schedule`` goes through) and each class's bases, read
    from torch's source (importing torch takes seconds)."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed")
    path = Path(spec.origin).parent / "distributed" / "pipelining" / "schedules.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names, bases = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases[node.name] = [ast.unparse(b) for b in node.bases]
        if isinstance(node, ast.FunctionDef) and node.name == "get_schedule_class":
            table = next(n.value for n in ast.walk(node) if isinstance(n, ast.Assign)
                         and isinstance(n.value, ast.Dict))
            names = {k.value.lower(): v.id for k, v in zip(table.keys, table.values,
                                                           strict=True)}
    return names, bases


@pytest.mark.parametrize("name", [n for n in FAMILIES if lookup(n).torch_class])
def test_torch_class_and_torchtitan_name_are_torchs(name):
    """torchtitan's ``pipeline_parallel_schedule`` value resolves, through torch's own
    table, to the spec's class, and that class is single-stage exactly when the family
    puts one stage on a rank."""
    names, bases = _torch_schedules()
    spec = lookup(name)
    assert names[spec.torchtitan.lower()] == spec.torch_class
    single = "PipelineScheduleSingle" in bases[spec.torch_class]
    assert single == (spec.chunk_options(4) == [1]), (name, bases[spec.torch_class])


def test_only_the_search_needs_costs_and_a_limit():
    needing = {n for n, s in SCHEDULES.items() if s.needs_costs or s.needs_memory_limit}
    assert needing == {n for n, s in SCHEDULES.items() if s.searched} == {"auto"}


def test_build_drops_what_a_family_does_not_take_and_checks_chunks():
    spec = lookup("interleaved-1f1b")
    s = spec.build(2, 4, 2, costs=CostModel(), memory_limit=3)
    assert s.orders == get_schedule("interleaved-1f1b", 2, 4, 2).orders
    with pytest.raises(ScheduleError, match="needs chunks >= 2, got 1"):
        spec.build(2, 4, 1)
    with pytest.raises(ScheduleError, match="uses exactly 2 chunk"):
        lookup("zbv").build(2, 4, 3)


def test_chunk_options_are_what_build_accepts():
    for name in FAMILIES:
        spec = lookup(name)
        for v in range(1, 5):
            ok = v in spec.chunk_options(4)
            try:
                spec.check_chunks(v)
                assert ok, (name, v)
            except ScheduleError:
                assert not ok, (name, v)
    assert lookup("auto").chunk_options(4) == [1, 2] and lookup("auto").chunk_options(1) == [1]


def test_auto_placement_by_chunks_without_a_probe():
    spec = lookup("auto")
    assert (spec.placement_at(1), spec.placement_at(2), spec.placement_at(3)) == (
        "loop", "v", None)
    s = get_schedule("auto", 2, 2, 1, costs=CostModel(f=1, b=2))
    assert s.stage_to_rank == (0, 1)


def test_register_refuses_a_taken_name_and_unregister_forgets():
    def gen(ranks, microbatches, chunks=1):
        return get_schedule("gpipe", ranks, microbatches)

    with pytest.raises(ScheduleError, match="'zb1p' is already 'zb-h1'"):
        register(ScheduleSpec("mine", gen, "a copy", aliases=("zb1p",)))
    assert "mine" not in SCHEDULES
    register(ScheduleSpec("mine", gen, "a copy", aliases=("mine2",)))
    try:
        assert get_schedule("MINE2", 2, 2).orders == get_schedule("gpipe", 2, 2).orders
    finally:
        unregister("mine")
    with pytest.raises(ScheduleError, match="unknown schedule 'mine2'"):
        lookup("mine2")
