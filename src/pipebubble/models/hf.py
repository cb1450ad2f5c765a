"""HuggingFace decoder-only causal LMs as flat layer lists (``pip install pipebubble[hf]``).

A pipeline cuts a model between layers, and each stage passes one tensor to the next. A
HuggingFace ``LlamaForCausalLM`` is not written that way: its ``LlamaModel.forward`` makes
the position ids, the rotary embeddings (cos, sin) and the causal mask once and hands them
to every decoder layer. This adapter turns the model into

    embedding | decoder layer 0 | ... | decoder layer L-1 | final norm + head

where every decoder layer computes, from the hidden states it receives, what the model's
forward would have given it (positions ``0..T-1``, the rotary embeddings from the model's
own rotary module, the mask from the model's own mask function, sliding-window layers
included). None of these needs a gradient, so the stage graphs hold activations and
weights only, and the flat list computes the model's logits operation for operation (the
tests compare them with the HF model's, exactly in float64).

Model types it knows (:data:`KNOWN_TYPES`): the LLaMA family (``llama``, ``mistral``,
``qwen2``: rotary positions), ``gpt2`` (learned positions), and the mixtures of experts
(:data:`MOE_TYPES`) ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` and ``deepseek_v3``, whose
decoder layers take the same inputs (DeepSeek-V3's multi-head latent attention, its first
dense layers, shared experts and routing bias all live inside its decoder layers, so the
adapter wraps them as it wraps LLaMA's). Layer names are the HF module
names (``model.layers.3``, ``transformer.h.3``); the embedding and the head carry the roles
``embedding`` and ``head``. A head tied to the embedding (``tie_word_embeddings``: GPT-2,
Qwen2-0.5B, Llama-3.2-1B) stays tied: the head's projection is the model's own ``lm_head``,
whose weight *is* the token table. Cut into stages, the runtime gives the head's stage a copy
and sums the two copies' gradients before every optimizer step
(:mod:`pipebubble.runtime.tied`), so the model trains as the tied model it is.

**Mixtures of experts.** Routing is per token and transformers' MoE blocks drop nothing (no
expert capacity), so a token's output does not depend on the other tokens of its microbatch,
and a pipeline's gradients equal the unsplit model's (``run --check --dtype float64``: ~1e-16
relative). Two things are set for float64, where that check runs: the experts run as
transformers' ``eager`` loop (its default ``grouped_mm`` takes no float64), and DeepSeek-V3's
router, which transformers computes in float32 whatever the model's dtype, is computed in the
model's float64 (the same formula, :func:`_wide_router`), so the check is exact rather than
float32-close (~4e-10). Other dtypes run transformers' own paths unchanged.

**The router's auxiliary (load-balancing) loss is refused**: a config with
``output_router_logits: true`` (Mixtral, Qwen-MoE: the model then adds
``router_aux_loss_coef * aux`` to its loss) is one line of error. transformers'
``load_balancing_loss_func`` computes ``aux = E * sum_i f_i P_i`` with ``f_i`` the fraction of
top-k assignments to expert ``i`` and ``P_i`` its mean router probability, both averaged over
every token of the batch *and every layer together*: a product of two whole-batch averages,
not a sum over microbatches or stages, so no pipeline adds it as the unsplit model does (a
microbatch's backward would need every other microbatch's and every stage's routing first).
Set ``output_router_logits`` to false (its default) to train on the next-token loss alone, as
DeepSeek-V3 does (its config's flag adds no loss, so it is accepted).

Nothing is ever downloaded: :func:`load_hf` reads a local ``config.json`` (and, in a folder,
its safetensors weights when present).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ParamError, UserError, param
from ..files import read_json_file
from ..hf_keys import MAX_CONFIG_BYTES, check_hf_config, shape_from_hf
from ..limits import check_params_fit
from .spec import ModelSpec

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_MODEL_ARGS = param("model_args")
_SEQ = param("seq")

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
KNOWN_TYPES = ("gpt2", "llama", "mistral", "qwen2", *MOE_TYPES)
# sliding-window attention on every layer when the config's sliding_window is set (qwen2 and
# qwen2_moe name each layer's kind in layer_types instead)
_WINDOW_TYPES = ("mistral", "mixtral", "qwen3_moe")
# the model types whose forward adds the router's load-balancing loss (module docstring)
_AUX_LOSS_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
_EXPERTS_KEY = {"mixtral": "num_local_experts", "deepseek_v3": "n_routed_experts",
                "qwen2_moe": "num_experts", "qwen3_moe": "num_experts"}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("HuggingFace models need the 'transformers' package: "
                        "pip install 'pipebubble[hf]'") from None
    from ..libwarnings import refresh

    refresh()  # its import adds a stderr handler: its warnings wait for the result instead
    return transformers


def _mask(kind: str, config: Any, h: torch.Tensor, pos: torch.Tensor):
    """The mask the model's forward would build for a layer of ``kind``, by the library's
    own function (its argument names differ between transformers versions)."""
    from transformers import masking_utils as mu

    fn = mu.create_sliding_window_causal_mask if kind == "sliding_attention" else \
        mu.create_causal_mask
    values = {"config": config, "inputs_embeds": h, "input_embeds": h, "attention_mask": None,
              "cache": None, "past_key_values": None, "position_ids": pos,
              "cache_position": pos[0]}
    params = inspect.signature(fn).parameters
    if "cache" in params:  # 5.25 renamed past_key_values to cache, keeping it deprecated
        del values["past_key_values"]
    return fn(**{k: v for k, v in values.items() if k in params})


def _positions(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[1], device=h.device).unsqueeze(0)


class TokenEmbedding(nn.Module):
    """Token ids -> hidden states: the token table (and learned positions, GPT-2 style)."""

    role = "embedding"

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding | None = None,
                 dropout: nn.Module | None = None):
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.dropout = dropout

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(_positions(ids))
        return self.dropout(h) if self.dropout is not None else h


class DecoderLayer(nn.Module):
    """One HF decoder layer fed what the model's forward would pass it: position ids, the
    rotary embeddings (LLaMA family) and the causal mask of the layer's kind."""

    role = "layer"

    def __init__(self, layer: nn.Module, config: Any, kind: str, rotary: nn.Module | None,
                 gpt2: bool):
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.config = config
        self.kind = kind
        self.gpt2 = gpt2

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pos = _positions(h)
        mask = _mask(self.kind, self.config, h, pos)
        if self.gpt2:
            out = self.layer(h, attention_mask=mask, position_ids=pos)
        else:
            out = self.layer(h, attention_mask=mask, position_ids=pos,
                             position_embeddings=self.rotary(h, pos))
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    """Final norm and the projection to the vocabulary (the logits the loss reads)."""

    role = "head"

    def __init__(self, norm: nn.Module, proj: nn.Module):
        super().__init__()
        self.norm = norm
        self.proj = proj

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(h))


def model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", type(model).__name__))


def _float64_paths(model: nn.Module) -> None:
    """A float64 MoE model computes in float64 throughout (module docstring): transformers'
    eager experts (``grouped_mm`` takes no float64) and DeepSeek-V3's router in float64. Other
    dtypes are left as transformers runs them."""
    if not any(p.dtype == torch.float64 for p in model.parameters()):
        return
    config = model.config
    if getattr(config, "_experts_implementation", None) not in (None, "eager"):
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        else:
            config._experts_implementation = "eager"
    for module in model.modules():
        if type(module).__name__ == "DeepseekV3TopkRouter" and all(
                hasattr(module, a) for a in _ROUTER_FIELDS):
            module.__class__ = _wide_router(type(module))


_ROUTER_FIELDS = ("weight", "e_score_correction_bias", "num_group", "topk_group", "top_k",
                  "num_experts", "hidden_dim", "norm_topk_prob", "routed_scaling_factor")
_WIDE: dict[type, type] = {}


def _wide_router(cls: type) -> type:
    """transformers' DeepSeek-V3 router (``DeepseekV3TopkRouter``, transformers 5) computing
    in its weight's dtype: the same formula without its casts to float32.

    Scores ``s = sigmoid(x W^T)``; experts chosen by ``s + bias`` (the routing bias, a buffer
    the load balancer moves, no gradient), first the ``topk_group`` best of ``n_group`` groups
    (a group's score: its two best), then the ``top_k`` best experts in those groups; the
    weights are the chosen ``s``, normalised to sum to 1 when ``norm_topk_prob``, times
    ``routed_scaling_factor``. Its parameters and buffer keep their names and shapes (the
    class changes, not the state), so checkpoints and ``export-hf`` are unaffected."""
    if cls in _WIDE:
        return _WIDE[cls]

    def forward(self, hidden_states: torch.Tensor):
        x = hidden_states.view(-1, self.hidden_dim)
        logits = nn.functional.linear(x.to(self.weight.dtype), self.weight)
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias.to(scores.dtype)
        per_group = self.num_experts // self.num_group
        group_scores = choice.view(-1, self.num_group, per_group).topk(2, dim=-1)[0].sum(-1)
        groups = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)
        keep = group_mask.unsqueeze(-1).expand(-1, self.num_group, per_group).reshape(
            -1, self.num_experts)
        choice = choice.masked_fill(~keep.bool(), float("-inf"))
        indices = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, weights * self.routed_scaling_factor, indices

    _WIDE[cls] = type(cls.__name__, (cls,), {"forward": forward, "__module__": __name__,
                                             "__doc__": _wide_router.__doc__})
    return _WIDE[cls]


def hf_layers(model: nn.Module) -> tuple[list[nn.Module], list[str], list[str]]:
    """(layers, names, roles) of a HuggingFace causal LM; see the module docstring."""
    kind = model_type(model)
    if kind not in KNOWN_TYPES:
        raise UserError(f"HuggingFace model type {kind!r} is not one the adapter knows; known "
                        f"are {', '.join(KNOWN_TYPES)} (decoder-only causal LMs)")
    config = model.config
    if kind in MOE_TYPES:
        _float64_paths(model)
    head = model.lm_head  # tied to the token table when the config says so
    if kind == "gpt2":
        base = model.transformer
        emb = TokenEmbedding(base.wte, base.wpe, base.drop)
        blocks = [DecoderLayer(b, config, "full_attention", None, True) for b in base.h]
        names = ["transformer.wte+transformer.wpe",
                 *[f"transformer.h.{i}" for i in range(len(blocks))], "transformer.ln_f+lm_head"]
        norm = base.ln_f
    else:
        base = model.model
        emb = TokenEmbedding(base.embed_tokens)
        types = getattr(config, "layer_types", None)
        sliding = getattr(config, "sliding_window", None) is not None and \
            kind in _WINDOW_TYPES
        blocks = []
        for i, layer in enumerate(base.layers[: config.num_hidden_layers]):
            lk = types[i] if types else ("sliding_attention" if sliding else "full_attention")
            blocks.append(DecoderLayer(layer, config, lk, base.rotary_emb, False))
        names = ["model.embed_tokens", *[f"model.layers.{i}" for i in range(len(blocks))],
                 "model.norm+lm_head"]
        norm = base.norm
    layers: list[nn.Module] = [emb, *blocks, Head(norm, head)]
    roles = ["embedding", *(["layer"] * len(blocks)), "head"]
    return layers, names, roles


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, the mean over every position of the batch."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def hf_spec(model: nn.Module, seq: int = 32, name: str | None = None) -> ModelSpec:
    """A ModelSpec for a HuggingFace causal LM: random token ids of ``seq`` tokens per
    sample, the next-token loss."""
    layers, names, roles = hf_layers(model)
    config = model.config
    vocab = int(config.vocab_size)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                         None)
    if not isinstance(seq, int) or seq < 1 or (limit and seq > limit):
        raise ParamError(f"{_SEQ} must be an integer in 1..{limit or 'inf'} for this model, "
                         f"got {seq!r}")

    def make_batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, vocab, (n, seq + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    kind = model_type(model)
    desc = (f"{name or kind}: {kind}, embedding | {len(layers) - 2} decoder layers | norm + "
            f"head; hidden {config.hidden_size}, vocab {vocab}, seq {seq}, next-token loss")
    return ModelSpec(name or kind, layers, make_batch, lm_loss, names, roles, desc)


def read_config(path: str | Path) -> tuple[dict, Path | None]:
    """The config dictionary at ``path`` (a JSON file, or a folder holding ``config.json``)
    and the folder to load weights from (None for a file).

    The file is read by :func:`pipebubble.files.read_json_file` (a FIFO or a device is
    refused, the size and the JSON's depth and integers are bounded) and every key is
    checked by :func:`pipebubble.hf_keys.check_hf_config`; errors name ``hf:PATH``.
    """
    p = Path(path)
    if p.is_dir():
        folder, p = p, p / "config.json"
        if not p.exists():
            raise UserError(f"hf:{path}: the folder has no config.json")
    elif os.path.lexists(p):
        folder = None
    else:
        raise UserError(f"hf:{path}: no such file or folder (give a config.json or a folder "
                        "holding one; nothing is downloaded)")
    data = read_json_file(p, f"hf:{path}", limit=MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise UserError(f"hf:{path}: {p.name} must hold a JSON object, got "
                        f"{type(data).__name__}")
    kind = data.get("model_type")
    if kind not in KNOWN_TYPES:
        raise UserError(f"hf:{path}: model type {_short(kind)} is not one the adapter knows; "
                        f"known are {', '.join(KNOWN_TYPES)} (decoder-only causal LMs)")
    return check_hf_config(data, f"hf:{path}"), folder


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_build(data: dict, where: str) -> int:
    """Refuse, before anything is allocated, a config whose sizes are out of range (every
    key: :func:`~pipebubble.hf_keys.check_hf_config`), whose required size keys are
    missing, whose expert keys disagree (:func:`check_moe`), or whose model would not fit the
    free memory (its parameter count from the shape, :func:`pipebubble.limits.check_params_fit`);
    return the parameter count. An MoE config is counted from every key its model reads
    (:func:`load_hf` passes the config with transformers' defaults filled in)."""
    data = check_hf_config(data, where)
    if data.get("model_type") in MOE_TYPES:
        params = check_moe(data, where)
    else:
        shape, _ = shape_from_hf(data, where=where)
        params = shape.total_params()
    check_params_fit(params, where)
    return params


def check_moe(data: dict, where: str) -> int:
    """Check an MoE config's expert keys and count the tensors its model stores (parameters,
    and DeepSeek-V3's routing bias). Refused, in one line naming the key: a missing or
    non-positive size, top-k (``num_experts_per_tok``) above the experts, the load-balancing
    loss (module docstring), and for DeepSeek-V3 expert groups that do not split the experts
    or the top-k, or key/value heads other than the heads (latent attention expands its keys
    and values to every head).

    Per layer, as transformers builds it: two RMSNorms; attention (Q, K, V, O; Qwen2-MoE's
    Q/K/V biases, Qwen3-MoE's Q/K norms; DeepSeek-V3's latent Q and KV projections and their
    norms); then either a dense SwiGLU MLP (``3 h f``) or the router (``E h``), ``E`` experts
    of ``3 h f_e`` and the shared experts (Qwen2-MoE's with its ``h x 1`` gate)."""
    kind = data["model_type"]

    def key(name: str, lo: int = 1, default: int | None = None) -> int:
        value = data.get(name)
        if value is None:
            if default is not None:
                return default
            raise UserError(f"{where}: missing key {name!r} (needed for model_type {kind})")
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise UserError(f"{where}: {name!r} must be an integer >= {lo}, got "
                            f"{_short(value)}")
        return value

    experts_key = _EXPERTS_KEY[kind]
    if data.get(experts_key) is None and data.get("num_local_experts") is not None:
        experts_key = "num_local_experts"  # qwen3_moe's own name in transformers 5
    h, vocab, layers = key("hidden_size"), key("vocab_size"), key("num_hidden_layers")
    heads, experts, top_k = key("num_attention_heads"), key(experts_key), \
        key("num_experts_per_tok")
    if top_k > experts:
        raise UserError(f"{where}: 'num_experts_per_tok' {top_k} must be at most "
                        f"{experts_key!r} {experts} (valid: 1..{experts})")
    if kind in _AUX_LOSS_TYPES and data.get("output_router_logits") is True:
        raise ParamError(f"{where}: 'output_router_logits' true adds the router's load-balancing "
                        "loss, a product of averages over the whole batch and every layer "
                        "(not a sum over microbatches or stages), which no pipeline adds as the "
                        f"unsplit model does; set it to false ({_MODEL_ARGS} "
                        "output_router_logits=false)")
    kv = key("num_key_value_heads", default=heads)
    dense_ffn = key("intermediate_size")
    total = vocab * h * (1 if data.get("tie_word_embeddings") else 2) + h + 2 * h * layers
    if kind == "deepseek_v3":
        groups, chosen = key("n_group", default=8), key("topk_group", default=4)
        if experts % groups or experts // groups < 2:
            raise UserError(f"{where}: 'n_group' {groups} must divide 'n_routed_experts' "
                            f"{experts} into groups of at least 2 experts (a group's score is "
                            f"its two best); valid: a divisor of {experts} up to {experts // 2}")
        if chosen > groups:
            raise UserError(f"{where}: 'topk_group' {chosen} must be in 1..{groups} "
                            f"('n_group')")
        if top_k > chosen * (experts // groups):
            raise UserError(f"{where}: 'num_experts_per_tok' {top_k} must be at most "
                            f"{chosen * (experts // groups)} (the experts of 'topk_group' "
                            f"{chosen} groups of {experts // groups})")
        if kv != heads:
            raise UserError(f"{where}: 'num_key_value_heads' {kv} must equal "
                            f"'num_attention_heads' {heads} (latent attention expands "
                            "its keys and values to every head)")
        bias = bool(data.get("attention_bias"))
        q_rank = data.get("q_lora_rank")
        kv_rank, rope = key("kv_lora_rank"), key("qk_rope_head_dim")
        nope, v = key("qk_nope_head_dim"), key("v_head_dim")
        qk = heads * (nope + rope)
        if q_rank is None:
            q = h * qk
        else:
            q_rank = key("q_lora_rank")
            q = h * q_rank + bias * q_rank + q_rank + q_rank * qk
        attention = (q + (h + bias) * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
                     + heads * v * h + bias * h)
        fe, shared = key("moe_intermediate_size"), key("n_shared_experts", lo=0, default=0)
        first = key("first_k_dense_replace", lo=0, default=0)
        moe_layer = experts * h + experts + 3 * experts * fe * h + 3 * h * fe * shared
        for i in range(layers):
            total += attention + (3 * h * dense_ffn if i < first else moe_layer)
        return total
    if heads % kv:
        raise UserError(f"{where}: 'num_key_value_heads' {kv} must divide "
                        f"'num_attention_heads' {heads}")
    if data.get("head_dim") is None and h % heads:
        raise UserError(f"{where}: 'hidden_size' {h} is not a multiple of "
                        f"'num_attention_heads' {heads} and there is no 'head_dim'")
    hd = key("head_dim", default=h // heads)
    q_out, kv_out = heads * hd, kv * hd
    attention = 2 * h * q_out + 2 * h * kv_out
    if kind == "qwen2_moe" and data.get("qkv_bias", True):
        attention += q_out + 2 * kv_out
    if kind == "qwen3_moe":
        attention += 2 * hd + (q_out + 2 * kv_out + h if data.get("attention_bias") else 0)
    if kind == "mixtral":
        return total + layers * (attention + experts * h + 3 * experts * dense_ffn * h)
    fe, step = key("moe_intermediate_size"), key("decoder_sparse_step", default=1)
    only = data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                         for i in only):
        raise UserError(f"{where}: 'mlp_only_layers' must be a list of layer indices in "
                        f"0..{layers - 1}, got {_short(only)}")
    moe_layer = experts * h + 3 * experts * fe * h
    if kind == "qwen2_moe":
        moe_layer += 3 * h * key("shared_expert_intermediate_size") + h
    for i in range(layers):
        sparse = i not in only and (i + 1) % step == 0
        total += attention + (moe_layer if sparse else 3 * h * dense_ffn)
    return total


def _int_key(data: dict, key: str, default: int, where: str) -> int:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: {key!r} must be an integer >= 1, got {_short(value)}")
    return value


def _check_names(data: dict, where: str) -> None:
    """The activation and the rotary embedding's kind are names transformers knows (else
    a bare KeyError comes out of the model's constructor)."""
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for key in ("hidden_act", "activation_function"):
        if key in data and data[key] not in ACT2FN:
            raise UserError(f"{where}: {key!r} {_short(data[key])} is not an activation "
                            f"transformers knows; valid are {', '.join(sorted(ACT2FN))}")
    kinds = ("default", *ROPE_INIT_FUNCTIONS)
    for key in ("rope_parameters", "rope_scaling"):
        rope = data.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise UserError(f"{where}: {key!r} must be an object (e.g. {{\"rope_type\": "
                            f"\"default\"}}) or null, got {_short(rope)}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in kinds:
            raise UserError(f"{where}: {key}.rope_type {_short(kind)} is not one transformers "
                            f"knows; valid are {', '.join(kinds)}")


def load_hf(path: str | Path, seq: int = 32, seed: int = 0,
            overrides: dict[str, Any] | None = None) -> ModelSpec:
    """``hf:PATH``: a causal LM from a local config (weights loaded from the folder's
    ``*.safetensors`` when present, else initialised from ``seed``); never downloads.
    ``overrides`` replace config fields (``{"num_hidden_layers": 8}``).

    Every check comes before the model is built (:func:`read_config`, :func:`check_build`),
    and an error transformers raises for a config that passed them (a TypeError,
    KeyError, ZeroDivisionError, AssertionError, its own validation errors) is one
    :class:`UserError` naming the config and the library's first line."""
    model, weights = build_hf_model(path, seed, overrides)
    spec = hf_spec(model, seq, name=f"hf:{path}")
    spec.metadata = {"hf_weights": [w.name for w in weights] or "random (seed "
                     f"{seed})",
                     # the config as built (--model-arg included): run --save records it,
                     # export-hf rebuilds the model from it
                     "hf_config": json.loads(model.config.to_json_string(use_diff=True))}
    kind = model_type(model)
    if kind in MOE_TYPES:  # run --ep names the key (runtime/setup.py)
        key = _EXPERTS_KEY[kind]
        spec.metadata["moe_experts"] = {"key": key, "count": int(getattr(model.config, key))}
    return spec


def build_hf_model(path: str | Path, seed: int = 0, overrides: dict[str, Any] | None = None
                   ) -> tuple[nn.Module, list[Path]]:
    """(the transformers model, the weight files it loaded) of :func:`load_hf`, checked the
    same way, in the default dtype."""
    where = f"hf:{path}"
    data, folder = read_config(path)
    overrides = dict(overrides or {})
    if "model_type" in overrides:
        raise ParamError(f"{_MODEL_ARGS} model_type: the model type is the config's own "
                         f"({data['model_type']}); give another config instead")
    # the file's values and --model-arg's, checked together (floats made floats)
    merged = check_hf_config({**data, **overrides}, f"{where} with {_MODEL_ARGS}"
                             if overrides else where)
    if merged["model_type"] not in MOE_TYPES:
        check_build(merged, f"{where} with {_MODEL_ARGS}" if overrides else where)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tf = _transformers()
    _check_names(merged, where)
    skip = ("model_type", "architectures", "transformers_version")
    fields = {k: v for k, v in data.items() if k not in skip}
    try:
        config = tf.AutoConfig.for_model(data["model_type"], **fields)
        for key in overrides:
            if key not in data and not hasattr(config, key):
                known = sorted(k for k in config.to_dict() if not k.startswith("_"))
                raise ParamError(f"{_MODEL_ARGS} {key}: not a field of the {data['model_type']} "
                                 f"config; valid are {', '.join(known)}")
        if overrides:
            config = tf.AutoConfig.for_model(data["model_type"], **{
                k: v for k, v in merged.items() if k not in skip})
    except UserError:
        raise
    except Exception as exc:  # transformers' own validation of a config: the user's input
        raise UserError(f"{where}: transformers refuses the config ({_first_line(exc)})") \
            from None
    if merged["model_type"] in MOE_TYPES:  # counted with transformers' defaults filled in
        named = f"{where} with --model-arg" if overrides else where
        check_params_fit(check_moe({**config.to_dict(), **merged}, named), named)
    weights = sorted(folder.glob("*.safetensors")) if folder is not None else []
    torch.manual_seed(seed)
    try:
        if weights:
            model = tf.AutoModelForCausalLM.from_pretrained(str(folder), config=config,
                                                            local_files_only=True)
        else:
            model = tf.AutoModelForCausalLM.from_config(config)
    except UserError:
        raise
    except Exception as exc:  # an error of the config's values while building the layers
        raise UserError(f"{where}: cannot build the model ({_first_line(exc)})") from None
    model = model.to(torch.get_default_dtype())  # float32, or float64 under --dtype float64
    return model, weights


def _first_line(exc: BaseException) -> str:
    """``Type: first line`` of an exception's message, at most 200 characters."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "Validation error for field 'x':"
        lines[0] = f"{lines[0]} {lines[1]}"
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
