"""Helpers for the runtime tests: tiny float64 models, hand-built schedules, invariants."""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipebubble.ir.schedule import Action, Overlap, make_schedule, v_placement, validate
from pipebubble.models import transformer
from pipebubble.runtime.stages import split_stages
from pipebubble.sim.kernel import simulate


class Block(nn.Module):
    """Linear -> tanh: saves its input and its output (2 tensors of rows x width)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def mlp_layers(n: int, width: int = 6, seed: int = 0, dtype=torch.float64) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [Block(width).to(dtype) for _ in range(n)]


def mlp_problem(stages: int, batch: int, width: int = 6, layers_per_stage: int = 1, seed: int = 0):
    """(stage modules, unsplit reference, x, y, loss_fn) for an MLP in float64."""
    layers = mlp_layers(stages * layers_per_stage, width, seed)
    ref = copy.deepcopy(nn.Sequential(*layers))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, width, generator=g, dtype=torch.float64)
    y = torch.randn(batch, width, generator=g, dtype=torch.float64)
    return split_stages(layers, stages), ref, x, y, nn.functional.mse_loss


def transformer_problem(stages: int, batch: int, seed: int = 0):
    """A tiny transformer (embedding, blocks, head) in float64, ``2 * stages`` pipeline layers."""
    spec = transformer(layers=2 * stages - 2 if stages > 1 else 1, dim=8, heads=2, vocab=32,
                       seq=5, seed=seed)
    layers = [m.to(torch.float64) for m in spec.layers]
    ref = copy.deepcopy(nn.Sequential(*layers))
    x, y = spec.make_batch(batch, torch.Generator().manual_seed(seed + 1))
    n = len(layers)
    cuts = None if n % stages == 0 else [round(n * i / stages) for i in range(1, stages)]
    return split_stages(layers, stages, cuts), ref, x, y, spec.loss_fn


def reference_grads(ref: nn.Module, x, y, loss_fn):
    ref.zero_grad(set_to_none=True)
    loss = loss_fn(ref(x), y)
    loss.backward()
    return loss.item(), [p.grad for p in ref.parameters()]


def assert_grads_equal(stages, ref_grads, rtol=1e-10, atol=1e-12, where=""):
    params = [p for s in stages for p in s.parameters()]
    assert len(params) == len(ref_grads)
    for i, (p, g) in enumerate(zip(params, ref_grads, strict=True)):
        assert p.grad is not None, f"{where}: parameter {i} has no gradient"
        torch.testing.assert_close(p.grad, g, rtol=rtol, atol=atol, msg=lambda m, i=i: (
            f"{where}: parameter {i}: {m}"))


def greedy_schedule(ranks: int, chunks: int, microbatches: int, placement: str = "loop",
                    split: bool = False, defer_w: bool = False, overlap: bool = False,
                    name: str = "hand-built"):
    """A schedule built by list scheduling in unit time, so it cannot deadlock.

    Each round every rank runs one step among its ready actions (dependencies done in earlier
    rounds): a backward (I or B) first, then a W (unless ``defer_w``: all W at the end), then
    a forward (lowest microbatch, then latest stage). With ``overlap`` a rank that has both a
    ready forward and a ready backward runs them as one Overlap step.
    """
    S = ranks * chunks
    where = list(v_placement(ranks)) if placement == "v" else [s % ranks for s in range(S)]
    bwd = "I" if split else "B"
    done: set[Action] = set()
    todo = [[] for _ in range(ranks)]
    for s in range(S):
        for m in range(microbatches):
            todo[where[s]] += [Action(s, "F", m), Action(s, bwd, m)]
            if split:
                todo[where[s]].append(Action(s, "W", m))
    orders: list[list] = [[] for _ in range(ranks)]

    def ready(a: Action) -> bool:
        s, k, m = a
        if k == "F":
            return s == 0 or Action(s - 1, "F", m) in done
        if k in ("B", "I"):
            up = s == S - 1 or Action(s + 1, "I", m) in done or Action(s + 1, "B", m) in done
            return Action(s, "F", m) in done and up
        return Action(s, "I", m) in done

    while any(todo):
        finished = []
        for r in range(ranks):
            cand = [a for a in todo[r] if ready(a)]
            if not cand:
                continue
            b = sorted((a for a in cand if a.kind in ("B", "I")),
                       key=lambda a: (a.microbatch, -a.stage))
            w = sorted(a for a in cand if a.kind == "W")
            f = sorted((a for a in cand if a.kind == "F"), key=lambda a: (a.microbatch, -a.stage))
            if defer_w:
                only_w = all(a.kind == "W" for a in todo[r])
                w = w if only_w else []
            if overlap and b and f:
                step = Overlap(f[0], b[0])
            elif b:
                step = b[0]
            elif w:
                step = w[0]
            elif f:
                step = f[0]
            else:
                continue
            orders[r].append(step)
            parts = (step.forward, step.backward) if isinstance(step, Overlap) else (step,)
            for a in parts:
                todo[r].remove(a)
                finished.append(a)
        if not finished:
            raise AssertionError("greedy_schedule made no progress")
        done.update(finished)
    sched = make_schedule(name, orders, S, microbatches, placement=placement)
    validate(sched)
    simulate(sched)  # raises Deadlock if the Overlap pairing made it unrunnable
    return sched


def assert_timeline_invariants(timeline, schedule):
    """No two actions overlap on a rank; every data dependency is respected."""
    ev = {}
    for r in range(timeline.num_ranks):
        evs = list(timeline.events(r))
        for a, b in zip(evs, evs[1:], strict=False):
            assert b.start >= a.end, f"rank {r}: {a} and {b} overlap"
        for e in evs:
            assert e.end >= e.start
            assert schedule.stage_to_rank[e.stage] == r
            ev[e.stage, e.kind, e.microbatch] = e
    for (s, k, m), e in ev.items():
        if k == "F" and not schedule.first_stage(s):
            assert e.start >= ev[s - 1, "F", m].end
        if k in ("B", "I"):
            assert e.start >= ev[s, "F", m].end
            if not schedule.last_stage(s):
                up = ev.get((s + 1, "I", m)) or ev[s + 1, "B", m]
                assert e.start >= up.end
        if k == "W":
            assert e.start >= ev[s, "I", m].end
    assert len(ev) == schedule.num_actions()


def first_schedule(name: str):
    """Registered schedule ``name`` at the smallest (ranks, microbatches) it accepts among
    (2, 4), (2, 3), (4, 8), with 2 chunks where the chunk count is free; fails the test if
    none."""
    import pytest

    from pipebubble.ir.schedule import ScheduleError
    from pipebubble.schedules import get_schedule, lookup

    spec = lookup(name)
    v = spec.chunks if spec.fixed_chunks else max(spec.min_chunks, 2)
    for p, m in ((2, 4), (2, 3), (4, 8)):
        try:
            return get_schedule(name, p, m, v)
        except ScheduleError:
            continue
    pytest.fail(f"{name} accepts none of the (p, m) tried")
