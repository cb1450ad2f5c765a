"""Where a run cuts its model: the one rule of every run path.

``run --local``, the gloo workers, torchrun, ``--engine torch``, the self-check and a
checkpoint resumed into another cut all call :func:`choose_cut`:

1. ``--boundaries`` given: that cut, checked (``by = "given"``);
2. else the layers' cost, balanced by the exact min-max partitioner
   (:func:`pipebubble.partition.min_max_partition`, Pinar & Aykanat 2004): the slowest
   stage is as light as any contiguous cut can make it, ties broken towards even stages.
   The cost of a layer is

   - the sleep model's stated seconds (F + B per layer: ``"sleep times"``);
   - else its forward FLOPs, counted by torch's ``FlopCounterMode`` on one forward of a
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UserError
from .stages import check_boundaries

BY = ("given", "sleep times", "FLOPs", "layer count")


@dataclass(frozen=True)
class Cut:
    """A cut of ``num_layers`` layers: the first layer of every stage after the first, and
    what chose it (one of :data:`BY`)."""

    boundaries: list[int]
    by: str

    @property
    def flag(self) -> str:
        """The ``--boundaries`` value that reproduces this cut ('' for one stage)."""
        return ",".join(str(b) for b in self.boundaries)

    def describe(self) -> str:
        """``cut --boundaries 4 (balanced by FLOPs)``, for the run's header."""
        how = "given" if self.by == "given" else f"balanced by {self.by}"
        return (f"cut --boundaries {self.flag} ({how})" if self.boundaries
                else "one stage")


def choose_cut(layers: Sequence[nn.Module], num_stages: int,
               boundaries: Sequence[int] | None = None,
               make_batch: Callable | None = None) -> Cut:
    """The cut of ``layers`` into ``num_stages`` stages (see the module docstring).

    ``make_batch(n, generator)``: the model's batch maker, for the FLOP count (without it,
    a 2-sample batch of the first layer's ``in_features`` is tried). Raises UserError for
    more stages than layers and for bad ``boundaries``."""
    n = len(layers)
    if num_stages > n:
        raise UserError(f"the model has {n} layer{'s' if n != 1 else ''}, fewer than the "
                        f"{num_stages} stages (ranks x chunks); at most {n} stages can run it "
                        "(every stage needs a layer)")
    if boundaries is not None:
        return Cut(check_boundaries(boundaries, n, num_stages), "given")
    if num_stages == 1:
        return Cut([], "layer count")
    from ..partition import min_max_partition

    costs, by = layer_costs(layers, make_batch)
    if costs is None or not any(costs):
        costs, by = [1.0] * n, "layer count"
    ranges = min_max_partition(costs, num_stages)
    return Cut([a for a, _ in ranges[1:]], by)


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
    """Forward FLOPs of each layer on ``x``, passed from layer to layer. The pass leaves
    the model as it was: no gradients, in eval mode (a BatchNorm's running statistics are
    not updated), the global random state restored (dropout draws nothing from it)."""
    from torch.utils.flop_counter import FlopCounterMode

    modes = [(m, m.training) for layer in layers for m in layer.modules()]
    out = []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for layer in layers:
                layer.eval()
                with FlopCounterMode(display=False) as counter:
                    x = layer(x)
                out.append(float(counter.get_total_flops()))
    finally:
        for m, training in modes:
            m.training = training
    return out


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
