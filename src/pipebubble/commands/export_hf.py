"""``pipebubble export-hf CKPT_DIR OUT_DIR``: a checkpoint of an ``hf:`` model, back as a
HuggingFace ``save_pretrained`` folder.

``run --model hf:PATH --save CKPT_DIR`` records the model's HF config as it was built
(``--model-arg`` overrides included) in ``CKPT_DIR/pipebubble.json`` (``hf_config``); a
checkpoint written before that, or of a model given another way, takes the config from
``--hf-config PATH`` (a ``config.json`` or a folder holding one). The model is built from
that config, every parameter is read from the checkpoint by its model-wide name
(``model.layers.3.layer.mlp.up_proj.weight``: the layer's name, then the parameter's inside
the pipebubble layer), the checkpoint's names and shapes are checked against the model's
first, and a tied weight (the token table and the head of ``tie_word_embeddings``), held
once per stage in the checkpoint, must have equal copies. The folder is written by
transformers' own ``save_pretrained`` (``config.json``, ``model.safetensors``), in the
checkpoint's dtype, so ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads the trained
weights, and ``pipebubble run --model hf:OUT_DIR`` trains on from them.

Bad input is one line, exit 2: not a checkpoint (or a damaged one: the checks of
``run --resume``), a checkpoint of a model that is not ``hf:`` without ``--hf-config``, a
config whose parameters are not the checkpoint's, and an existing ``OUT_DIR`` without
``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..errors import UserError
from ._flags import render


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-hf", help="write a checkpoint of an hf: model as a "
                       "HuggingFace save_pretrained folder",
                       description="Rebuild the hf: model of a run --save checkpoint from its "
                       "recorded HF config (or --hf-config), load the checkpoint's weights "
                       "and write OUT_DIR with transformers' save_pretrained.")
    p.add_argument("checkpoint", metavar="CKPT_DIR", help="a folder written by run --save")
    p.add_argument("out", metavar="OUT_DIR", help="the save_pretrained folder to write")
    p.add_argument("--hf-config", default=None, metavar="PATH",
                   help="the model's config.json (or a folder with one), for a checkpoint "
                   "that records none")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an existing OUT_DIR (its config.json and weights are "
                   "replaced)")
    p.set_defaults(func=run)


def _as_export(exc: UserError, path: str) -> UserError:
    """A checkpoint reader's error, worded for export-hf instead of --resume."""
    return UserError(render(exc).replace(f"--resume {path}", f"export-hf {path}", 1))


def check_out_dir(out: str, overwrite: bool) -> Path:
    """OUT_DIR: a new folder (its parent existing), or an existing one with --overwrite."""
    from ..models.loader import check_path_name

    if out == "":
        raise UserError("export-hf OUT_DIR '': empty folder name; give a new folder")
    check_path_name(out, "export-hf OUT_DIR")
    p = Path(out)
    if os.path.lexists(p):
        if not p.is_dir() or p.is_symlink():
            raise UserError(f"export-hf OUT_DIR {out}: exists and is not a folder; give a new "
                            "folder name")
        if not overwrite:
            raise UserError(f"export-hf OUT_DIR {out}: exists; pass --overwrite to write "
                            "into it, or give a new folder")
    elif not p.absolute().parent.is_dir():
        raise UserError(f"export-hf OUT_DIR {out}: its parent folder does not exist")
    return p


def run(args: argparse.Namespace) -> int:
    from ..runtime import checkpoint as ckpt

    path = args.checkpoint
    out = check_out_dir(args.out, args.overwrite)
    try:
        meta = ckpt.read_meta(path)
    except UserError as exc:
        raise _as_export(exc, path) from None
    model = export_model(path, meta, args.hf_config)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards": the line below says it
    out.mkdir(exist_ok=True)
    model.save_pretrained(str(out))
    sys.stderr.write(f"wrote {args.out}: {model.config.model_type}, "
                     f"{sum(p.numel() for p in model.parameters()):,} parameters, "
                     f"{meta['steps_done']} steps trained ({next(model.parameters()).dtype})\n")
    return 0


def export_model(path: str, meta: dict, hf_config: str | None = None):
    """The transformers model of the checkpoint at ``path`` (``meta``: its checked
    ``pipebubble.json``), its weights the checkpoint's (module doc)."""
    import torch

    from ..models.hf import build_hf_model, hf_layers
    from ..runtime import checkpoint as ckpt

    recorded = meta.get("hf_config")
    model_name = str(meta.get("model", ""))
    if hf_config is None and recorded is None:
        if model_name.startswith("hf:"):
            raise UserError(f"export-hf {path}: the checkpoint records no HF config (written "
                            "before export-hf existed); give --hf-config PATH, the "
                            "config.json it was trained from")
        raise UserError(f"export-hf {path}: the checkpoint is of model {model_name!r}, not an "
                        "hf: model; export-hf writes HuggingFace folders of hf: models (give "
                        "--hf-config PATH if its layers are one)")
    md = ckpt.read_dcp_metadata(path, meta)
    dtypes = {getattr(v.properties, "dtype", None) for k, v in md.state_dict_metadata.items()
              if k.startswith("model.")}
    dtype = next(iter(dtypes)) if len(dtypes) == 1 else torch.float32
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype if dtype in (torch.float32, torch.float64)
                                else torch.float32)
        if hf_config is not None:
            model, _ = build_hf_model(hf_config)
        else:
            if not isinstance(recorded, dict):
                raise UserError(f"export-hf {path}: pipebubble.json's hf_config must be a "
                                "JSON object (the checkpoint is damaged or was edited)")
            with tempfile.TemporaryDirectory(prefix="pipebubble-export-") as tmp:
                Path(tmp, "config.json").write_text(json.dumps(recorded), encoding="utf-8")
                try:
                    model, _ = build_hf_model(tmp)
                except UserError as exc:
                    raise UserError(render(exc).replace(
                        f"hf:{tmp}", f"export-hf {path}: the recorded hf_config")) from None
    finally:
        torch.set_default_dtype(old)
    model = model.to(dtype)
    layers, names, _ = hf_layers(model)
    named = [(f"{names[i]}.{pn}", p) for i, layer in enumerate(layers)
             for pn, p in layer.named_parameters(remove_duplicate=False)]
    shapes = {n: tuple(p.shape) for n, p in named}
    try:
        ckpt.check_compatible(path, meta, shapes, meta["optimizer"], meta["seed"])
    except UserError as exc:
        raise UserError(render(exc).replace(f"--resume {path}", f"export-hf {path}", 1)
                        + ("" if hf_config is None else f" (--hf-config {hf_config})")) \
            from None
    state = {f"model.{n}": torch.empty(p.shape, dtype=dtype) for n, p in named}
    try:
        ckpt.load(path, state, meta=meta, no_dist=True)
    except UserError as exc:
        raise _as_export(exc, path) from None
    first: dict[int, str] = {}
    with torch.no_grad():
        for n, p in named:
            value = state[f"model.{n}"]
            if id(p) in first:  # a tied weight: another layer's copy was loaded already
                other = first[id(p)]
                if not torch.equal(p, value):
                    diff = (p - value).abs().max().item()
                    raise UserError(f"export-hf {path}: the tied weight {other} and {n} "
                                    f"differ (by up to {diff:.3g}); the checkpoint did not "
                                    "keep them tied")
                continue
            first[id(p)] = n
            p.copy_(value)
    model.config.dtype = dtype
    return model
