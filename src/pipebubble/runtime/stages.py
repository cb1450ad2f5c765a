"""Cut a model (a flat list of layers) into pipeline stages: the one stage-cutting function.

A model with ``n`` layers becomes ``ranks x chunks`` stages, each a contiguous slice. By
default the split is even (``n`` must be a multiple of the number of stages); otherwise give
the *boundaries*: the index of the first layer of every stage after the first. Where they
come from is up to the caller: :func:`even_boundaries`, :func:`balanced_boundaries` (sizes
differing by at most one), or a planner's cut (``boundaries_of(ranges)``).

>>> from torch import nn
>>> layers = [nn.Linear(2, 2) for _ in range(6)]
>>> even_boundaries(6, 3), balanced_boundaries(7, 3), boundaries_of([(0, 0), (1, 4), (5, 5)])
([2, 4], [3, 5], [1, 5])
>>> [len(s.layers) for s in split_stages(layers, 3, boundaries=[1, 5])]
[1, 4, 1]
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..errors import UserError
from .pipeline import PipelineStage


def even_boundaries(num_layers: int, num_stages: int) -> list[int]:
    """Cut points of an even split; raise UserError naming the counts if there is none."""
    if num_stages < 1:
        raise UserError(f"number of stages must be >= 1, got {num_stages}")
    if num_layers % num_stages:
        raise UserError(
            f"{num_layers} layers do not split evenly into {num_stages} stages "
            f"(ranks x chunks); use a multiple of {num_stages} layers or give boundaries"
        )
    k = num_layers // num_stages
    return [k * i for i in range(1, num_stages)]


def balanced_boundaries(num_layers: int, num_stages: int) -> list[int]:
    """Cut points of a split whose stage sizes differ by at most one (the first stages take
    the extra layers); raise UserError when there are fewer layers than stages."""
    if num_layers < num_stages:
        raise UserError(f"the model has {num_layers} layers, fewer than the {num_stages} "
                         f"stages; use at least {num_stages} layers")
    base, extra = divmod(num_layers, num_stages)
    cuts, at = [], 0
    for s in range(num_stages - 1):
        at += base + (s < extra)
        cuts.append(at)
    return cuts


def boundaries_of(ranges: Sequence[tuple[int, int]]) -> list[int]:
    """Cut points of inclusive ``(first_layer, last_layer)`` ranges (the planner's form)."""
    return [a for a, _ in ranges[1:]]


def check_boundaries(boundaries: Sequence[int], num_layers: int, num_stages: int) -> list[int]:
    """Validate cut points: ``num_stages - 1`` strictly increasing values in 1..n-1."""
    cuts = [int(b) for b in boundaries]
    if len(cuts) != num_stages - 1:
        example = ",".join(str(num_layers * k // num_stages) for k in range(1, num_stages))
        raise UserError(
            f"boundaries has {len(cuts)} cut points; {num_stages} stages need {num_stages - 1} "
            f"(the first layer of each stage after the first, e.g. {example or 'none'})"
        )
    prev = 0
    for c in cuts:
        if not prev < c < num_layers:
            raise UserError(
                f"boundaries must increase strictly within 1..{num_layers - 1}, got {cuts}"
            )
        prev = c
    return cuts


def split_stages(
    layers: Sequence[nn.Module], num_stages: int, boundaries: Sequence[int] | None = None
) -> list[PipelineStage]:
    """``num_stages`` PipelineStages over ``layers`` (the layer objects are shared, not copied)."""
    n = len(layers)
    if boundaries is None:
        cuts = even_boundaries(n, num_stages)
    else:
        cuts = check_boundaries(boundaries, n, num_stages)
    edges = [0, *cuts, n]
    return [PipelineStage(*layers[a:b]) for a, b in zip(edges, edges[1:], strict=False)]
