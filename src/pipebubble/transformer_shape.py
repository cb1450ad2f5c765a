"""A decoder-only transformer's shape (layers, widths, heads, vocabulary): what an HF config
says, read by the HF adapter (:mod:`pipebubble.models.hf`, to bound a build before it
allocates) and by the analytic profile (:mod:`pipebubble.plan.analytic`, which re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ParamError, UserError, param

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_HEADS = param("heads")
_HIDDEN = param("hidden")
_KV_HEADS = param("kv_heads")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class Heads:
    """The attention-head sizes a shape derives from its ``hidden``, ``heads``, ``kv_heads``
    (None: as many as ``heads``) and ``head_size`` (None: hidden / heads) fields; shared by
    :class:`TransformerShape` and the MoE shape of :mod:`pipebubble.plan.moe`."""

    hidden: int
    heads: int
    kv_heads: int | None
    head_size: int | None

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads


@dataclass(frozen=True)
class TransformerShape(Heads):
    """A decoder-only transformer's shape; ``kv_heads`` None means ``heads``."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int
    kv_heads: int | None = None
    tied_embeddings: bool = False
    swiglu: bool = True
    head_size: int | None = None  # None: hidden / heads (Mistral-Nemo, Qwen3 set it)
    positions: int = 0  # learned position embeddings (GPT-2: n_positions); 0: rotary
    dropout: bool = False  # GPT keeps dropout masks; LLaMA has none
    biases: bool = False  # GPT-2: every linear and LayerNorm has a bias

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "heads", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"--{name} must be an integer >= 1, got {value!r}")
        if self.head_size is None and self.hidden % self.heads:
            raise ParamError(f"{_HIDDEN} {self.hidden} must be a multiple of {_HEADS} "
                             f"{self.heads} (head size = hidden / heads)")
        kv = self.kv
        if not isinstance(kv, int) or kv < 1 or self.heads % kv:
            raise ParamError(f"{_KV_HEADS} must divide {_HEADS} {self.heads} (valid: "
                             f"{', '.join(str(d) for d in _divisors(self.heads))}), got {kv!r}")

    def block_matmul_params(self) -> int:
        """Parameters in the block's matrices: Q, K, V, O and the MLP."""
        h, kvd, qd = self.hidden, self.kv * self.head_dim, self.heads * self.head_dim
        return 2 * h * qd + 2 * h * kvd + (3 if self.swiglu else 2) * h * self.ffn

    def block_params(self) -> int:
        """Matrices + two norms (RMSNorm ``h`` each; LayerNorm with bias ``2 h``) + biases
        (GPT-2: Q, K, V, O, the MLP's two)."""
        h, kvd, qd = self.hidden, self.kv * self.head_dim, self.heads * self.head_dim
        bias = (qd + 2 * kvd + h + self.ffn + h) + 2 * h if self.biases else 0
        return self.block_matmul_params() + 2 * h + bias

    def embedding_params(self) -> int:
        return (self.vocab + self.positions) * self.hidden

    def head_params(self) -> int:
        """Final norm + output projection (0 when tied to the embedding)."""
        norm = 2 * self.hidden if self.biases else self.hidden
        return norm + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self.embedding_params() + self.layers * self.block_params() + self.head_params()
