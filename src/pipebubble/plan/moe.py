"""Mixture-of-experts transformers: their shapes, parameters and per-layer costs.

In an MoE layer the MLP is replaced by ``E`` routed experts (each a SwiGLU MLP of inner size
``f_e``), a router (a ``h x E`` matrix whose scores pick each token's top ``k`` experts) and,
in some models, ``n_s`` shared experts that every token passes through. A token therefore
multiplies by only ``k`` of the ``E`` experts: the *active* parameters are far fewer than the
*total* parameters, and compute follows the active ones while memory follows the total.

Per MoE layer and microbatch of ``t = s b`` tokens (``h`` hidden, 2-byte activations):

- **router** FLOPs ``2 t h E``; **active experts** ``2 t k (3 h f_e)``; **shared experts**
  ``2 t n_s (3 h f_s)`` (Qwen2-MoE's sigmoid gate on its shared expert: ``2 t h``);
  attention as in :mod:`pipebubble.plan.analytic` (``2 t P_attn`` plus the scores
  ``2 b s^2 a (d_qk + d_v)``); the backward twice the forward, split into I and W alike.
- **parameters**: total ``E 3 h f_e + n_s 3 h f_s + h E`` (+ DeepSeek-V3's ``E`` routing
  biases, + Qwen2-MoE's ``h`` shared gate) and active ``k 3 h f_e + n_s 3 h f_s + h E`` (+ gate).
- **activations kept for the backward** (bytes): the attention part as for a dense block;
  the MLP input ``2 t h``; the router's fp32 probabilities ``4 t E``; the *dispatched
  tokens*, ``t k`` copies of the input ``2 t k h``; each copy's SwiGLU inner tensors (gate,
  up, their product) ``6 t k f_e``; the expert outputs the combine weighs ``2 t k h``; the
  shared experts' inner tensors ``6 t n_s f_s``. What W alone needs (Zero Bubble's ``M_W``):
  the matrix multiplies' inputs.
- **all-to-all**: with expert parallelism each MoE layer sends the ``t k`` dispatched tokens
  to their experts' ranks and back (dispatch and combine) in the forward, and their gradients
  in the backward: four all-to-alls a microbatch, each moving ``t k h`` values (``2 t k h``
  bytes in bf16), of which ``(EP - 1) / EP`` leave the rank when routing is even.

**Attention** is grouped-query (Mixtral, Qwen-MoE; Qwen3's per-head RMSNorm on Q and K,
Qwen2's Q/K/V biases) or DeepSeek's **multi-head latent attention** (MLA, DeepSeek-V2 paper,
arXiv 2405.04434): Q from a rank-``q_lora_rank`` latent (``h x r_q``, a norm, ``r_q x a
(d_nope + d_rope)``), keys and values from a rank-``kv_lora_rank`` latent plus one shared
rotary key (``h x (r_kv + d_rope)``, a norm, ``r_kv x a (d_nope + d_v)``), and the output
``a d_v x h``. Training materialises full keys and values (no weight absorption).

**Checked by hand against the published totals** (by
the HF ``config.json`` of each model, in ``tests/test_moe_shapes.py``):

=================  ===================  ====================  ==========================
 model              total (ours/pub.)    active (ours/pub.)    published in
=================  ===================  ====================  ==========================
 Mixtral-8x7B       46.70B / 46.7B       12.88B / 12.9B        Mistral AI, "Mixtral of
                                                               experts" (blog, Dec 2023)
 DeepSeek-V3        671.03B / 671B       37.55B / 37B          DeepSeek-V3 technical report
                                                               (arXiv 2412.19437), abstract
 Qwen3-30B-A3B      30.53B / 30.5B       3.35B / 3.3B          Qwen3-30B-A3B model card
                                                               (Hugging Face; non-embedding
                                                               29.9B)
 Qwen1.5-MoE-A2.7B  14.32B / 14.3B       2.69B / 2.7B          Qwen blog, "Qwen1.5-MoE"
                                                               (Mar 2024)
=================  ===================  ====================  ==========================

Totals agree within 0.12 %, Mixtral's and Qwen1.5's active counts within 0.4 %.
DeepSeek's and Qwen3's active figures are ours *cut* to their stated digits (37.55 -> "37",
3.35 -> "3.3"), 1.5 % and 1.6 % below ours: they are the same count, written short. Active
counts include the embedding and the head, as Mistral's 12.9B does (without the embedding row
a token looks up, Mixtral would be 12.75B). DeepSeek-V3's multi-token-prediction module
(``num_nextn_predict_layers``, 14B more in the released 685B checkpoint) is a training-time
extra head and is excluded, as the 671B figure excludes it.

>>> shape = MoEShape(layers=32, hidden=4096, heads=32, vocab=32000, experts=8, top_k=2,
...                  expert_ffn=14336, kv_heads=8)          # Mixtral-8x7B
>>> shape.total_params(), shape.active_params()
(46702792704, 12879925248)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import UserError, param
from ..hf_keys import MOE_TYPES
from ..limits import check_layers
from ..transformer_shape import Heads
from .analytic import DTYPE_BYTES, FORMAT, SOURCE, _layer, embedding_layer, head_layer, profile_rate
from .profile import Profile


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (module doc); ``q_rank`` 0: a plain Q
    projection (DeepSeek-V2-Lite)."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int


@dataclass(frozen=True)
class MoEShape(Heads):
    """A decoder-only MoE transformer (module doc). Layers listed in ``dense_layers`` have a
    dense SwiGLU MLP of inner size ``dense_ffn``; every other layer is an MoE layer."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    experts: int
    top_k: int
    expert_ffn: int
    kv_heads: int | None = None
    head_size: int | None = None  # None: hidden / heads
    shared_experts: int = 0
    shared_ffn: int = 0  # inner size of each shared expert
    shared_gate: bool = False  # Qwen2-MoE: sigmoid(x w) scales the shared expert
    router_bias: bool = False  # DeepSeek-V3: e_score_correction_bias, E values
    # DeepSeek's group-limited routing (n_group, topk_group): the experts in ``expert_groups``
    # groups, each token's top-k within its ``group_top_k`` best groups (0: no limit)
    expert_groups: int = 0
    group_top_k: int = 0
    dense_layers: tuple[int, ...] = ()
    dense_ffn: int = 0
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's Q and K (d values each)
    qkv_bias: bool = False  # Qwen2: biases on Q, K, V
    mla: LatentAttention | None = None
    tied_embeddings: bool = False
    extra: dict = field(default_factory=dict, compare=False)  # e.g. MTP layers left out

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "expert_ffn"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.experts, int) or self.experts < 1:
            raise UserError(f"experts must be an integer >= 1, got {self.experts!r}")
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.experts:
            raise UserError(f"top_k must be in 1..{self.experts} (the experts), got "
                             f"{self.top_k!r}")
        if self.dense_layers and self.dense_ffn < 1:
            raise UserError("dense layers need dense_ffn >= 1 (their MLP's inner size)")
        bad = [i for i in self.dense_layers if not 0 <= i < self.layers]
        if bad:
            raise UserError(f"dense layer {bad[0]} is not a layer (valid 0..{self.layers - 1})")

    def is_moe(self, n: int) -> bool:
        return n not in self.dense_layers

    @property
    def moe_layers(self) -> int:
        return self.layers - len(set(self.dense_layers))

    # ---- attention ---------------------------------------------------------------------
    def attention_matmul_params(self) -> int:
        h, a = self.hidden, self.heads
        m = self.mla
        if m is None:
            qd, kvd = a * self.head_dim, self.kv * self.head_dim
            return 2 * h * qd + 2 * h * kvd
        qk = a * (m.nope_dim + m.rope_dim)
        q = h * m.q_rank + m.q_rank * qk if m.q_rank else h * qk
        kv = h * (m.kv_rank + m.rope_dim) + m.kv_rank * a * (m.nope_dim + m.v_dim)
        return q + kv + a * m.v_dim * h

    def attention_other_params(self) -> int:
        """The latent norms (MLA), Q/K norms (Qwen3), Q/K/V biases (Qwen2)."""
        if self.mla is not None:
            return self.mla.q_rank + self.mla.kv_rank
        out = 2 * self.head_dim if self.qk_norm else 0
        if self.qkv_bias:
            out += (self.heads + 2 * self.kv) * self.head_dim
        return out

    def score_flops(self, s: int, b: int) -> float:
        """``Q K^T`` and ``scores x V`` of one microbatch (full, not halved for causality)."""
        if self.mla is None:
            dqk = dv = self.head_dim
        else:
            dqk, dv = self.mla.nope_dim + self.mla.rope_dim, self.mla.v_dim
        return 2 * b * s * s * self.heads * (dqk + dv)

    # ---- the MLP: dense or experts -----------------------------------------------------
    def expert_params(self) -> int:
        """One routed expert (SwiGLU: gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn

    def shared_params(self) -> int:
        """All shared experts (and their gate)."""
        return (self.shared_experts * 3 * self.hidden * self.shared_ffn
                + (self.hidden if self.shared_gate else 0))

    def router_params(self) -> int:
        return self.hidden * self.experts + (self.experts if self.router_bias else 0)

    def mlp_params(self, n: int, active: bool = False) -> int:
        if not self.is_moe(n):
            return 3 * self.hidden * self.dense_ffn
        routed = (self.top_k if active else self.experts) * self.expert_params()
        return routed + self.shared_params() + self.router_params()

    def layer_params(self, n: int, active: bool = False) -> int:
        """Layer ``n``'s parameters (``active``: what one token multiplies by)."""
        return (self.attention_matmul_params() + self.attention_other_params()
                + 2 * self.hidden + self.mlp_params(n, active))

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        return self.hidden + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        return (self.embedding_params() + self.head_params()
                + sum(self.layer_params(n) for n in range(self.layers)))

    def active_params(self) -> int:
        return (self.embedding_params() + self.head_params()
                + sum(self.layer_params(n, True) for n in range(self.layers)))

    def as_dict(self) -> dict:
        out = asdict(self)
        out["dense_layers"] = list(self.dense_layers)
        return out


@dataclass(frozen=True)
class LayerCost:
    """One layer's forward FLOPs by part, and its bytes, for one microbatch (module doc)."""

    attention_flops: float
    router_flops: float
    expert_flops: float
    shared_flops: float
    dense_flops: float  # a dense layer's MLP
    scores: float  # of attention_flops, the s^2 part (no weights)
    activation_bytes: float
    weight_activation_bytes: float
    dispatched_tokens: int
    all_to_all_bytes: float  # one all-to-all (dispatch or combine), before (EP - 1) / EP

    @property
    def forward_flops(self) -> float:
        return (self.attention_flops + self.router_flops + self.expert_flops
                + self.shared_flops + self.dense_flops)


def layer_cost(shape: MoEShape, n: int, s: int, b: int, bytes_: int = 2,
               flash: bool = True) -> LayerCost:
    """The costs of layer ``n`` on ``b`` sequences of ``s`` tokens (module doc).

    >>> tiny = MoEShape(layers=1, hidden=8, heads=2, vocab=10, experts=4, top_k=2,
    ...                 expert_ffn=16)
    >>> c = layer_cost(tiny, 0, s=3, b=1)
    >>> c.router_flops, c.expert_flops, c.dispatched_tokens, c.all_to_all_bytes
    (192, 4608, 6, 96.0)
    """
    t, h, k = s * b, shape.hidden, bytes_ / 2
    scores = shape.score_flops(s, b)
    attn = 2 * t * shape.attention_matmul_params() + scores
    # what attention keeps (2-byte units): both norm inputs, the attention input, Q K V,
    # the output projection's input; MLA also its latents and their normed copies
    a = shape.heads
    m = shape.mla
    if m is None:
        qd, kvd = a * shape.head_dim, shape.kv * shape.head_dim
        attn_act = 6 * t * h + 2 * t * qd + 4 * t * kvd + 2 * t * qd
        attn_w = 2 * t * h + 2 * t * qd  # the QKV and output projections' inputs
    else:
        qk, v = a * (m.nope_dim + m.rope_dim), a * m.v_dim
        latents = 2 * t * (2 * m.q_rank + m.kv_rank + m.rope_dim + m.kv_rank)
        attn_act = 6 * t * h + latents + 2 * t * (2 * qk + v) + 2 * t * v
        attn_w = 2 * t * h + 2 * t * (m.q_rank + m.kv_rank) + 2 * t * v
    if not flash:
        attn_act += 5 * a * s * s * b
    if not shape.is_moe(n):
        f = shape.dense_ffn
        return LayerCost(attn, 0, 0, 0, 2 * t * 3 * h * f, scores,
                         (attn_act + 2 * t * h + 6 * t * f) * k,
                         (attn_w + 2 * t * h + 2 * t * f) * k, 0, 0)
    E, top, fe = shape.experts, shape.top_k, shape.expert_ffn
    ns, fs = shape.shared_experts, shape.shared_ffn
    router = 2 * t * h * E
    experts = 2 * t * top * shape.expert_params()
    shared = 2 * t * (ns * 3 * h * fs + (h if shape.shared_gate else 0))
    dispatched = t * top
    act = (attn_act + 2 * t * h + 4 * t * E / k + 2 * dispatched * h + 6 * dispatched * fe
           + 2 * dispatched * h + 6 * t * ns * fs) * k
    act_w = (attn_w + 2 * t * h + 2 * dispatched * h + 2 * dispatched * fe
             + 2 * t * ns * fs) * k
    return LayerCost(attn, router, experts, shared, 0, scores, act, act_w, dispatched,
                     2 * dispatched * h * k)


def moe_profile(shape: MoEShape, seq: int, batch: int, tflops: float | None = None,
                mfu: float | None = None, dtype: str = "bf16", attention: str = "flash",
                source: dict | None = None) -> Profile:
    """The analytic profile of an MoE model: ``tok_embeddings``, ``layers.N`` (type
    ``MoEBlock`` or, for the dense ones, ``TransformerBlock``), ``output``.

    Each block carries the fields of :func:`pipebubble.plan.analytic.shape_profile` and
    ``attention_flops``, ``router_flops``, ``expert_flops`` (the top-k routed experts),
    ``shared_expert_flops``, ``dense_mlp_flops`` (dense blocks; all forward, one
    microbatch), ``active_params``, ``dispatched_tokens`` (``t k``) and ``all_to_all_bytes``
    (one of the four all-to-alls). The metadata has ``params`` (total),
    ``active_params`` and ``moe`` (the shape); it has no ``model`` entry, so ``plan``
    prices the layers from their own times (``--tflops`` and ``--mfu``), not from a dense
    transformer's shape.

    >>> tiny = MoEShape(layers=2, hidden=8, heads=2, vocab=10, experts=4, top_k=2,
    ...                 expert_ffn=16, dense_layers=(0,), dense_ffn=32)
    >>> p = moe_profile(tiny, seq=4, batch=1, tflops=1, mfu=1)
    >>> [layer.type for layer in p.layers]
    ['Embedding', 'TransformerBlock', 'MoEBlock', 'NormHead']
    >>> sum(layer.params for layer in p.layers) == tiny.total_params()
    True
    """
    check_layers(shape.layers)
    free = tflops is None and mfu is None
    rate = profile_rate(seq, batch, tflops, mfu, dtype, attention)
    k = DTYPE_BYTES[dtype] / 2
    s, b, h = seq, batch, shape.hidden
    t = s * b
    out = [embedding_layer(shape.embedding_params(), t, h, k, rate)]
    for n in range(shape.layers):
        c = layer_cost(shape, n, s, b, DTYPE_BYTES[dtype], attention == "flash")
        mm = c.forward_flops - c.scores  # the matrix multiplies: one I and one W each
        fwd = c.forward_flops
        selective = c.activation_bytes - (5 * shape.heads * s * s * b * k
                                          if attention != "flash" else 0)
        layer = _layer(f"layers.{n}", "MoEBlock" if shape.is_moe(n) else "TransformerBlock",
                       params=shape.layer_params(n), fwd=fwd, i=mm + 2 * c.scores, w=mm,
                       rate=rate, act=c.activation_bytes, act_w=c.weight_activation_bytes,
                       out_bytes=2 * t * h * k, full=(2 * t * h * k, fwd / rate),
                       selective=(selective, c.scores / rate))
        layer.extra.update({
            "attention_flops": float(c.attention_flops), "router_flops": float(c.router_flops),
            "expert_flops": float(c.expert_flops), "dense_mlp_flops": float(c.dense_flops),
            "shared_expert_flops": float(c.shared_flops),
            "active_params": shape.layer_params(n, True),
            "dispatched_tokens": c.dispatched_tokens,
            "all_to_all_bytes": float(c.all_to_all_bytes)})
        out.append(layer)
    out.append(head_layer(shape.head_params(), t, h, shape.vocab, k, rate))
    meta = {"format": FORMAT, "source": "analytic", "method": SOURCE + "; MoE: plan/moe.py",
            "device": "analytic", "dtype": dtype, "batch": batch, "seq": seq,
            "tflops": tflops, "mfu": mfu, "attention": attention, "hardware_free": free,
            "moe": shape.as_dict(), "params": shape.total_params(),
            "active_params": shape.active_params()}
    if source is not None:
        meta["hf_config"] = source
    return Profile(out, meta)


# ---- HuggingFace config.json ---------------------------------------------------------------
class _Keys:
    """Read keys of one config, remembering what was used; errors name the key."""

    def __init__(self, data: dict, path: str, kind: str):
        self.data, self.path, self.kind = data, path, kind
        self.used: dict = {"model_type": kind}

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, default: int | None = None, lo: int = 1) -> int:
        if not self.has(key):
            if default is None:
                raise UserError(f"{param('hf_config')} {self.path}: missing key {key!r} (needed "
                                 f"for model_type {self.kind})")
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise UserError(f"{param('hf_config')} {self.path}: {key!r} must be an integer >= "
                             f"{lo}, got {v!r}")
        self.used[key] = v
        return v

    def bool(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        v = self.data[key]
        if not isinstance(v, bool):
            raise UserError(f"{param('hf_config')} {self.path}: {key!r} must be true or false, got "
                             f"{v!r}")
        self.used[key] = v
        return v

    def fail(self, message: str) -> UserError:
        return UserError(f"{param('hf_config')} {self.path}: {message}")


CAPACITY_KEYS = ("capacity_factor", "moe_capacity_factor", "expert_capacity_factor")
"""Keys an HF config may name its router's capacity factor by (none of the four types'
released configs has one); recorded in the shape's ``extra`` (plan/expert.py's default
``--moe-imbalance``)."""


def moe_shape_from_hf(data: dict, path: str = "config.json") -> tuple[MoEShape, dict]:
    """:func:`_moe_shape_from_hf`, and a capacity factor (:data:`CAPACITY_KEYS`, a number
    >= 1) when the config names one."""
    shape, used = _moe_shape_from_hf(data, path)
    for key in CAPACITY_KEYS:
        v = data.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1:
            shape.extra["capacity_factor"] = float(v)
            used[key] = v
            break
    return shape, used


def _moe_shape_from_hf(data: dict, path: str = "config.json") -> tuple[MoEShape, dict]:
    """The :class:`MoEShape` of an HF ``config.json`` of ``model_type`` mixtral, qwen2_moe,
    qwen3_moe or deepseek_v3, and ``{key: value}`` of the keys used.

    Keys: all four read ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``vocab_size``, ``num_experts_per_tok``, ``tie_word_embeddings`` (default false).
    ``mixtral``: ``num_local_experts``, ``intermediate_size`` (each expert's),
    ``num_key_value_heads``, ``head_dim``. ``qwen2_moe`` / ``qwen3_moe``: ``num_experts``,
    ``moe_intermediate_size``, ``intermediate_size`` (dense layers), ``decoder_sparse_step``
    (1) and ``mlp_only_layers`` ([]): layer ``i`` is MoE unless listed there or ``(i + 1)``
    is not a multiple of the step; ``num_key_value_heads``, ``head_dim``; qwen2_moe also
    ``shared_expert_intermediate_size`` (its one shared expert, with a sigmoid gate) and Q/K/V
    biases, qwen3_moe per-head Q/K norms. ``deepseek_v3``: ``n_routed_experts``,
    ``n_shared_experts``, ``moe_intermediate_size``, ``intermediate_size`` (dense layers),
    ``first_k_dense_replace``, ``moe_layer_freq`` (1), ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``n_group`` and
    ``topk_group`` (group-limited routing, 0: none); ``num_nextn_predict_layers``
    (the MTP module) is recorded and left out.
    """
    kind = data.get("model_type")
    if kind not in MOE_TYPES:
        raise UserError(f"{param('hf_config')} {path}: model_type {kind!r} is not an MoE type; "
                         f"valid are {', '.join(MOE_TYPES)}")
    g = _Keys(data, path, kind)
    layers, hidden = g.int("num_hidden_layers"), g.int("hidden_size")
    heads, vocab = g.int("num_attention_heads"), g.int("vocab_size")
    experts_key = {"mixtral": "num_local_experts", "deepseek_v3": "n_routed_experts"}.get(
        kind, "num_experts")
    experts = g.int(experts_key)
    top_k = g.int("num_experts_per_tok")
    if top_k > experts:
        raise g.fail(f"'num_experts_per_tok' {top_k} must be at most {experts_key!r} "
                     f"{experts} (valid: 1..{experts})")
    tied = g.bool("tie_word_embeddings", False)
    common = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, experts=experts,
                  top_k=top_k, tied_embeddings=tied)
    if kind == "deepseek_v3":
        fe = g.int("moe_intermediate_size")
        first = g.int("first_k_dense_replace", 0, lo=0)
        freq = g.int("moe_layer_freq", 1)
        if first > layers:
            raise g.fail(f"'first_k_dense_replace' {first} must be at most "
                         f"'num_hidden_layers' {layers}")
        dense = tuple(i for i in range(layers) if i < first or i % freq)
        q_rank = g.int("q_lora_rank", 0, lo=0)
        mla = LatentAttention(q_rank, g.int("kv_lora_rank"), g.int("qk_nope_head_dim"),
                              g.int("qk_rope_head_dim"), g.int("v_head_dim"))
        shared = g.int("n_shared_experts", 0, lo=0)
        groups = g.int("n_group", 0, lo=0)
        group_top = g.int("topk_group", 0, lo=0) if groups else 0
        if groups and (experts % groups or not 1 <= group_top <= groups):
            raise g.fail(f"'n_group' {groups} must divide {experts_key!r} {experts} and "
                         f"'topk_group' {group_top} be in 1..{groups}")
        mtp = g.int("num_nextn_predict_layers", 0, lo=0)
        shape = MoEShape(**common, expert_ffn=fe, shared_experts=shared,
                         shared_ffn=fe if shared else 0, router_bias=True,
                         expert_groups=groups, group_top_k=group_top,
                         dense_layers=dense,
                         dense_ffn=g.int("intermediate_size") if dense else 0, mla=mla,
                         extra={"mtp_layers_excluded": mtp} if mtp else {})
        return shape, g.used
    kv = g.int("num_key_value_heads", heads)
    head_dim = g.int("head_dim", 0, lo=0) or None
    if head_dim is None and hidden % heads:
        raise g.fail(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                     "and there is no head_dim")
    if heads % kv:
        raise g.fail(f"num_key_value_heads {kv} must divide num_attention_heads {heads}")
    attn = dict(kv_heads=kv, head_size=head_dim if head_dim != hidden // heads else None)
    if kind == "mixtral":
        return MoEShape(**common, **attn, expert_ffn=g.int("intermediate_size")), g.used
    fe = g.int("moe_intermediate_size")
    step = g.int("decoder_sparse_step", 1)
    only = data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                         or not 0 <= i < layers for i in only):
        raise g.fail(f"'mlp_only_layers' must be a list of layer indices in 0..{layers - 1}, "
                     f"got {only!r}")
    if only:
        g.used["mlp_only_layers"] = list(only)
    dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    dense_ffn = g.int("intermediate_size") if dense else 0
    if kind == "qwen2_moe":
        fs = g.int("shared_expert_intermediate_size")
        return MoEShape(**common, **attn, expert_ffn=fe, shared_experts=1, shared_ffn=fs,
                        shared_gate=True, dense_layers=dense,
                        dense_ffn=dense_ffn, qkv_bias=True), g.used
    return MoEShape(**common, **attn, expert_ffn=fe, dense_layers=dense, dense_ffn=dense_ffn,
                    qk_norm=True), g.used


def layer_groups(profile: Profile) -> list[tuple[int, int, object]]:
    """Runs of consecutive blocks with the same MoE costs, as ``(first, last, layer)``
    (block numbers, the run's first layer): DeepSeek-V3 is ``(0, 2, dense)``, ``(3, 60,
    MoE)``. What ``profile --analytic`` prints under the table for an MoE model."""
    keys = ("params", "active_params", "router_flops", "expert_flops", "dense_mlp_flops",
            "shared_expert_flops", "attention_flops", "activation_bytes", "all_to_all_bytes")
    out: list[tuple[int, int, object]] = []
    blocks = [layer for layer in profile.layers if "active_params" in layer.extra]
    for n, layer in enumerate(blocks):
        sig = tuple(layer.as_dict().get(k) for k in keys)
        if out and tuple(out[-1][2].as_dict().get(k) for k in keys) == sig:
            out[-1] = (out[-1][0], n, out[-1][2])
        else:
            out.append((n, n, layer))
    return out
