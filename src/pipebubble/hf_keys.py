"""A HuggingFace ``config.json`` checked key by key, and a dense decoder's
:class:`~pipebubble.transformer_shape.TransformerShape` (the HF adapter and the analytic
profile both read it; :mod:`pipebubble.plan.hfconfig` adds the MoE types and reads the file).

Read without transformers (the file is plain JSON). Supported ``model_type`` values and the
keys read from each:

- ``llama``, ``mistral``, ``qwen2`` (SwiGLU MLP, RMSNorm, rotary positions, grouped-query
  attention): ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads`` (default: the heads), ``vocab_size``,
  ``tie_word_embeddings`` (default false), ``head_dim`` (default hidden / heads);
- ``gpt2`` (GPT-2 and Megatron-GPT checkpoints converted to it: learned positions, 4h GELU
  MLP, LayerNorm and biases, dropout): ``n_layer``, ``n_embd``, ``n_inner`` (default
  ``4 n_embd``), ``n_head``, ``vocab_size``, ``n_positions``, ``tie_word_embeddings``
  (default true).

Anything else is rejected with the list of what is supported; a missing key, or one that is
not a positive integer, is rejected by name. :func:`read_hf_config` also returns the keys it
used, so the profile can say where each number came from.

The file is read by :func:`pipebubble.files.read_json_file` (a FIFO, ``/dev/zero``, deep
nesting or a 5,000-digit integer is one line of error), and :func:`check_hf_config` checks
every key this module or the model builder (:mod:`pipebubble.models.hf`, ``hf:PATH``) reads
before anything is computed or allocated: each size is an integer within its
:mod:`pipebubble.limits` bound (``MAX_HF_*``; 10^7 layers or a vocabulary of 10^12 are
refused at once), positions and a sliding window are >= 1 (a window may be null), the
heads divide the hidden size (unless ``head_dim`` is given) and the key/value heads divide
the heads, epsilons are in (0, 1], dropouts in [0, 1], flags are true or false. Every error
is one line naming the key, the value and what is valid.

>>> shape, used = shape_from_hf({"model_type": "llama", "num_hidden_layers": 32,
...     "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
...     "num_key_value_heads": 8, "vocab_size": 128256})
>>> shape.total_params()   # Llama-3-8B
8030261248
"""

from __future__ import annotations

import math
from typing import Any

from .errors import UserError, param
from .limits import (
    MAX_HF_FFN,
    MAX_HF_HEADS,
    MAX_HF_HIDDEN,
    MAX_HF_POSITIONS,
    MAX_HF_VOCAB,
    MAX_LAYERS,
)
from .transformer_shape import TransformerShape

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_HF_CONFIG = param("hf_config")

LLAMA_LIKE = ("llama", "mistral", "qwen2")
GPT2_LIKE = ("gpt2",)
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")  # shapes: pipebubble.plan.moe
SUPPORTED = LLAMA_LIKE + GPT2_LIKE + MOE_TYPES

MAX_CONFIG_BYTES = 4 * 2**20
"""Largest config.json read: a decoder's config is a few KiB."""

MAX_HF_LAYERS = MAX_LAYERS - 2
"""Decoder layers of a config: a profile also holds the embedding and the head."""

MAX_HF_EXPERTS = 1 << 16
"""Routed (or shared) experts of an MoE config: DeepSeek-V3 has 256, Kimi K2 384."""

_LLAMA_INTS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, MAX_HF_LAYERS), "hidden_size": (1, MAX_HF_HIDDEN),
    "intermediate_size": (1, MAX_HF_FFN), "num_attention_heads": (1, MAX_HF_HEADS),
    "num_key_value_heads": (1, MAX_HF_HEADS), "head_dim": (1, MAX_HF_HIDDEN),
    "vocab_size": (1, MAX_HF_VOCAB), "max_position_embeddings": (1, MAX_HF_POSITIONS),
    "sliding_window": (1, MAX_HF_POSITIONS), "max_window_layers": (0, MAX_HF_LAYERS),
    # the MoE families' (pipebubble.plan.moe reads them): widths and expert counts
    "moe_intermediate_size": (1, MAX_HF_FFN), "shared_expert_intermediate_size": (1, MAX_HF_FFN),
    "num_local_experts": (1, MAX_HF_EXPERTS), "num_experts": (1, MAX_HF_EXPERTS),
    "n_routed_experts": (1, MAX_HF_EXPERTS), "num_experts_per_tok": (1, MAX_HF_EXPERTS),
    "n_shared_experts": (0, MAX_HF_EXPERTS), "q_lora_rank": (0, MAX_HF_HIDDEN),
    "kv_lora_rank": (1, MAX_HF_HIDDEN), "qk_nope_head_dim": (1, MAX_HF_HIDDEN),
    "qk_rope_head_dim": (1, MAX_HF_HIDDEN), "v_head_dim": (1, MAX_HF_HIDDEN)}
_GPT2_INTS: dict[str, tuple[int, int]] = {
    "n_layer": (1, MAX_HF_LAYERS), "n_embd": (1, MAX_HF_HIDDEN), "n_inner": (1, MAX_HF_FFN),
    "n_head": (1, MAX_HF_HEADS), "vocab_size": (1, MAX_HF_VOCAB),
    "n_positions": (1, MAX_HF_POSITIONS)}
_FLOATS: dict[str, tuple[float, float, bool]] = {  # key: lo, hi, lo allowed
    "rms_norm_eps": (0.0, 1.0, False), "layer_norm_epsilon": (0.0, 1.0, False),
    "rope_theta": (0.0, 1e30, False), "initializer_range": (0.0, 1.0, True),
    "attention_dropout": (0.0, 1.0, True), "resid_pdrop": (0.0, 1.0, True),
    "embd_pdrop": (0.0, 1.0, True), "attn_pdrop": (0.0, 1.0, True),
    "summary_first_dropout": (0.0, 1.0, True)}
_BOOLS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias",
          "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
          "use_cache")
_TEXTS = ("hidden_act", "activation_function")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_hf_config(data: dict, where: str = f"{_HF_CONFIG} config.json") -> dict:
    """Range-check every key of a HuggingFace config this project reads, before any of it
    is used; return a copy with the float keys as floats (``"rms_norm_eps": 0`` is 0.0).

    Missing or null keys are left for :func:`shape_from_hf` (which knows the required
    ones) or the builder's defaults. ``where`` starts every message (``hf:PATH``).

    >>> check_hf_config({"model_type": "llama", "num_hidden_layers": -1})
    Traceback (most recent call last):
    ...
    pipebubble.errors.UserError: hf_config config.json: 'num_hidden_layers' must be an \
integer in 1..99,998, got -1
    """
    kind = data.get("model_type")
    if kind not in SUPPORTED:
        raise UserError(f"{where}: model_type {_shown(kind)} is not supported; valid are "
                         f"{', '.join(SUPPORTED)}")
    out = dict(data)
    for key, (lo, hi) in (_GPT2_INTS if kind in GPT2_LIKE else _LLAMA_INTS).items():
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            shown = (f"a {len(str(abs(value)))}-digit number" if isinstance(value, int)
                     and not isinstance(value, bool) and abs(value) >= 10**15
                     else _shown(value))
            raise UserError(f"{where}: {key!r} must be an integer in {lo}..{hi:,}, got "
                             f"{shown}" + ("" if key != "sliding_window" else " (or null: "
                                           "no sliding window)"))
    for key, (lo, hi, closed) in _FLOATS.items():
        value = data.get(key)
        if value is None:
            continue
        ok = not isinstance(value, bool) and isinstance(value, int | float) and \
            math.isfinite(value) and (lo <= value if closed else lo < value) and value <= hi
        if not ok:
            low = f"[{lo:g}" if closed else f"({lo:g}"
            raise UserError(f"{where}: {key!r} must be a number in {low}, {hi:g}], got "
                             f"{_shown(value)}")
        out[key] = float(value)
    for key in _BOOLS:
        if key in data and data[key] is not None and not isinstance(data[key], bool):
            raise UserError(f"{where}: {key!r} must be true or false, got {_shown(data[key])}")
    for key in _TEXTS:
        if key in data and (not isinstance(data[key], str) or not data[key]):
            raise UserError(f"{where}: {key!r} must be the name of an activation (e.g. "
                             f"silu, gelu_new), got {_shown(data[key])}")
    vocab = data.get("vocab_size")
    pad = data.get("pad_token_id")
    if pad is not None and isinstance(vocab, int) and (
            isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < vocab):
        raise UserError(f"{where}: 'pad_token_id' must be null or a token id in "
                         f"0..{vocab - 1:,} (vocab_size {vocab:,}), got {_shown(pad)}")
    return out


def shape_from_hf(data: dict, path: str = "config.json",
                  where: str | None = None) -> tuple[TransformerShape, dict]:
    """The :class:`TransformerShape` of a config dictionary and the keys it read, every key
    checked first (:func:`check_hf_config`). ``where`` starts every message (default
    ``--hf-config PATH``)."""
    where = where if where is not None else f"{_HF_CONFIG} {path}"
    data = check_hf_config(data, where)
    kind = data["model_type"]
    if kind in MOE_TYPES:  # a mixture of experts: pipebubble.plan.hfconfig.shape_from_hf
        raise UserError(f"{where}: model_type {kind!r} is a mixture of experts; its shape "
                         f"is read by pipebubble.plan.hfconfig")
    used: dict = {"model_type": kind}

    def get(key: str, default=None, kind_=int):
        if key not in data or data[key] is None:
            if default is None:
                raise UserError(f"{where}: missing key {key!r} (needed for model_type "
                                 f"{kind})")
            return default
        v = data[key]
        if kind_ is bool:
            if not isinstance(v, bool):
                raise UserError(f"{where}: {key!r} must be true or false, got {_shown(v)}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{where}: {key!r} must be an integer >= 1, got {_shown(v)}")
        used[key] = v
        return v

    if kind in LLAMA_LIKE:
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        kv = get("num_key_value_heads", heads)
        head_dim = get("head_dim", 0) or None if "head_dim" in data else None
        if head_dim is None and hidden % heads:
            raise UserError(f"{where}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {heads} and there is no head_dim")
        if heads % kv:
            raise UserError(f"{where}: num_key_value_heads {kv} must divide "
                             f"num_attention_heads {heads}")
        if data.get("max_position_embeddings") is not None:
            used["max_position_embeddings"] = data["max_position_embeddings"]
        shape = TransformerShape(
            layers=get("num_hidden_layers"), hidden=hidden, ffn=get("intermediate_size"),
            heads=heads, vocab=get("vocab_size"), kv_heads=kv,
            tied_embeddings=get("tie_word_embeddings", False, bool), swiglu=True,
            head_size=head_dim if head_dim and head_dim != hidden // heads else None)
        return shape, used
    hidden, heads = get("n_embd"), get("n_head")
    if hidden % heads:
        raise UserError(f"{where}: n_embd {hidden} is not a multiple of n_head {heads}")
    shape = TransformerShape(
        layers=get("n_layer"), hidden=hidden, ffn=get("n_inner", 4 * hidden), heads=heads,
        vocab=get("vocab_size"), tied_embeddings=get("tie_word_embeddings", True, bool),
        swiglu=False, positions=get("n_positions"), dropout=True, biases=True)
    return shape, used


def positions_of(used: dict) -> int | None:
    """The longest sequence the config's model takes (``max_position_embeddings`` or
    ``n_positions``), or None when the config does not say."""
    return used.get("max_position_embeddings") or used.get("n_positions")
