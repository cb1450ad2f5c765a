"""The ``--model SPEC`` flags every command shares (profile, partition, plan, run).

``--model`` itself stays each command's own (its default and help differ); this module adds
``--model-arg KEY=VALUE`` (repeatable), ``--input-shape`` and ``--input-dtype``, and turns
the flags into a ModelSpec through :func:`pipebubble.models.loader.load_model`.
"""

from __future__ import annotations

import argparse

MODEL_HELP = ("mlp, transformer, moe, sleep (built-in); path/to/file.py:NAME or "
              "package.module:NAME (a function or object giving a ModelSpec, an nn.Sequential "
              "or a HuggingFace causal LM); hf:PATH (a local config.json or a folder with one)")


def add_spec_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="argument for the --model function (hf: a config field), repeatable; "
                   "values parsed as int, float, true/false or text")
    p.add_argument("--input-shape", default=None, metavar="D[,D..]",
                   help="an nn.Sequential model: one input sample's shape, e.g. 64 or 3,32,32")
    p.add_argument("--input-dtype", default=None, metavar="DTYPE",
                   help="an nn.Sequential model: the input dtype (float32; int64 for token "
                   "ids); refused for a model that makes its own batches (a ModelSpec, hf:)")


def user_spec_flags_given(args: argparse.Namespace) -> list[str]:
    """The --model-arg/--input-* flags given (they apply to a non-built-in --model only)."""
    out = []
    if getattr(args, "model_arg", None):
        out.append("--model-arg")
    if getattr(args, "input_shape", None) is not None:
        out.append("--input-shape")
    if getattr(args, "input_dtype", None) is not None:
        out.append("--input-dtype")
    return out


def load_from_args(args: argparse.Namespace, seq: int | None = None,
                   check: bool | None = None):
    """The ModelSpec of a non-built-in ``--model`` (file, module or hf:) from the flags."""
    from ..models.loader import load_model, parse_model_args

    return load_model(args.model, parse_model_args(getattr(args, "model_arg", None)),
                      seed=getattr(args, "seed", 0), seq=seq,
                      input_shape=getattr(args, "input_shape", None),
                      input_dtype=getattr(args, "input_dtype", None), check=check)


def check_builtin_flags(args: argparse.Namespace, builtin_only: tuple[str, ...]) -> None:
    """--model-arg/--input-* with a built-in model, or a built-in's own flags (``--layers``)
    with a user model: an error (a flag that would be silently ignored)."""
    from ..errors import UserError
    from ..models.loader import is_builtin

    if is_builtin(args.model):
        given = user_spec_flags_given(args)
        if given:
            raise UserError(f"{', '.join(given)} apply to a --model file.py:NAME, "
                            f"package.module:NAME or hf:PATH, not the built-in {args.model}")
        return
    given = [f"--{n}" for n in builtin_only if getattr(args, n, None) is not None]
    if given:
        raise UserError(f"{', '.join(given)} apply to the built-in models; give your model's "
                        "own arguments with --model-arg KEY=VALUE")
