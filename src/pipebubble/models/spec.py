"""ModelSpec: what every built-in model gives the runtime, the profiler and the partitioner.

A flat layer list (cut into stages anywhere between layers), a batch maker and the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class ModelSpec:
    """``layers`` run in sequence; ``make_batch(n, generator)`` gives ``n`` (input, target)
    samples; ``loss_fn(output, target)`` is the mean loss over a batch."""

    name: str
    layers: list[nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
