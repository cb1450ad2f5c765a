"""A per-stage sharded checkpoint with ``torch.distributed.checkpoint`` (DCP).

What is written to ``DIR`` (``run --save DIR``):

- the DCP shards: every rank writes *its own stages* (``__R_0.distcp``), and DCP's
  ``.metadata`` indexes them. The keys are the model's own parameter names, the same
  whichever rank held a layer: ``model.layers.3.linear.weight`` and, for AdamW,
  ``optim.layers.3.linear.weight.exp_avg`` (``.exp_avg_sq``, ``.step``). A checkpoint
  written with one cut or schedule therefore loads into any other cut of the same model:
  each rank asks DCP for the keys of the layers it holds now. Copies of one tensor (data-
  parallel replicas, DualPipe's two model copies) carry the same key; DCP writes one.
- ``pipebubble.json``: what the shards are (the model and every parameter's shape, the
  optimizer) and where training stands (steps done; the data seed, so that step ``k``'s
  batch is the same in the resumed run as in an uninterrupted one).

Nothing is half-written: the shards and the metadata go to ``DIR.partial`` first; the
metadata is written to a temporary file and renamed (:func:`write_json_atomic`), then the
folder is renamed into place (an older checkpoint at ``DIR`` is moved aside first and
removed after). A failed or interrupted save leaves ``DIR`` as it was.

``run --resume DIR`` checks, before any work, that ``DIR`` is a checkpoint
(:func:`read_meta`) of this model (:func:`check_compatible`: every parameter name and
shape), then loads each rank's part (:func:`load_state`).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError

META = "pipebubble.json"
FORMAT = "pipebubble-checkpoint"
VERSION = 1
# What each optimizer keeps per parameter (SGD without momentum keeps nothing).
OPTIMIZER_STATE = {"sgd": (), "adamw": ("step", "exp_avg", "exp_avg_sq")}


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path``: a temporary file beside it, flushed, renamed
    over ``path`` (a reader sees the old file or the new one, never a part)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ---- checks before a run ------------------------------------------------------------------
def check_save_dir(path: str) -> Path:
    """``--save DIR``: a new folder, an empty one, or an earlier checkpoint (replaced)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"--save {path}: exists and is not a folder; give a new folder name")
    if p.is_dir() and any(p.iterdir()) and not (p / META).is_file():
        raise UserError(f"--save {path}: a non-empty folder that is not a pipebubble "
                        "checkpoint; give a new or empty folder (or an earlier checkpoint)")
    parent = p.absolute().parent
    if not parent.is_dir():
        raise UserError(f"--save {path}: the parent folder {parent} does not exist")
    return p


def read_meta(path: str) -> dict:
    """The metadata of the checkpoint at ``path``; UserError when it is not one."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"--resume {path}: not a folder; give a folder written by run --save")
    try:
        meta = json.loads((p / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--resume {path}: not a pipebubble checkpoint (no {META}); give a "
                        "folder written by run --save") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--resume {path}: {META} is unreadable ({type(exc).__name__}); the "
                        "checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"--resume {path}: {META} is not a pipebubble checkpoint's metadata")
    if meta.get("version") != VERSION:
        raise UserError(f"--resume {path}: checkpoint version {meta.get('version')!r}; this "
                        f"pipebubble reads version {VERSION}")
    for key, kind in (("parameters", dict), ("steps_done", int), ("optimizer", str),
                      ("seed", int)):
        if not isinstance(meta.get(key), kind):
            raise UserError(f"--resume {path}: {META} lacks {key!r}; the checkpoint is damaged")
    if not (p / ".metadata").is_file():
        raise UserError(f"--resume {path}: the shards' index (.metadata) is missing; the "
                        "checkpoint is damaged")
    return meta


def check_compatible(path: str, meta: dict, shapes: dict[str, tuple[int, ...]],
                     optimizer: str, seed: int) -> None:
    """The checkpoint holds exactly this model's parameters (names and shapes), for this
    optimizer and data seed; else one UserError naming the first difference."""
    theirs = {k: tuple(v) for k, v in meta["parameters"].items()}
    what = f"--resume {path}: the checkpoint belongs to another model ({meta.get('model')!r})"
    missing = [k for k in shapes if k not in theirs]
    extra = [k for k in theirs if k not in shapes]
    if missing or extra:
        first = (f"it has no {missing[0]!r}" if missing else f"it has {extra[0]!r}, which "
                 "this model has not")
        raise UserError(f"{what}: {first} ({len(missing)} names missing, {len(extra)} extra)")
    for k, shape in shapes.items():
        if theirs[k] != tuple(shape):
            raise UserError(f"{what}: {k!r} has shape {list(theirs[k])} there, "
                            f"{list(shape)} here")
    if meta["optimizer"] != optimizer:
        raise UserError(f"--resume {path}: the checkpoint was trained with --optimizer "
                        f"{meta['optimizer']}, not {optimizer}; use --optimizer "
                        f"{meta['optimizer']}")
    if meta["seed"] != seed:
        raise UserError(f"--resume {path}: the checkpoint's data stream has --seed "
                        f"{meta['seed']}, not {seed}; use --seed {meta['seed']} (step k's "
                        "batch depends on both)")


# ---- the state of one rank ----------------------------------------------------------------
def rank_state(named: Sequence[tuple[str, nn.Parameter]], opt: torch.optim.Optimizer | None,
               optimizer: str, *, for_load: bool = False) -> dict[str, torch.Tensor]:
    """The flat DCP state of this rank's parameters (``named``: model-wide names).

    For saving, the optimizer's current state; ``for_load``: tensors of the right shape for
    DCP to load into (see :func:`install_optimizer_state`)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in named:
        out[f"model.{name}"] = p.data
        if opt is None:
            continue
        st = opt.state.get(p, {})
        for key in OPTIMIZER_STATE[optimizer]:
            if for_load:
                out[f"optim.{name}.{key}"] = (torch.zeros((), dtype=torch.float32)
                                              if key == "step" else torch.zeros_like(p.data))
            elif key in st:
                out[f"optim.{name}.{key}"] = st[key]
    return out


def install_optimizer_state(named: Sequence[tuple[str, nn.Parameter]],
                            opt: torch.optim.Optimizer, optimizer: str,
                            state: dict[str, torch.Tensor]) -> None:
    """Put what DCP loaded (``state``, from :func:`rank_state` ``for_load=True``) into the
    optimizer, as if it had taken the checkpoint's steps itself."""
    keys = OPTIMIZER_STATE[optimizer]
    for name, p in named:
        if keys:
            opt.state[p] = {k: state[f"optim.{name}.{k}"] for k in keys}


def _quiet(fn: Callable, *args, **kwargs):
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        return fn(*args, **kwargs)


def save(path: str, state: dict[str, torch.Tensor], meta: dict, *, coordinator: bool = True,
         barrier: Callable[[], None] = lambda: None) -> None:
    """Write this rank's ``state`` and (on the coordinator) ``meta`` to ``path``.

    Collective: every rank of the default process group calls it (or one process alone,
    without one). ``barrier`` synchronises the ranks between the phases (the coordinator
    clears ``DIR.partial``, all write, the coordinator renames).
    """
    import torch.distributed.checkpoint as dcp

    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    if coordinator and partial.exists():
        shutil.rmtree(partial)
    barrier()
    _quiet(dcp.save, state, checkpoint_id=str(partial))
    barrier()
    if coordinator:
        write_json_atomic(partial / META, {**meta, "format": FORMAT, "version": VERSION})
        old = final.with_name(final.name + ".old")
        if final.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(partial, final)
        if old.exists():
            shutil.rmtree(old)
    barrier()


def load(path: str, state: dict[str, torch.Tensor]) -> None:
    """Fill ``state``'s tensors in place from the checkpoint (collective, like :func:`save`)."""
    import torch.distributed.checkpoint as dcp

    _quiet(dcp.load, state, checkpoint_id=str(path))


def checkpoint_meta(*, model: str, description: str, shapes: dict[str, tuple[int, ...]],
                    steps_done: int, seed: int, optimizer: str, lr: float, schedule: str,
                    boundaries: Sequence[int], batch: int, losses: Sequence[float]) -> dict:
    """The metadata file's content (see the module docstring)."""
    return {
        "model": model, "description": description,
        "parameters": {k: list(v) for k, v in shapes.items()},
        "steps_done": steps_done, "seed": seed, "next_step": steps_done,
        "optimizer": optimizer, "lr": lr, "schedule": schedule,
        "boundaries": list(boundaries), "batch": batch, "losses": list(losses),
    }
