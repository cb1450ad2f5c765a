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
``qwen2``: rotary positions) and ``gpt2`` (learned positions). Layer names are the HF module
names (``model.layers.3``, ``transformer.h.3``); the embedding and the head carry the roles
``embedding`` and ``head``. A head tied to the embedding (``tie_word_embeddings``: GPT-2,
Qwen2-0.5B, Llama-3.2-1B) stays tied: the head's projection is the model's own ``lm_head``,
whose weight *is* the token table. Cut into stages, the runtime gives the head's stage a copy
and sums the two copies' gradients before every optimizer step
(:mod:`pipebubble.runtime.tied`), so the model trains as the tied model it is.

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

from ..errors import UserError
from .spec import ModelSpec

KNOWN_TYPES = ("gpt2", "llama", "mistral", "qwen2")
_ROTARY = ("llama", "mistral", "qwen2")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("HuggingFace models need the 'transformers' package: "
                        "pip install 'pipebubble[hf]'") from None
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


def hf_layers(model: nn.Module) -> tuple[list[nn.Module], list[str], list[str]]:
    """(layers, names, roles) of a HuggingFace causal LM; see the module docstring."""
    kind = model_type(model)
    if kind not in KNOWN_TYPES:
        raise UserError(f"HuggingFace model type {kind!r} is not one the adapter knows; known "
                        f"are {', '.join(KNOWN_TYPES)} (decoder-only causal LMs)")
    config = model.config
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
        sliding = getattr(config, "sliding_window", None) is not None and kind == "mistral"
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
        raise UserError(f"--seq must be an integer in 1..{limit or 'inf'} for this model, "
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
    and the folder to load weights from (None for a file)."""
    p = Path(path)
    if p.is_dir():
        folder, p = p, p / "config.json"
        if not p.is_file():
            raise UserError(f"hf:{path}: the folder has no config.json")
    elif p.is_file():
        folder = None
    else:
        raise UserError(f"hf:{path}: no such file or folder (give a config.json or a folder "
                        "holding one; nothing is downloaded)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"hf:{path}: cannot read {p.name} as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"hf:{path}: {p.name} must hold a JSON object")
    kind = data.get("model_type")
    if kind not in KNOWN_TYPES:
        raise UserError(f"hf:{path}: model type {kind!r} is not one the adapter knows; known "
                        f"are {', '.join(KNOWN_TYPES)} (decoder-only causal LMs)")
    return data, folder


def load_hf(path: str | Path, seq: int = 32, seed: int = 0,
            overrides: dict[str, Any] | None = None) -> ModelSpec:
    """``hf:PATH``: a causal LM from a local config (weights loaded from the folder's
    ``*.safetensors`` when present, else initialised from ``seed``); never downloads.
    ``overrides`` replace config fields (``{"num_hidden_layers": 8}``)."""
    data, folder = read_config(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tf = _transformers()
    fields = {k: v for k, v in data.items() if k not in ("model_type", "architectures",
                                                         "transformers_version")}
    try:
        config = tf.AutoConfig.for_model(data["model_type"], **fields)
        for key in overrides or {}:
            if key not in data and not hasattr(config, key):
                known = sorted(k for k in config.to_dict() if not k.startswith("_"))
                raise UserError(f"--model-arg {key}: not a field of the {data['model_type']} "
                                f"config; valid are {', '.join(known)}")
        if overrides:
            config = tf.AutoConfig.for_model(data["model_type"], **{**fields, **overrides})
    except (TypeError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise UserError(f"hf:{path}: bad config ({_first_line(exc)})") from None
    weights = sorted(folder.glob("*.safetensors")) if folder is not None else []
    torch.manual_seed(seed)
    try:
        if weights:
            model = tf.AutoModelForCausalLM.from_pretrained(str(folder), config=config,
                                                            local_files_only=True)
        else:
            model = tf.AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as exc:
        raise UserError(f"hf:{path}: cannot build the model ({_first_line(exc)})") from None
    model = model.to(torch.get_default_dtype())  # float32, or float64 under --dtype float64
    spec = hf_spec(model, seq, name=f"hf:{path}")
    spec.metadata = {"hf_weights": [w.name for w in weights] or "random (seed "
                     f"{seed})"}
    return spec


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
