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

from ..errors import UserError
from ..files import read_json_file
from ..models.hfconfig import (  # noqa: F401 - the checker's names, as before
    GPT2_LIKE,
    LLAMA_LIKE,
    MAX_CONFIG_BYTES,
    MAX_HF_LAYERS,
    MOE_TYPES,
    SUPPORTED,
    check_hf_config,
    positions_of,
)
from ..models.hfconfig import shape_from_hf as dense_shape_from_hf
from ..models.shape import TransformerShape
from .moe import MoEShape, moe_shape_from_hf


def read_hf_config(path: str, what: str = "--hf-config"
                   ) -> tuple[TransformerShape | MoEShape, dict]:
    """The shape and ``{key: value}`` of what was used, from a ``config.json`` file (read
    with every check of :func:`pipebubble.files.read_json_file`)."""
    data = read_json_file(path, what, limit=MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise UserError(f"{what} {path!r} must hold a JSON object, got "
                         f"{type(data).__name__}")
    return shape_from_hf(data, path, where=f"{what} {path}")


def shape_from_hf(data: dict, path: str = "config.json", where: str | None = None
                  ) -> tuple[TransformerShape | MoEShape, dict]:
    """The shape of a config dictionary and the keys it read, every key checked first
    (:func:`~pipebubble.models.hfconfig.check_hf_config`): a dense decoder's
    :class:`TransformerShape`, or for mixtral, qwen2_moe, qwen3_moe and deepseek_v3 an
    :class:`~pipebubble.plan.moe.MoEShape`."""
    where = where if where is not None else f"--hf-config {path}"
    if data.get("model_type") in MOE_TYPES:
        return moe_shape_from_hf(check_hf_config(data, where), path)
    return dense_shape_from_hf(data, path, where)
