"""Run the Zero Bubble authors' own schedulers and turn their orders into ours.

``bench_auto.py --authors PATH`` points at a local checkout of
sail-sg/zero-bubble-pipeline-parallelism (nothing of it is copied here). Their scheduler
modules under ``megatron/core/pipeline_parallel/zerobubble/scheduler/`` are plain Python;
they are loaded one file at a time (not through ``megatron/__init__``, which needs a GPU
stack), with ``pulp`` stubbed when it is missing (only their ILP uses it; we run their
heuristics). Each function returns per-rank orders of our Actions, to be timed by OUR
simulator under the same costs; their own timing is never used.

Their schedulers take one cost per pass for every stage (a chunk's F, its input gradient
B = our I, W, and the comm time of a hop), so the settings they can run are uniform ones.

- :func:`v_half` / :func:`v_min`: ``zbv_greedy.PipelineGraph`` (the V-Half / V-Min building
  blocks of *Pipeline Parallelism with Controllable Memory*, repeated, squeezed, reordered);
- :func:`v_auto`: ``v_auto_schedule.schedule`` (the adaptive V scheduler: enumerates
  starting patterns and offsets, keeps the best that fits ``max_mem`` chunk activations);
- :func:`zbv`: ``zbv.PipelineGraph`` (ZB-V's greedy under a memory limit);
- :func:`zb`: ``zb.Graph.manual_order`` (ZB-1p/2p's heuristic, loop placement), over the
  eight knob settings of their ``initial_solution``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import types
from pathlib import Path

from pipebubble.ir.schedule import Action

_PKG = "megatron.core.pipeline_parallel.zerobubble.scheduler"


class Authors:
    """The authors' scheduler modules loaded from a checkout at ``root``."""

    def __init__(self, root: str | Path):
        base = Path(root) / _PKG.replace(".", "/")
        if not (base / "graph.py").exists():
            raise FileNotFoundError(f"no {_PKG} under {root}")
        parts = _PKG.split(".")
        for n in range(1, len(parts) + 1):  # empty parent packages, no megatron/__init__
            name = ".".join(parts[:n])
            if name not in sys.modules:
                mod = types.ModuleType(name)
                mod.__path__ = []
                sys.modules[name] = mod
        if importlib.util.find_spec("pulp") is None and "pulp" not in sys.modules:
            sys.modules["pulp"] = types.ModuleType("pulp")  # their ILP only
        self.graph = self._load(base, "graph")
        self.zbv_greedy = self._load(base, "zbv_greedy")
        self.zbv = self._load(base, "zbv")
        self.v_auto = self._load(base, "v_auto_schedule")
        try:
            self.zb = self._load(base, "zb")  # imports torch
        except ImportError:
            self.zb = None

    @staticmethod
    def _load(base: Path, name: str):
        full = f"{_PKG}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        spec = importlib.util.spec_from_file_location(full, base / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        return mod


def _quiet(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def _config(p: int):
    return types.SimpleNamespace(max_chunks=2, n_stages=p)


def _from_nodes(local_order) -> list[list[Action]]:
    """Their ScheduledNode lists (``layer_group_idx`` = our V stage number) as our orders."""
    kind = {"F": "F", "B": "I", "W": "W"}
    return [[Action(n.layer_group_idx, kind[str(n.type)], n.microbatch) for n in rank]
            for rank in local_order]


def v_half(a: Authors, p: int, m: int, f: float, i: float, w: float, c: float):
    g = a.zbv_greedy.PipelineGraph(p, m, "half", f, i, w, c)
    return _from_nodes(_quiet(g.create_schedule, _config(p)))


def v_min(a: Authors, p: int, m: int, f: float, i: float, w: float, c: float):
    g = a.zbv_greedy.PipelineGraph(p, m, "min", f, i, w, c)
    return _from_nodes(_quiet(g.create_schedule, _config(p)))


def zbv(a: Authors, p: int, m: int, f: float, i: float, w: float, c: float,
        max_mem: int):
    """ZB-V's greedy with at most ``max_mem`` chunk activations per rank."""
    g = a.zbv.PipelineGraph(p, m, f, i, w, c, 1, 0, -1, max_mem=max_mem)
    return _from_nodes(_quiet(g.create_schedule, _config(p)))


def v_auto(a: Authors, p: int, m: int, f: float, i: float, w: float, c: float,
           max_mem: int):
    """The adaptive V scheduler with at most ``max_mem`` chunk activations per rank (F
    adds one, W frees it). Their strings: F/f the forwards of chunk 0/1, B/b the input
    gradients of chunk 1/0 (both named for the direction they travel), W/w their Ws."""
    nodes = _quiet(a.v_auto.schedule, p, m, (f, i, w, c), max_mem)
    out = []
    for r, rank in enumerate(nodes):
        row = []
        for n in rank:
            stage = 2 * p - 1 - r if n.chunk else r
            row.append(Action(stage, {"F": "F", "B": "I", "W": "W"}[n.type], n.minibatch))
        out.append(row)
    return out


def zb(a: Authors, p: int, m: int, f: float, i: float, w: float, c: float,
       max_mem: float, mem_w: float = 1.0):
    """ZB's heuristic (loop placement) at ``max_mem`` M_B per rank, each of the eight knob
    settings of their ``initial_solution``: a list of orders, one per setting that runs."""
    if a.zb is None:
        return []
    cfg = a.graph.GraphConfig(
        mem_f=[1.0] * p, mem_b=[mem_w - 1.0] * p, mem_w=[-mem_w] * p,
        max_mem=[float(max_mem)] * p, cost_f=[float(f)] * p, cost_b=[float(i)] * p,
        cost_w=[float(w)] * p, cost_comm=float(c), n_stages=p, n_micro=m)
    graph = a.zb.Graph.build_graph(p, m, cfg)
    found = []
    for first in (True, False):
        for prio in (True, False):
            for greedy in (True, False):
                try:
                    order, _, _ = graph.manual_order(first, prio, greedy)
                except (ValueError, AssertionError):
                    continue
                rows = [[] for _ in range(p)]
                for x, pos in enumerate(order):
                    kind, rest = divmod(x, p * m)
                    s, j = divmod(rest, m)
                    rows[s].append((pos, Action(s, "FIW"[kind], j)))
                found.append([[act for _, act in sorted(r)] for r in rows])
    return found
