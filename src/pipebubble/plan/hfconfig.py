"""A HuggingFace ``config.json`` as the shape the analytic profile reads.

Dense decoders (``llama``, ``mistral``, ``qwen2``, ``gpt2``) are read as
:mod:`pipebubble.hf_keys` reads them (every key it uses and every check are listed
there: the HF adapter ``--model hf:PATH`` shares them); the mixture-of-experts types
(``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek_v3``) are checked the same way, then
shaped by :mod:`pipebubble.plan.moe`.

>>> shape, used = shape_from_hf({"model_type": "llama", "num_hidden_layers": 32,
...     "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
...     "num_key_value_heads": 8, "vocab_size": 128256})
>>> shape.total_params()   # Llama-3-8B
8030261248
"""

from __future__ import annotations

from ..errors import UserError, param
from ..files import read_json_file
from ..hf_keys import (  # noqa: F401 - the checker's names, as before
    GPT2_LIKE,
    LLAMA_LIKE,
    MAX_CONFIG_BYTES,
    MAX_HF_LAYERS,
    MOE_TYPES,
    SUPPORTED,
    check_hf_config,
    positions_of,
)
from ..hf_keys import shape_from_hf as dense_shape_from_hf
from ..transformer_shape import TransformerShape
from .moe import MoEShape, moe_shape_from_hf


def read_hf_config(path: str, what: str = param("hf_config")
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
    (:func:`~pipebubble.hf_keys.check_hf_config`): a dense decoder's
    :class:`TransformerShape`, or for mixtral, qwen2_moe, qwen3_moe and deepseek_v3 an
    :class:`~pipebubble.plan.moe.MoEShape`."""
    where = where if where is not None else f"{param('hf_config')} {path}"
    if data.get("model_type") in MOE_TYPES:
        shape, used = moe_shape_from_hf(check_hf_config(data, where), path)
        if data.get("max_position_embeddings") is not None:  # --seq is checked against it
            used["max_position_embeddings"] = data["max_position_embeddings"]
        return shape, used
    return dense_shape_from_hf(data, path, where)
