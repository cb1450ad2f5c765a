"""Where a run cuts its model: the default cut's rule (:mod:`pipebubble.cut_rule`) for a
model that has no profile.

``run --local``, the gloo workers, torchrun, ``--engine torch``, the self-check and a
checkpoint resumed into another cut all call :func:`choose_cut`:

1. ``--boundaries`` given: that cut, checked (``by = "given"``);
2. else the layers' cost, balanced by the exact min-max partitioner
   (:func:`pipebubble.cut_rule.balanced_cut`, the rule ``profile``, ``partition`` and
   ``plan --validate`` use too): the slowest stage is as light as any contiguous cut can
   make it, ties broken towards even stages. The cost of a layer is

   - the sleep model's stated seconds (F + B per layer: ``"sleep times"``);
   - else its forward FLOPs (the matrix products, :func:`layer_flops`) on one forward of a
     2-sample batch (``"FLOPs"``): the same numbers in every process (they follow from the
     shapes, not from a clock), so every rank of a distributed run picks the same cut
     without talking to the others;
   - else (no layer does a counted operation, or the counting pass fails: the model's own
     check then names the layer) one per layer: stage sizes differing by at most one
     (``"layer count"``).

Any number of layers runs on any number of stages up to the layer count; more stages than
layers is one line naming both. The cut is reported as the ``--boundaries`` value that
reproduces it (:attr:`Cut.flag`).

>>> from torch import nn
>>> cut = choose_cut([nn.Linear(4, 4) for _ in range(7)], 2)
>>> cut.boundaries, cut.by, cut.flag
([3], 'FLOPs', '3')
>>> choose_cut([nn.Identity()] * 7, 3)   # nothing counted: by layer count
Cut(boundaries=[2, 5], by='layer count')
>>> choose_cut([nn.Linear(4, 4), nn.Linear(4, 64), nn.Linear(64, 4)], 2).boundaries
[2]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..cut_rule import BY, Cut, balanced_cut, check_stage_count
from .stages import check_boundaries


def choose_cut(layers: Sequence[nn.Module], num_stages: int,
               boundaries: Sequence[int] | None = None,
               make_batch: Callable | None = None,
               flops: Sequence[float] | None = None) -> Cut:
    """The cut of ``layers`` into ``num_stages`` stages (see the module docstring).

    ``make_batch(n, generator)``: the model's batch maker, for the FLOP count (without it,
    a 2-sample batch of the first layer's ``in_features`` is tried); ``flops``: the layers'
    FLOPs already counted (:class:`CountFlops` around the model's own check), no pass of
    its own. Raises UserError for more stages than layers and for bad ``boundaries``."""
    n = len(layers)
    check_stage_count(n, num_stages)
    if boundaries is not None:
        return Cut(check_boundaries(boundaries, n, num_stages), "given")
    if num_stages == 1:
        return Cut([], "layer count")
    if flops is not None:
        costs, by = list(flops), "FLOPs"
    else:
        costs, by = layer_costs(layers, make_batch)
    return balanced_cut(costs if costs is not None else [0.0] * n, num_stages, by)


def layer_costs(layers: Sequence[nn.Module], make_batch: Callable | None = None
                ) -> tuple[list[float] | None, str]:
    """(one cost per layer, what it is) or (None, "layer count") when none is known."""
    from ..models.sleep import SleepLayer

    if layers and all(isinstance(m, SleepLayer) for m in layers):
        return [m.f + m.i + m.w for m in layers], "sleep times"
    try:
        return layer_flops(layers, _sample(layers, make_batch)), "FLOPs"
    except Exception:  # noqa: BLE001 - the model's own check (check_layers) names the failure
        return None, "layer count"


def layer_flops(layers: Sequence[nn.Module], x: torch.Tensor) -> list[float]:
    """Forward FLOPs of each layer on ``x``, passed from layer to layer: the matrix
    products (linear, matmul, mm, bmm, addmm, baddbmm, scaled-dot-product and
    ``nn.MultiheadAttention`` attention, convolutions), counted from their shapes, 2 per
    multiply-add; elementwise work, norms and lookups count 0.

    Counted at the torch-function level (:class:`_Flops`): ``FlopCounterMode``, a dispatch
    mode, imports torch's compiler on first use (seconds in every process). The pass leaves
    the model as it was: no gradients, in eval mode (a BatchNorm's running statistics are
    not updated), the global random state restored (dropout draws nothing from it).

    >>> layer_flops([nn.Linear(4, 8), nn.ReLU()], torch.ones(3, 4))   # 2 * 3 * 4 * 8
    [192.0, 0.0]
    """
    modes = [(m, m.training) for layer in layers for m in layer.modules()]
    out = []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for layer in layers:
                layer.eval()
                with _Flops() as counter:
                    x = layer(x)
                out.append(float(counter.total))
    finally:
        for m, training in modes:
            m.training = training
    return out


def _matmul(a: torch.Tensor, b: torch.Tensor) -> int:
    """2 x batch x n x k x m for ``a`` (..., n, k) @ ``b`` (..., k, m), broadcast."""
    sa, sb = list(a.shape), list(b.shape)
    if len(sa) == 1:
        sa = [1, *sa]
    if len(sb) == 1:
        sb = [*sb, 1]
    batch = torch.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    return 2 * math.prod(batch) * sa[-2] * sa[-1] * sb[-1]


class CountFlops:
    """Inside ``with``, every forward of ``layers`` (one or several passes) adds its matrix
    products' FLOPs to ``flops[i]`` of the layer running them: the count of a pass the
    caller makes anyway (a user model's up-front check), with no forward of its own.

    >>> layers = [nn.Linear(4, 8), nn.Linear(8, 2)]
    >>> with CountFlops(layers) as c:
    ...     _ = layers[1](layers[0](torch.ones(3, 4)))
    >>> c.flops
    [192.0, 96.0]
    """

    def __init__(self, layers: Sequence[nn.Module]):
        self.layers, self.flops = list(layers), [0.0] * len(layers)
        self._mode = _Flops()
        self._hooks: list = []
        self._now: int | None = None

    def __enter__(self) -> CountFlops:
        def pre(i: int):
            def hook(module, args):
                self._now, self._mode.total = i, 0
            return hook

        def post(i: int):
            def hook(module, args, out):
                if self._now == i:
                    self.flops[i] += float(self._mode.total)
                self._now = None
            return hook

        for i, layer in enumerate(self.layers):
            self._hooks += [layer.register_forward_pre_hook(pre(i)),
                            layer.register_forward_hook(post(i))]
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for h in self._hooks:
            h.remove()


class _Flops(TorchFunctionMode):
    """Adds up the FLOPs of the matrix products called inside (see :func:`layer_flops`)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.total += _count(func, args, out)
        return out


def _count(func, args, out) -> int:
    F = torch.nn.functional
    if func is F.linear:
        x, w = args[0], args[1]
        return 2 * (x.numel() // max(1, x.shape[-1])) * w.shape[0] * w.shape[1]
    if func in _MATMULS:
        return _matmul(args[0], args[1])
    if func in _ADDMMS:  # bias, a, b
        return _matmul(args[1], args[2])
    if func is F.scaled_dot_product_attention:
        q, k, v = args[:3]
        return 2 * math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if func is F.multi_head_attention_forward:  # (L, N, E) query, (S, N, E) key: torch's
        # own composite, opaque to the mode: projections in and out, QK^T and PV
        L, N, E = args[0].shape
        S = args[1].shape[0]
        return 2 * N * E * E * (2 * L + 2 * S) + 4 * N * L * S * E
    if func in _CONVS and isinstance(out, torch.Tensor):
        w = args[1]
        return 2 * out.numel() * (w.numel() // max(1, w.shape[0]))
    return 0


_MATMULS = {torch.matmul, torch.mm, torch.bmm, torch.Tensor.matmul, torch.Tensor.mm,
            torch.Tensor.bmm, torch.Tensor.__matmul__}
_ADDMMS = {torch.addmm, torch.baddbmm, torch.Tensor.addmm, torch.Tensor.baddbmm}
_CONVS = {torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d}


def _sample(layers: Sequence[nn.Module], make_batch: Callable | None) -> torch.Tensor:
    """Two samples of the model's input, the same in every process (seed 0)."""
    gen = torch.Generator().manual_seed(0)
    if make_batch is not None:
        inputs = getattr(make_batch, "inputs", None)  # an nn.Sequential's: layers first
        return (inputs(2, gen) if inputs is not None else make_batch(2, gen)[0])
    first = layers[0]
    width = getattr(first, "in_features", None)
    if width is None:
        raise ValueError("no batch maker and no in_features: the layer count decides")
    return torch.randn(2, width, generator=gen)


__all__ = ["BY", "CountFlops", "Cut", "check_stage_count", "choose_cut", "layer_costs",
           "layer_flops"]
