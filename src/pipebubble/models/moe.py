"""``moe``: a small mixture-of-experts causal language model, cut like the ``transformer``.

Embedding | ``layers`` MoE blocks | norm + head, each block pre-norm causal self-attention
followed by a mixture of experts (as in Mixtral and DeepSeekMoE, at toy size):

- a **router** (``dim x experts``, no bias) scores each token; softmax, then the token's
  top ``top_k`` experts (*token choice*) with their probabilities renormalised to sum to 1;
- **experts**: ``experts`` SwiGLU MLPs (``down(silu(gate x) * up x)``, inner size ``ffn``);
  each token's output is the weighted sum of its ``top_k`` experts' outputs;
- an optional **shared expert** (``shared=1``: one more SwiGLU MLP every token passes
  through, DeepSeekMoE's and Qwen-MoE's).

**Why the pipeline's gradients equal the unsplit model's exactly.** Routing is per token and
nothing is dropped: there is no expert capacity (every token reaches all of its ``top_k``
experts however many others chose them), so a token's output does not depend on which other
tokens share its microbatch. Splitting the batch into microbatches and the model into stages
therefore computes the same function, and accumulating the microbatches' gradients gives the
whole batch's (in float64 to ~1e-15; ``run --check --dtype float64`` prints the difference).
Every expert runs on every microbatch, on the tokens routed to it, possibly none: its
gradient is then a tensor of zeros, never missing, on every stage and every copy.

**Expert parallelism** (``run --ep N``) spreads each layer's experts over N data-parallel
replicas and sends the tokens to them and back by all-to-all: :mod:`pipebubble.runtime.ep`
(the same function, so the same gradients).

**The router's auxiliary (load-balancing) loss is refused** (``aux_loss`` other than 0 is a
one-line error). Switch Transformer's loss ``E sum_i f_i P_i`` multiplies two averages over
the *whole batch* (``f_i`` the fraction of tokens routed to expert ``i``, ``P_i`` its mean
router probability): the mean of the microbatches' losses is not the batch's loss, so a
pipeline cannot add it "exactly as in the unsplit model"; Megatron-LM computes it per
microbatch instead, which is a different loss. DeepSeek-V3 trains without it (a routing bias
balances the load). With no auxiliary loss the model's only loss is the head's cross-entropy,
as for every other model the schedules run.

>>> spec = moe(layers=2, dim=16, heads=2, experts=4, top_k=2, vocab=50, seq=8)
>>> [type(m).__name__ for m in spec.layers], spec.layer_roles()[0]
(['Embedding', 'MoEBlock', 'MoEBlock', 'Head'], 'embedding')
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UserError
from .lm_parts import Embedding, Head, lm_loss
from .spec import ModelSpec


class SwiGLU(nn.Module):
    """``down(silu(gate x) * up x)``: LLaMA's MLP, one expert."""

    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Token-choice top-k routing over SwiGLU experts, no capacity limit (module doc)."""

    def __init__(self, dim: int, experts: int, top_k: int, ffn: int, shared: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(dim, ffn) for _ in range(experts))
        self.shared = SwiGLU(dim, ffn * shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(tokens), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (tokens, k)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)  # may be empty: zeros, not None
            out = out.index_add(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view_as(x)


class MoEBlock(nn.Module):
    """Pre-norm causal self-attention + a mixture of experts."""

    def __init__(self, dim: int, heads: int, experts: int, top_k: int, ffn: int, shared: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.moe = MoE(dim, experts, top_k, ffn, shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


def moe(layers: int = 4, dim: int = 32, heads: int = 4, vocab: int = 512, seq: int = 16,
        experts: int = 4, top_k: int = 2, ffn: int | None = None, shared: int = 1,
        aux_loss: float = 0.0, seed: int = 0) -> ModelSpec:
    """Embedding, ``layers`` MoE blocks, head: ``layers + 2`` pipeline-cuttable layers.

    ``experts`` routed SwiGLU experts of inner size ``ffn`` (default ``2 dim``), ``top_k``
    of them per token, ``shared`` (0 or 1) shared experts. ``aux_loss`` must be 0 (the
    module doc says why).
    """
    for name, value in (("layers", layers), ("dim", dim), ("heads", heads), ("vocab", vocab),
                        ("seq", seq), ("experts", experts), ("top_k", top_k)):
        _check(name, value)
    ffn = 2 * dim if ffn is None else ffn
    _check("ffn", ffn)
    if dim % heads:
        raise UserError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
    if top_k > experts:
        raise UserError(f"top_k must be in 1..{experts} (the experts), got {top_k}")
    if shared not in (0, 1):
        raise UserError(f"shared must be 0 or 1 (shared experts), got {shared!r}")
    if aux_loss != 0:
        raise UserError(f"aux_loss={aux_loss}: the router's load-balancing loss is refused (it "
                        "is a product of whole-batch averages, not a sum over microbatches, so "
                        "no pipeline adds it as the unsplit model does); use aux_loss=0")
    torch.manual_seed(seed)
    parts: list[nn.Module] = [Embedding(vocab, dim, seq)]
    parts += [MoEBlock(dim, heads, experts, top_k, ffn, shared) for _ in range(layers)]
    parts.append(Head(dim, vocab))

    def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    return ModelSpec("moe", parts, make_batch, lm_loss,
                     description=f"moe ({layers} blocks of {experts} experts, top-{top_k}"
                     f"{', 1 shared' if shared else ''}; dim {dim}, vocab {vocab}, seq {seq})")


def _check(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be an integer >= 1, got {value!r}")
