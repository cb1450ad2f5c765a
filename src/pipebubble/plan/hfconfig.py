"""A HuggingFace ``config.json`` as a :class:`~pipebubble.plan.analytic.TransformerShape`.

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

>>> shape, used = shape_from_hf({"model_type": "llama", "num_hidden_layers": 32,
...     "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
...     "num_key_value_heads": 8, "vocab_size": 128256})
>>> shape.total_params()   # Llama-3-8B
8030261248
"""

from __future__ import annotations

import json

from ..errors import UserError
from .analytic import TransformerShape
from .moe import MOE_TYPES, MoEShape, moe_shape_from_hf

LLAMA_LIKE = ("llama", "mistral", "qwen2")
GPT2_LIKE = ("gpt2",)
SUPPORTED = LLAMA_LIKE + GPT2_LIKE + MOE_TYPES  # MoE: pipebubble.plan.moe


def read_hf_config(path: str) -> tuple[TransformerShape | MoEShape, dict]:
    """The shape and ``{key: value}`` of what was used, from a ``config.json`` file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise UserError(f"--hf-config {path!r}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--hf-config {path!r} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--hf-config {path!r} must hold a JSON object, got "
                         f"{type(data).__name__}")
    return shape_from_hf(data, path)


def shape_from_hf(data: dict, path: str = "config.json"
                  ) -> tuple[TransformerShape | MoEShape, dict]:
    kind = data.get("model_type")
    if kind in MOE_TYPES:  # mixtral, qwen2_moe, qwen3_moe, deepseek_v3: an MoEShape
        return moe_shape_from_hf(data, path)
    if kind not in SUPPORTED:
        raise UserError(f"--hf-config {path}: model_type {kind!r} is not supported; valid are "
                         f"{', '.join(SUPPORTED)}")
    used: dict = {"model_type": kind}

    def get(key: str, default=None, kind_=int):
        if key not in data or data[key] is None:
            if default is None:
                raise UserError(f"--hf-config {path}: missing key {key!r} (needed for "
                                 f"model_type {kind})")
            return default
        v = data[key]
        if kind_ is bool:
            if not isinstance(v, bool):
                raise UserError(f"--hf-config {path}: {key!r} must be true or false, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"--hf-config {path}: {key!r} must be an integer >= 1, got {v!r}")
        used[key] = v
        return v

    if kind in LLAMA_LIKE:
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        kv = get("num_key_value_heads", heads)
        head_dim = get("head_dim", 0) or None if "head_dim" in data else None
        if head_dim is None and hidden % heads:
            raise UserError(f"--hf-config {path}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {heads} and there is no head_dim")
        if heads % kv:
            raise UserError(f"--hf-config {path}: num_key_value_heads {kv} must divide "
                             f"num_attention_heads {heads}")
        shape = TransformerShape(
            layers=get("num_hidden_layers"), hidden=hidden, ffn=get("intermediate_size"),
            heads=heads, vocab=get("vocab_size"), kv_heads=kv,
            tied_embeddings=get("tie_word_embeddings", False, bool), swiglu=True,
            head_size=head_dim if head_dim and head_dim != hidden // heads else None)
        return shape, used
    hidden, heads = get("n_embd"), get("n_head")
    if hidden % heads:
        raise UserError(f"--hf-config {path}: n_embd {hidden} is not a multiple of n_head "
                         f"{heads}")
    shape = TransformerShape(
        layers=get("n_layer"), hidden=hidden, ffn=get("n_inner", 4 * hidden), heads=heads,
        vocab=get("vocab_size"), tied_embeddings=get("tie_word_embeddings", True, bool),
        swiglu=False, positions=get("n_positions"), dropout=True, biases=True)
    return shape, used
