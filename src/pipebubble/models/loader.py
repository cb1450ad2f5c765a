"""``--model SPEC``: one way to name a model, the same for profile, partition, plan and run.

A SPEC is one of

- a built-in name: ``mlp``, ``transformer``, ``sleep`` (:data:`pipebubble.models.MODELS`);
- ``path/to/file.py:NAME`` or ``package.module:NAME``: ``NAME`` is a function (called with no
  arguments, or with the ``--model-arg KEY=VALUE`` pairs) or an object, that gives
    * a :class:`~pipebubble.ModelSpec` (layers, ``make_batch(n, generator)``, ``loss_fn``),
    * an ``nn.Sequential`` (its children are the layers; ``input_shape``/``input_dtype``
      describe one sample, the loss is :func:`default_loss`), or
    * a HuggingFace causal LM (:mod:`pipebubble.models.hf`);
- ``hf:PATH``: a HuggingFace causal LM from a local ``config.json`` (or a folder with one,
  and its safetensors weights if there are any); the ``--model-arg`` pairs override fields
  of the config (``num_hidden_layers=8``). Nothing is downloaded.

Every process of a distributed run calls :func:`load_model` with the same SPEC and seed, so
every rank builds the same model and keeps its own stages.

Values of ``--model-arg`` are parsed as int, float, ``true``/``false``, else kept as text.
Every mistake is a :class:`~pipebubble.errors.UserError` of one line naming the value and
what is valid (the CLI prints it and exits 2).

>>> parse_value("8"), parse_value("0.5"), parse_value("true"), parse_value("gelu")
(8, 0.5, True, 'gelu')
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ParamError, UserError, param
from ..usercode import USER_FAILURES, UserCodeError, describe, user_code
from .spec import ModelSpec, check_spec, guard_spec

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_INPUT_DTYPE = param("input_dtype")
_INPUT_SHAPE = param("input_shape")
_MODEL = param("model")
_MODEL_ARGS = param("model_args")

BUILTIN = ("mlp", "transformer", "moe", "sleep")
FORMS = "mlp, transformer, moe, sleep, path/to/file.py:NAME, package.module:NAME or hf:PATH"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64}


def is_builtin(spec: str) -> bool:
    return spec in BUILTIN


def parse_value(text: str) -> Any:
    """``--model-arg`` value: int, float, bool (true/false), else the text itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_model_args(pairs: Sequence[str] | None) -> dict[str, str]:
    """``["layers=8", "act=gelu"]`` -> ``{"layers": "8", "act": "gelu"}``."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ParamError(f"{_MODEL_ARGS} must be KEY=VALUE with KEY a Python name, "
                             f"got {pair!r}")
        if key.strip() in out:
            raise ParamError(f"{_MODEL_ARGS} {key.strip()} is given twice")
        out[key.strip()] = value
    return out


def load_model(
    spec: str,
    model_args: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    seq: int | None = None,
    input_shape: Sequence[int] | str | None = None,
    input_dtype: str | None = None,
    check: bool | None = None,
) -> ModelSpec:
    """The :class:`ModelSpec` that ``spec`` names (see the module docstring).

    ``model_args``: keyword arguments for the builder (text values are parsed with
    :func:`parse_value`; for ``hf:`` they override config fields). ``seed`` seeds the
    weights (torch's global generator is seeded before the builder runs). ``seq``: tokens
    per sample of a HuggingFace model (32). ``input_shape``/``input_dtype``: one sample of
    an ``nn.Sequential`` (float32 by default); given for any other kind of model, they are
    an error (they would be ignored). With ``check`` (default: for every model but the
    built-ins), one forward of a 2-sample batch checks the ModelSpec contract
    (:func:`check_layers`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ParamError(f"{_MODEL} must name a model ({FORMS}), got {spec!r}")
    args = {k: parse_value(v) if isinstance(v, str) else v for k, v in (model_args or {}).items()}
    if is_builtin(spec):
        from . import MODELS

        _check_params(MODELS[spec], args, spec)
        out = MODELS[spec](**{"seed": seed, **args})
    elif spec.startswith("hf:"):
        from .hf import load_hf

        _refuse_input_flags(spec, "a HuggingFace model", input_shape, input_dtype)
        check_path_name(spec[3:], "hf:PATH")
        out = load_hf(spec[3:], seq=seq or 32, seed=seed, overrides=args)
    else:
        with redirect_stdout(sys.stderr):  # the model's print() is not the command's output
            obj, label = _resolve(spec)
            out = guard_spec(_as_spec(obj, label, args, seed, seq, input_shape, input_dtype))
    if check or (check is None and not is_builtin(spec)):
        check_layers(out)
    return out


def _refuse_input_flags(label: str, kind: str, input_shape, input_dtype) -> None:
    """``--input-shape``/``--input-dtype`` describe an nn.Sequential's sample; for a model that
    makes its own batches they would be silently ignored, so they are an error."""
    given = [f for f, v in ((_INPUT_SHAPE, input_shape), (_INPUT_DTYPE, input_dtype))
             if v is not None]
    if given:
        raise UserError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to "
                        f"an nn.Sequential model only; {label} "
                        f"is {kind}, which makes its own batches (drop the flag)")


def check_path_name(path: str, what: str) -> None:
    """A path whose name (or one of its folders' names) is longer than the file system
    allows is one line, not an OSError from deep inside a stat (other problems are left to
    the reader, which names them)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            longest = max((len(part) for part in path.split(os.sep)), default=0)
            raise UserError(f"{what} {path[:60]!r}...: name too long for the file system "
                            f"({len(path)} characters, the longest part {longest}; at most "
                            f"{_name_max(path)} per name)") from None
    except ValueError:  # an embedded NUL byte
        raise UserError(f"{what} {path[:60]!r}: not a valid path (it contains a NUL "
                        "byte)") from None


def _name_max(path: str) -> int:
    try:
        return os.pathconf(os.path.dirname(os.path.abspath(path)) or "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _resolve(spec: str) -> tuple[Any, str]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        hint = ""
        if spec.endswith(".py"):
            hint = f"; say which object builds the model, e.g. {spec}:build"
            names = _callables_in_file(spec)
            if names:
                hint += f" (the file defines {', '.join(names)})"
        raise UserError(f"unknown model {spec!r}; valid are {FORMS}{hint}")
    module = _import_file(where) if where.endswith(".py") or "/" in where else \
        _import_module(where)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_")
                            and _buildable(getattr(module, n)))
            raise UserError(f"{where} has no {name!r}; it defines "
                            f"{', '.join(public) or 'no function or model'}")
        obj = getattr(obj, part)
    return obj, spec


def _buildable(obj: Any) -> bool:
    return (inspect.isfunction(obj) or isinstance(obj, nn.Module | ModelSpec)) and \
        not inspect.isclass(obj)


def _callables_in_file(path: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and not n.name.startswith("_")]


def _import_file(path: str):
    check_path_name(path, "model file")
    p = Path(path)
    if not p.is_file():
        raise UserError(f"model file {path!r} does not exist (give path/to/file.py:NAME)")
    key = "pipebubble_user_model_" + hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:12]
    if key in sys.modules:
        return sys.modules[key]
    loader_spec = importlib.util.spec_from_file_location(key, p)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"model file {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[key] = module
    folder = str(p.resolve().parent)  # as `python file.py` would: its neighbours import
    sys.path.insert(0, folder)
    try:
        with user_code(f"importing {path}"):  # its top level is the user's code
            loader_spec.loader.exec_module(module)
    except UserError:
        del sys.modules[key]
        raise
    finally:
        sys.path.remove(folder)
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise UserError(f"no module {name!r} ({_one_line(exc)}); give path/to/file.py:NAME or "
                        "an importable package.module:NAME") from None
    except UserError:
        raise
    except USER_FAILURES as exc:
        raise UserCodeError(exc, f"importing {name}") from None


_one_line = describe  # the cause of a user error in one line (never empty)


def _check_params(fn: Any, args: Mapping[str, Any], label: str) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in args:
        if key not in valid:
            raise ParamError(f"{_MODEL_ARGS} {key}: not a parameter of {label}; valid are "
                             f"{', '.join(valid) or 'none (it takes no arguments)'}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in args
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise UserError(f"{label} needs {', '.join(missing)}: give {_MODEL_ARGS} "
                        f"{missing[0]}=VALUE")


def _as_spec(obj: Any, label: str, args: dict, seed: int, seq: int | None,
             input_shape, input_dtype: str) -> ModelSpec:
    if callable(obj) and not isinstance(obj, nn.Module):
        _check_params(obj, args, label)
        torch.manual_seed(seed)
        with user_code(f"the model builder {label}"):  # sys.exit() in it included
            obj = obj(**args)
    elif args:
        raise ParamError(f"{_MODEL_ARGS} needs a function to call; {label} is a "
                         f"{type(obj).__name__}")
    if isinstance(obj, ModelSpec):
        _refuse_input_flags(label, "a ModelSpec", input_shape, input_dtype)
        return obj
    if _is_hf(obj):
        from .hf import hf_spec

        _refuse_input_flags(label, "a HuggingFace model", input_shape, input_dtype)
        return hf_spec(obj, seq or 32, name=label)
    if isinstance(obj, nn.Sequential):
        return sequential_spec(obj, input_shape, input_dtype or "float32", name=label)
    what = type(obj).__name__
    extra = (" (an nn.Module other than nn.Sequential cannot be cut between layers; wrap "
             "its layers in nn.Sequential or return a ModelSpec)") if isinstance(obj, nn.Module) \
        else ""
    raise UserError(f"{label} gave a {what}; it must give a pipebubble.ModelSpec, an "
                    f"nn.Sequential or a HuggingFace causal LM{extra}")


def _is_hf(obj: Any) -> bool:
    config = getattr(obj, "config", None)
    return isinstance(obj, nn.Module) and getattr(config, "model_type", None) is not None


def parse_shape(shape: Sequence[int] | str | None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    parts = shape.split(",") if isinstance(shape, str) else list(shape)
    try:
        dims = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise ParamError(f"{_INPUT_SHAPE} must be positive integers like 64 or 3,32,32 (one "
                         f"sample, without the batch), got {str(shape)[:80]!r}")
    from ..limits import check_input_shape

    return check_input_shape(dims)


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss of an ``nn.Sequential``: mean squared error against the batch's targets
    (random, shaped like the output). Give a ModelSpec for a loss of your own."""
    return nn.functional.mse_loss(output, target)


def sequential_spec(model: nn.Sequential, input_shape, input_dtype: str = "float32",
                    name: str = "sequential") -> ModelSpec:
    """A ModelSpec for an ``nn.Sequential``: its children are the layers; batches are
    random inputs of ``input_shape`` (normal, or token ids below the first embedding's
    size for an integer dtype) and random targets shaped like the output; the loss is
    :func:`default_loss` (MSE)."""
    shape = parse_shape(input_shape)
    if shape is None:
        raise UserError(f"{name} is an nn.Sequential: give {_INPUT_SHAPE} (one sample, e.g. "
                        f"64 or 3,32,32) and optionally {_INPUT_DTYPE}")
    if input_dtype not in DTYPES:
        raise ParamError(f"{_INPUT_DTYPE} must be one of {', '.join(DTYPES)}, got {input_dtype!r}")
    dtype = DTYPES[input_dtype]
    named = list(model.named_children())
    if not named:
        raise UserError(f"{name} is an empty nn.Sequential; it needs at least one layer")
    names = [n for n, _ in named]
    layers = [m for _, m in named]
    high = None
    if not dtype.is_floating_point:
        emb = next((m for m in layers[0].modules() if isinstance(m, nn.Embedding)), None)
        if emb is None:
            raise ParamError(f"{_INPUT_DTYPE} {input_dtype}: the first layer of {name} has no "
                             "nn.Embedding to take token ids; use a float dtype")
        high = emb.num_embeddings
    make_batch = _SequentialBatch(name, layers, names, shape, dtype, high)
    roles = ["layer"] * len(layers)
    if high is not None:
        roles[0] = "embedding"
    desc = (f"{name}: nn.Sequential of {len(layers)} layers, input {input_dtype} "
            f"{list(shape)}, loss: mean squared error against random targets shaped like "
            "the output")
    return ModelSpec(name, layers, make_batch, default_loss, names, roles, desc)


class _SequentialBatch:
    """``make_batch`` of an nn.Sequential: random inputs, and random targets shaped like the
    output (found by one forward the first time it is asked). ``inputs`` alone lets
    :func:`check_layers` run the layers first, so that a mismatch names the stages."""

    def __init__(self, name, layers, names, shape, dtype, high):
        self.name, self.layers, self.names = name, layers, names
        self.shape, self.dtype, self.high = shape, dtype, high
        self.out_shape: tuple[int, ...] | None = None

    def inputs(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return _sample(n, self.shape, self.dtype, self.high, gen)

    def __call__(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.out_shape is None:
            x = self.inputs(2, torch.Generator().manual_seed(0))
            device = next((p.device for m in self.layers for p in m.parameters()), x.device)
            self.out_shape = tuple(_run_layers(self.name, self.layers, self.names,
                                               x.to(device)).shape[1:])
        x = self.inputs(n, gen)
        return x, torch.randn(n, *self.out_shape, generator=gen)


def _sample(n, shape, dtype, high, gen) -> torch.Tensor:
    if high is not None:
        return torch.randint(0, high, (n, *shape), generator=gen, dtype=dtype)
    return torch.randn(n, *shape, generator=gen).to(dtype)


def check_layers(spec: ModelSpec, boundaries: Sequence[int] | None = None,
                 samples: int = 2) -> None:
    """The ModelSpec contract, checked up front, one line per breach (a UserError):

    - the fields (:func:`~pipebubble.models.spec.check_spec`): layers are ``nn.Module`` s,
      names and roles fit them;
    - ``make_batch(samples, generator)`` gives two tensors of ``samples`` rows;
    - one forward of that batch, layer by layer: a layer that cannot take the previous one's
      output is named with both layers, the shape, and (with ``boundaries``, the first layer
      of every stage after the first) the two stages it lies between;
    - the loss of the last layer's output is one number *with a gradient* (a ``.detach()``
      or ``.item()`` inside ``loss_fn`` would leave the backward nothing to do);
    - some parameter is trainable. A *stage* without trainable parameters is fine (its
      backward only passes the gradient on, or, on the first stage, does nothing).
    """
    check_spec(spec)
    names = spec.layer_names()
    device = next((p.device for m in spec.layers for p in m.parameters()), torch.device("cpu"))
    with redirect_stdout(sys.stderr):  # the model's print() is not the command's output
        inputs = getattr(spec.make_batch, "inputs", None)  # an nn.Sequential's: layers first
        if inputs is not None:
            _run_layers(spec.name, spec.layers, names,
                        inputs(samples, torch.Generator().manual_seed(0)).to(device), boundaries)
        batch = guard_spec(spec).make_batch  # the user's errors, and what it returns, checked
        x, y = batch(samples, torch.Generator().manual_seed(0))
        x = _run_layers(spec.name, spec.layers, names, x.to(device), boundaries)
        y = y.to(device)
        out = x.detach().requires_grad_(x.is_floating_point())
        try:
            with torch.enable_grad():
                loss = spec.loss_fn(out, y)
        except UserError:
            raise
        except USER_FAILURES as exc:
            raise UserError(f"model {spec.name!r}: the loss cannot take the last layer's "
                            f"output {tuple(x.shape)} and the target {tuple(y.shape)}: "
                            f"{_one_line(exc)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserError(f"model {spec.name!r}: loss_fn must return one number (a 1-element "
                        f"tensor), got {type(loss).__name__}")
    if out.requires_grad and not loss.requires_grad:
        raise UserError(f"model {spec.name!r}: loss_fn returned a loss without a gradient "
                        "(requires_grad is False: a .detach(), .item(), torch.tensor(...) or "
                        "torch.no_grad() inside it?); the backward needs the loss as a function "
                        "of the model's output")
    if not any(p.requires_grad for m in spec.layers for p in m.parameters()):
        raise UserError(f"model {spec.name!r} has no trainable parameter (none with "
                        "requires_grad=True): there is nothing to train or to time a backward "
                        "of")


def _run_layers(model: str, layers: Sequence[nn.Module], names: Sequence[str], x: torch.Tensor,
                boundaries: Sequence[int] | None = None) -> torch.Tensor:
    """Run ``layers`` in order without gradients; a layer that cannot take its input is a
    UserError naming it, the previous layer, the shape and (with ``boundaries``) the stages."""
    cuts = list(boundaries or [])
    with torch.no_grad():
        for i, layer in enumerate(layers):
            try:
                x = layer(x)
            except UserError:
                raise
            except USER_FAILURES as exc:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                if i == 0:
                    raise UserError(f"model {model!r}: layer 0 ({names[0]!r}) cannot take "
                                    f"the batch's input of shape {shape}: "
                                    f"{_one_line(exc)}") from None
                k = sum(1 for c in cuts if c <= i)
                between = (f" (between stage {k - 1} and stage {k})"
                           if i in cuts else f" (in stage {k})" if cuts else "")
                raise UserError(
                    f"model {model!r}: layer {i} ({names[i]!r}) cannot take the output of "
                    f"layer {i - 1} ({names[i - 1]!r}){between}, shape {shape}: "
                    f"{_one_line(exc)}") from None
            if not isinstance(x, torch.Tensor):
                raise UserError(f"model {model!r}: layer {i} ({names[i]!r}) returned a "
                                f"{type(x).__name__}; each layer must return one tensor (what "
                                "the next stage receives)")
    return x
