"""The split backward on random graphs: whatever a stage computes from weights and its input,
I followed by W gives the fused backward's gradients (never an internal RuntimeError).

The graphs are built to contain what real models do between layers: weight-only values that
feed several operations (an embedding lookup on the first stage, a position table added
twice), weights used twice (tied or reused layers), residual fan-out, and stages whose input
needs no gradient (token ids) or does (hidden states).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from pipebubble.runtime.memory import SavedTensors
from pipebubble.runtime.split import backward_input

W = 4  # width


class RandomStage(nn.Module):
    """A stage whose forward is a random program over a few values (see the module doc)."""

    def __init__(self, program: list[tuple], tokens: bool):
        super().__init__()
        torch.manual_seed(0)
        self.tokens = tokens
        self.emb = nn.Embedding(7, W).double()
        self.pos = nn.Parameter(torch.randn(3, W, dtype=torch.float64))
        self.lins = nn.ModuleList(nn.Linear(W, W).double() for _ in range(3))
        self.program = program

    def forward(self, x):
        vals = [self.emb(x) if self.tokens else x]
        for op, a, b, k in self.program:
            va, vb = vals[a % len(vals)], vals[b % len(vals)]
            if op == "linear":  # k picks one of 3 Linears: reuse happens
                vals.append(self.lins[k % 3](va))
            elif op == "tanh":
                vals.append(torch.tanh(va))
            elif op == "add":
                vals.append(va + vb)
            elif op == "mul":
                vals.append(va * vb)
            elif op == "pos":  # a weight-only value, added to an activation
                vals.append(va + self.pos[: va.shape[1]])
            elif op == "table":  # the embedding table used again (a tied head)
                vals.append(va @ self.emb.weight.t()[:, :W])
        return sum(v.sum() * (i + 1) for i, v in enumerate(vals[1:])) + vals[-1].pow(2).sum()


OPS = st.tuples(st.sampled_from(["linear", "tanh", "add", "mul", "pos", "table"]),
                st.integers(0, 20), st.integers(0, 20), st.integers(0, 2))


def _grads(stage: RandomStage) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in stage.parameters()]


@given(program=st.lists(OPS, min_size=1, max_size=8), tokens=st.booleans())
def test_i_then_w_equals_the_fused_backward(program, tokens):
    x = (torch.randint(0, 7, (2, 3)) if tokens
         else torch.randn(2, 3, W, dtype=torch.float64))
    ref = RandomStage(program, tokens)
    xr = x if tokens else x.clone().requires_grad_(True)
    ref(xr).backward()
    split = RandomStage(program, tokens)
    xs = x if tokens else x.clone().requires_grad_(True)
    saved = SavedTensors(split.parameters())
    with saved:
        out = split(xs)
    dx, work = backward_input(out, None, xs, saved, where="stage 3")
    assert all(p.grad is None for p in split.parameters())  # I computes no weight gradient
    work.run()
    if not tokens:
        torch.testing.assert_close(dx, xr.grad, rtol=1e-10, atol=1e-12)
    for i, (g, h) in enumerate(zip(_grads(split), _grads(ref), strict=True)):
        if h is None or not h.abs().sum() > 0:
            assert g is None or not g.abs().sum() > 0, f"parameter {i}"
            continue
        assert g is not None, f"parameter {i} got no gradient"
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-12, msg=f"parameter {i}")
