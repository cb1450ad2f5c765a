"""What the built-in language models share (the small transformer of
:mod:`pipebubble.models` and the MoE transformer of :mod:`pipebubble.models.moe`): the head and
the embedding, the head and the next-token loss. A module of its own so that neither model
imports the other.
"""

from __future__ import annotations

import torch
from torch import nn


class Embedding(nn.Module):
    """Token + learned position embedding: many parameters, a table lookup of compute."""

    role = "embedding"

    def __init__(self, vocab: int, dim: int, seq: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.zeros(seq, dim))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tokens(idx) + self.positions[: idx.shape[1]]


class Head(nn.Module):
    """Final norm and the projection to the vocabulary: large in parameters and compute."""

    role = "head"

    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, the mean over every position of the batch."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
