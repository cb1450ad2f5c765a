"""Built-in models, as flat layer lists ready to be cut into stages.

- :func:`mlp`: ``layers`` blocks of Linear -> GELU, every block the same compute.
- :func:`transformer`: a small causal language model: a token embedding with many parameters
  and almost no compute, ``layers`` transformer blocks, and a large output head. It makes the
  lesson's point: balancing by parameter count is not balancing by compute.
- :func:`pipebubble.models.moe.moe`: the same with mixture-of-experts blocks (top-k routed
  SwiGLU experts and a shared one, no capacity drop: the pipeline's gradients are exact).

Each builder returns a :class:`ModelSpec` with the layer list, a sample input/target maker and
the loss, so the runtime, the profiler and the partitioner treat every model alike. Your own
models come in through :func:`pipebubble.models.loader.load_model` (``--model SPEC``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UserError
from . import moe as _moe
from . import sleep as _sleep
from .lm_parts import Embedding, Head, lm_loss  # noqa: F401 - pipebubble.models.Head, … as before
from .spec import ModelSpec

__all__ = ["MODELS", "ModelSpec", "build_model", "mlp", "transformer"]


class MLPBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


def mlp(layers: int = 8, width: int = 64, seed: int = 0) -> ModelSpec:
    """``layers`` equal Linear+GELU blocks; regression to random targets (MSE)."""
    _check("layers", layers)
    _check("width", width)
    torch.manual_seed(seed)
    blocks: list[nn.Module] = [MLPBlock(width) for _ in range(layers)]

    def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen)

    return ModelSpec("mlp", blocks, make_batch, nn.functional.mse_loss)


class Block(nn.Module):
    """Pre-norm causal self-attention + MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def transformer(
    layers: int = 4, dim: int = 64, heads: int = 4, vocab: int = 4096, seq: int = 32,
    seed: int = 0,
) -> ModelSpec:
    """Embedding, ``layers`` blocks, head: ``layers + 2`` pipeline-cuttable layers."""
    for name, value in (("layers", layers), ("dim", dim), ("heads", heads), ("vocab", vocab),
                        ("seq", seq)):
        _check(name, value)
    if dim % heads:
        raise UserError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
    torch.manual_seed(seed)
    parts: list[nn.Module] = [Embedding(vocab, dim, seq)]
    parts += [Block(dim, heads) for _ in range(layers)]
    parts.append(Head(dim, vocab))

    def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    return ModelSpec("transformer", parts, make_batch, lm_loss)


MODELS = {"mlp": mlp, "transformer": transformer, "moe": _moe.moe, "sleep": _sleep.sleep}


def build_model(name: str, **kwargs: int) -> ModelSpec:
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; valid are {', '.join(MODELS)}")
    return MODELS[name](**kwargs)


def _check(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be an integer >= 1, got {value!r}")
