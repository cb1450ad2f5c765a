"""Transports carry activations forward and gradients backward between stages.

A message is keyed by (kind, destination stage, microbatch), where kind is ``"act"`` (an
activation for the stage's F) or ``"grad"`` (a gradient for the stage's I/B). It carries the
tensor and the time at which it left its producer, so a per-stage clock can tell when the
consumer may start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class Transport(Protocol):
    def send(self, kind: str, stage: int, microbatch: int, tensor: torch.Tensor, t: float) -> None:
        """Hand ``tensor`` to ``stage`` for ``microbatch``; ``t`` is when it was produced."""

    def recv(self, kind: str, stage: int, microbatch: int) -> tuple[torch.Tensor, float] | None:
        """The message for (kind, stage, microbatch) if it has arrived, else None."""


@dataclass
class LocalTransport:
    """All stages in one process: a dictionary of pending messages."""

    pending: dict[tuple[str, int, int], tuple[torch.Tensor, float]] = field(default_factory=dict)

    def send(self, kind: str, stage: int, microbatch: int, tensor: torch.Tensor, t: float) -> None:
        key = (kind, stage, microbatch)
        if key in self.pending:
            raise RuntimeError(f"second {kind} message for stage {stage} microbatch {microbatch}")
        self.pending[key] = (tensor, t)

    def recv(self, kind: str, stage: int, microbatch: int) -> tuple[torch.Tensor, float] | None:
        return self.pending.pop((kind, stage, microbatch), None)
