"""ModelSpec: what every model gives the runtime, the profiler and the partitioner.

A flat layer list (cut into stages anywhere between layers), a batch maker and the loss.
Optionally each layer's *name* (the model's own module name, e.g. ``model.layers.3``: what
partition's torchtitan block and a checkpoint's keys say) and *role*: ``embedding`` (the
token lookup on the first stage), ``layer`` or ``head`` (the output projection the loss
reads). Roles, not class names, decide the Megatron layout's ``E`` and ``L``.

A weight used by several layers (a head tied to the embedding) is written as the model has
it: one ``nn.Parameter`` reached from both layers (``head.weight = emb.weight``). The runtime
finds it, gives each stage that uses it a copy and sums the copies' gradients before every
optimizer step (:mod:`pipebubble.runtime.tied`), so it trains as one weight. Distinct
parameters meant to be one weight can be declared in ``ties``: groups of model-wide names
(``[("layers.0.weight", "layers.2.weight")]``: the names a checkpoint uses, the layer's
name, or ``layers.I`` without ``names``, then the parameter's path in the layer).

>>> import torch
>>> from torch import nn
>>> spec = ModelSpec("toy", [nn.Linear(2, 2), nn.Linear(2, 2)],
...                  lambda n, g: (torch.randn(n, 2, generator=g), torch.randn(n, 2, generator=g)),
...                  nn.functional.mse_loss)
>>> spec.layer_names(), spec.layer_roles()
(['0', '1'], ['layer', 'layer'])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

ROLES = ("embedding", "layer", "head")


@dataclass
class ModelSpec:
    """``layers`` run in sequence; ``make_batch(n, generator)`` gives ``n`` (input, target)
    samples; ``loss_fn(output, target)`` is the mean loss over a batch. ``names`` and
    ``roles`` (one per layer, optional) are described in the module docstring;
    ``description`` is one line for reports (what the batch and the loss are)."""

    name: str
    layers: list[nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    names: list[str] | None = None
    roles: list[str] | None = None
    description: str = ""
    metadata: dict = field(default_factory=dict)
    ties: list[tuple[str, ...]] = field(default_factory=list)  # declared tied weights

    def layer_names(self) -> list[str]:
        """One unique name per layer: ``names``, else the layer indices."""
        return list(self.names) if self.names is not None else [str(i) for i in
                                                               range(len(self.layers))]

    def layer_roles(self) -> list[str]:
        """One role per layer: ``roles``, else each layer's ``role`` attribute, else layer."""
        if self.roles is not None:
            return list(self.roles)
        return [str(getattr(m, "role", "layer")) for m in self.layers]
