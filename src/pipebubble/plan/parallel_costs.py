"""Per-layer costs of a transformer at one point of (tp, sp, cp) on one GPU model.

Where :class:`~pipebubble.plan.layercosts.ProfileSet` scales measured (or fixed-rate
analytic) times, this computes every layer from the model's shape (an analytic or HF
profile's ``model``) with the compute model (:mod:`~pipebubble.plan.compute`), the TP and CP
collectives (:mod:`~pipebubble.plan.tensor`, :mod:`~pipebubble.plan.context`) and the
activation counts (:mod:`~pipebubble.plan.memory`), and answers the same
:meth:`~ParallelCosts.at` (a :class:`~pipebubble.plan.layercosts.LayerCosts` per microbatch
size and recompute mode), so the pipeline search is the same for both.

One block on one rank, ``T = s b / cp`` tokens, ``t`` = TP degree, ``q`` = heads x head size,
``kv`` = K/V heads x head size, GEMMs as ``(m, n, k)``:

- forward: QKV ``(T, (q + 2 kv)/t, h)``, attention, O ``(T, h, q/t)``, MLP up (and gate)
  ``(T, f/t [x2], h)``, down ``(T, h, f/t)``; memory-bound norms, residuals, rotary or
  dropout, activation; two TP collectives; CP's exposed ring exchange;
- I (input gradient): each GEMM's data gradient (the same FLOPs, ``n`` and ``k`` swapped),
  the attention backward, twice the forward's memory-bound bytes, what the weight gradients
  of QKV and the MLP up-projection do not hide of the two TP collectives
  (:mod:`~pipebubble.plan.tensor`; an I without its W, in a split schedule, carries them
  whole: ``hidden``), CP;
- W (weight gradient): each GEMM's weight gradient ``(k, n, T)`` and, where the framework
  accumulates gradients outside the GEMM, that pass over the layer's parameters
  (``Hardware.grad_accumulation_bytes``, 0 by default): what a zero-bubble schedule may
  delay.

Recomputation adds to I the forward it re-runs: all of F (``full``) or the attention
(``selective``). The head's transient is what the framework's loss holds beyond the fp32
probabilities the head keeps, ``Hardware.loss_bytes`` a local logit (``T V / t`` of them;
:mod:`~pipebubble.plan.frameworks`).

Precision (``plan --precision fp8``, :mod:`~pipebubble.plan.compute`): the four GEMMs of a
block, forward and both gradients, at the FP8 rate when ``rates`` has one; attention, the
memory-bound work and the head's GEMM in 16-bit.
"""

from __future__ import annotations

import numpy as np

from .analytic import RECOMPUTE_MODES
from .compute import Rates, attention_backward_time, attention_time, gemm_time, memory_time
from .context import block_cp_comm
from .layercosts import LayerCosts
from .memory import (
    block_activation_bytes,
    block_weight_grad_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    op_sac_matmuls,
)
from .network import Network
from .tensor import block_tp_comm, block_tp_hidden, tp_collective

MODES = RECOMPUTE_MODES  # (the analytic profile's; op: torchtitan's op-level SAC, memory.py)


class ParallelCosts:
    """The layers (embedding, blocks, head) of ``shape`` at ``seq`` tokens per sequence,
    TP ``tp`` (``sp``: sequence parallel), CP ``cp``, on ``rates`` and ``net``."""

    def __init__(self, shape, seq: int, rates: Rates, net: Network, tp: int = 1,
                 sp: bool = False, cp: int = 1, flash: bool = True, names=None,
                 modules=None, profile=None):
        self.shape, self.seq, self.rates, self.net = shape, seq, rates, net
        self.tp, self.sp, self.cp, self.flash = tp, sp, cp, flash
        L = shape.layers
        self.names = names or ["tok_embeddings", *(f"layers.{i}" for i in range(L)), "output"]
        self.modules = modules or [[n] for n in self.names]
        self.profile = profile
        t, h = tp, shape.hidden
        emb = shape.vocab * h / t + shape.positions * h
        head = (0 if shape.tied_embeddings else shape.vocab * h / t) + shape.head_params() - (
            0 if shape.tied_embeddings else shape.vocab * h)
        block = shape.block_matmul_params() / t + (shape.block_params()
                                                   - shape.block_matmul_params())
        self.params = np.array([emb, *([block] * L), head], dtype=np.float64)
        self.tied = shape.vocab * h / t if shape.tied_embeddings else 0.0  # the head's copy
        self._cache: dict[tuple[int, str], LayerCosts] = {}

    def __len__(self) -> int:
        return self.shape.layers + 2

    def recompute_modes(self) -> tuple[str, ...]:
        return MODES

    def metadata(self) -> dict:
        return self.profile.metadata if self.profile is not None else {}

    # -- one block --
    def block(self, b: int) -> dict[str, float]:
        """Seconds of one block's F, I, W, attention forward, and its TP/CP comm."""
        sh, r, t, cp = self.shape, self.rates, self.tp, self.cp
        T = self.seq * b / cp
        h, f = sh.hidden, sh.ffn
        q, kv = sh.heads * sh.head_dim, sh.kv * sh.head_dim
        up = (2 if sh.swiglu else 1) * f / t
        gemms = [(T, (q + 2 * kv) / t, h), (T, h, q / t), (T, up, h), (T, h, f / t)]
        fwds = [gemm_time(m, n, k, r, fp8=True) for m, n, k in gemms]  # FP8 if r has it
        fwd = sum(fwds)
        dgrads = [gemm_time(m, k, n, r, fp8=True) for m, n, k in gemms]
        wgrads = [gemm_time(k, n, m, r, fp8=True) for m, n, k in gemms]
        dgrad, wgrad = sum(dgrads), sum(wgrads)
        attn = attention_time(T, self.seq, q / t, r, flash=self.flash, sequences=b,
                              head_dim=sh.head_dim)
        attn_b = attention_backward_time(attn, self.flash)
        rows = T / (t if self.sp else 1)  # norms, residuals, dropout: every TP rank w/o SP
        elementwise = (2 * 4 + 2 * 6) * rows * h  # two norms (r+w), two residual adds
        if sh.dropout:
            elementwise += 2 * 5 * rows * h  # two dropouts: read, write, mask
        else:
            elementwise += 4 * T * (q + kv) / t  # rotary on Q and K
        elementwise += (6 if sh.swiglu else 4) * T * f / t  # the MLP's activation
        mem = memory_time(elementwise, r)
        hide = (wgrads[0], wgrads[2])
        tp_f, tp_b = block_tp_comm(T, h, t, self.net, self.sp, hide=hide,
                                   hide_dgrad=(dgrads[0], dgrads[2]), fwd_gemms=tuple(fwds),
                                   dgrad_rows=(dgrads[1], dgrads[3]))
        tp_hidden = block_tp_hidden(T, h, t, self.net, self.sp, hide=hide,
                                    hide_dgrad=(dgrads[0], dgrads[2]))
        cp_f, cp_b = block_cp_comm(T, kv / t, cp, t, self.net, (attn, attn_b))
        F = fwd + attn + mem + tp_f + cp_f
        # op-level SAC (memory.op_sac_matmuls) re-runs the multiplies it does not keep, every
        # element-wise op (norms, rotary, the MLP's activation, residual adds) and, with SP,
        # the forward's two all-gathers (half its TP collectives; the reduce-scatters kept)
        redo = {"wk": gemm_time(T, kv / t, h, r, fp8=True), "wo": fwds[1],
                "w3": gemm_time(T, f / t, h, r, fp8=True), "w2": fwds[3]}
        op = sum(redo[n] for n, _, kept in op_sac_matmuls(sh, t) if not kept) + mem + (
            tp_f / 2 if self.sp else tp_f)
        return {"f": F, "i": dgrad + attn_b + 2 * mem + tp_b + cp_b, "w": wgrad,
                "selective": attn + cp_f, "op": op, "hidden": tp_hidden}

    def ends(self, b: int) -> tuple[dict, dict]:
        """Embedding and head: (f, i, w) seconds each."""
        sh, r, t = self.shape, self.rates, self.tp
        T = self.seq * b / self.cp
        h, V = sh.hidden, sh.vocab
        emb = {"f": memory_time(2 * T * h, r) + tp_collective(T, h, t, self.net, self.sp),
               "i": 0.0, "w": memory_time(6 * T * h, r)}  # gather; scatter-add of fp32 grads
        ce = memory_time(12 * T * V / t, r)  # fp32 logits: softmax read/write, loss
        head = {"f": memory_time(4 * T * h, r) + gemm_time(T, V / t, h, r) + ce,
                "i": gemm_time(T, h, V / t, r) + ce + memory_time(8 * T * h, r)
                + tp_collective(T, h, t, self.net, self.sp),
                "w": gemm_time(h, V / t, T, r)}
        return emb, head

    def at(self, size: int, recompute: str = "none") -> LayerCosts:
        key = (size, recompute)
        got = self._cache.get(key)
        if got is not None:
            return got
        sh, s, b, t, sp, cp = self.shape, self.seq, size, self.tp, self.sp, self.cp
        blk = self.block(b)
        emb, head = self.ends(b)
        L = sh.layers
        a_none = block_activation_bytes(sh, s, b, t, sp, cp, "none", self.flash)
        a_keep = block_activation_bytes(sh, s, b, t, sp, cp, recompute, self.flash)
        extra = {"none": 0.0, "selective": blk["selective"], "full": blk["f"],
                 "op": blk["op"]}[recompute]
        a_w = min(block_weight_grad_bytes(sh, s, b, t, sp, cp), a_keep)
        a_emb = embedding_activation_bytes(s, b, cp)
        a_head = head_activation_bytes(sh, s, b, t, sp, cp)
        out = 2 * s * b / cp * sh.hidden / t  # SP (or Megatron's scatter-gather) split
        col = lambda e, x, hd: np.array([e, *([x] * L), hd], dtype=np.float64)  # noqa: E731
        acc = [memory_time(self.rates.grad_accumulation * P, self.rates)
               for P in (self.params[0], self.params[1], self.params[-1])]
        lc = LayerCosts(
            f=col(emb["f"], blk["f"], head["f"]),
            i=col(emb["i"], blk["i"] + extra, head["i"]),
            w=col(emb["w"] + acc[0], blk["w"] + acc[1], head["w"] + acc[2]),
            act=col(a_emb, a_keep, a_head), act_w=col(0.0, a_w, min(a_head, 2 * s * b / cp
                                                                        * sh.hidden)),
            out=col(out, out, 0.0), params=self.params,
            transient=col(0.0, a_none - a_keep, self.rates.loss_bytes * s * b / cp
                          * sh.vocab / t), tied=self.tied,
            hidden=col(0.0, blk["hidden"], 0.0))
        self._cache[key] = lc
        return lc


def model_flops_per_sequence(shape, seq: int) -> float:
    """Model FLOPs of one sequence's forward and backward (3 forwards, no recomputation),
    attention counted in full as Narayanan et al. 2021 (eq. 3) do: ``6 s P_mm + 12 L s^2 q +
    6 s h V``: what MFU divides by."""
    q = shape.heads * shape.head_dim
    return 3 * (2 * seq * shape.layers * shape.block_matmul_params()
                + 4 * shape.layers * seq * seq * q + 2 * seq * shape.hidden * shape.vocab)
