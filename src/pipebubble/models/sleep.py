"""A synthetic workload whose layers sleep instead of computing (``--model sleep``).

Each layer sleeps ``f`` seconds in its forward, ``b - w`` in the part of its backward that
computes the input gradient (I) and ``w`` in the part that computes its weight gradient (W).
Sleeping takes no CPU, so a 4- or 8-rank pipeline shows its real timing on a 2-core machine,
and the measured step time can be held against the simulator's prediction for the same
per-stage F, I, W.

How the two halves of the backward stay apart: a layer computes ``y = A(x) * Z(weight)``,
where ``A`` is an identity whose backward sleeps ``b - w`` and ``Z`` an identity whose
backward sleeps ``w``. Autograd runs ``A``'s backward only when the input gradient is asked
for and ``Z``'s only when the weight gradient is, so a split backward (I, then W) sleeps
each part in its own action and a full backward (B) sleeps both. The layer's input is made
to require a gradient even on the first stage, so its I costs ``b - w`` there too, as the
cost model assumes.

Gradients are real (``y = x * weight``), so gradient-equality checks work on it too.

>>> spec = sleep(layers=2, width=3, f=0.0, b=0.0, w=0.0)
>>> x, y = spec.make_batch(4, torch.Generator().manual_seed(0))
>>> tuple(x.shape), len(spec.layers)
((4, 3), 2)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from .spec import ModelSpec


class _SleepThrough(torch.autograd.Function):
    """Identity that sleeps ``forward_s`` in the forward and ``backward_s`` in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        if forward_s > 0:
            time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.backward_s > 0:
            time.sleep(ctx.backward_s)
        return grad, None, None


class SleepLayer(nn.Module):
    """``y = x * weight``, sleeping F in the forward, I and W in the two halves of the backward."""

    def __init__(self, width: int, f: float, i: float, w: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(width))
        self.f, self.i, self.w = f, i, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:  # first stage: a leaf, then one op, so that the split
            # backward (runtime/split.py) takes the leaf for a weight but A for input work:
            # A's backward then runs in I, as on every other stage, not in W.
            x = x.detach().requires_grad_(True) * 1.0
        a = _SleepThrough.apply(x, self.f, self.i)
        z = _SleepThrough.apply(self.weight, 0.0, self.w)
        return a * z

    def extra_repr(self) -> str:
        return f"f={self.f:g}s, i={self.i:g}s, w={self.w:g}s"


def _per_layer(name: str, value: float | Sequence[float], layers: int) -> list[float]:
    vals = [float(value)] * layers if isinstance(value, int | float) else [float(v) for v in value]
    if len(vals) != layers:
        raise UserError(f"{name} has {len(vals)} values; expected 1 or {layers} (one per layer)")
    if any(not v >= 0 for v in vals):
        raise UserError(f"{name} must be >= 0 seconds, got {vals}")
    return vals


def sleep(
    layers: int = 4,
    width: int = 8,
    f: float | Sequence[float] = 0.01,
    b: float | Sequence[float] = 0.02,
    w: float | Sequence[float] = 0.01,
    seed: int = 0,
) -> Any:
    """``layers`` sleeping layers; ``f``, ``b``, ``w`` in seconds per layer (B = I + W)."""
    if not isinstance(layers, int) or layers < 1:
        raise UserError(f"layers must be an integer >= 1, got {layers!r}")
    fs, bs, ws = (_per_layer(n, v, layers) for n, v in (("f", f), ("b", b), ("w", w)))
    for k, (bk, wk) in enumerate(zip(bs, ws, strict=True)):
        if wk > bk:
            raise UserError(f"w must be <= b (W is part of the backward), got w={wk} > b={bk} "
                             f"for layer {k}")
    torch.manual_seed(seed)
    mods: list[nn.Module] = [SleepLayer(width, fs[k], bs[k] - ws[k], ws[k])
                             for k in range(layers)]

    def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen)

    return ModelSpec("sleep", mods, make_batch, nn.functional.mse_loss)
