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

**Saving is atomic.** :func:`check_save_dir` refuses, before the first step, every target
that could fail at save time (an empty name, ``.``, a symbolic link, a special file, a
folder inside ``/proc``, ``/sys`` or ``/dev``, a parent where no folder can be created,
``DIR.partial`` being a file) and an existing checkpoint unless ``--overwrite``. The save
(:func:`save`) writes the shards and ``pipebubble.json`` into ``DIR.partial`` (the metadata
last, through a temporary file and a rename), then puts the folder in place in one step:
on Linux ``renameat2(RENAME_EXCHANGE)`` swaps ``DIR.partial`` and ``DIR`` atomically and
the old checkpoint, now at ``DIR.partial``, is removed; elsewhere ``DIR`` is moved to
``DIR.old`` first and :func:`recover` completes the swap if a crash came between the two
renames. So at every instant ``DIR`` is the old checkpoint or the new one, whole: ``kill
-9`` at any moment loses at most the save in progress. A save that fails raises
:class:`SaveError` (one line) and leaves ``DIR`` as it was.

**Loading runs no code from the folder.** DCP's own reader ``pickle.load``-s ``.metadata``,
so a crafted folder could run anything. Here :func:`read_dcp_metadata` unpickles it with an
allow-list (:class:`_MetadataUnpickler`, the way ``torch.load(weights_only=True)`` does it):
only DCP's metadata dataclasses, ``torch.Size``, dtypes, layouts and plain containers may
be built, and only they may be called; anything else is refused naming the file. It then
checks what the index says against the folder (every shard present, a plain file, long
enough, each tensor record framed as ``torch.save`` writes it) and against
``pipebubble.json``. :class:`CheckedReader` hands DCP that checked metadata instead of
letting it unpickle the file again; the tensors themselves DCP reads with
``torch.load(weights_only=True)``.

``run --resume DIR`` checks, before any work, that ``DIR`` is a checkpoint
(:func:`read_meta`: every field in range, the shards as above) of this model
(:func:`check_compatible`: every parameter name and shape), then loads each rank's part
(:func:`load`). Every damaged or hostile folder is one :class:`CheckpointError` line naming
the file and what is wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ParamError, UserError, param
from ..files import MAX_INPUT_BYTES, FileError, MissingFileError, read_bytes_file, read_json_file

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_OPTIMIZER = param("optimizer")
_OVERWRITE = param("overwrite")
_RESUME = param("resume")
_SAVE = param("save")
_SEED = param("seed")

META = "pipebubble.json"
DCP_META = ".metadata"
FORMAT = "pipebubble-checkpoint"
VERSION = 1
# What each optimizer keeps per parameter (SGD without momentum keeps nothing).
OPTIMIZER_STATE = {"sgd": (), "adamw": ("step", "exp_avg", "exp_avg_sq")}
MAX_STEPS_DONE = 10**12
"""Largest ``steps_done`` a checkpoint may record (a million runs of ``--steps 10**6``)."""
MAX_SEED = 2**32 - 1
MAX_LR = 1000.0  # as --lr
MAX_DIMS, MAX_DIM = 8, 2**40
SHARD_NAME = re.compile(r"__\d{1,9}_\d{1,9}\.distcp")
"""The names DCP's FileSystemWriter gives shard files; the index may name no other file."""
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")
_ZIP_START, _ZIP_END, _ZIP_END_LEN = b"PK\x03\x04", b"PK\x05\x06", 22


class CheckpointError(UserError):
    """A checkpoint folder that cannot be used: one line naming the file and what is wrong."""


class SaveError(UserError):
    """``--save`` failed while writing; the previous checkpoint at ``DIR`` is unchanged."""


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


def _why(exc: BaseException) -> str:
    """An exception as a short phrase: its type and the first line of its text (for DCP's
    CheckpointException, of the first rank's own exception)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (inner, _) = sorted(failures.items(), key=lambda kv: kv[0])[0]
        return f"rank {rank}: {_why(inner)}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


# ---- where a checkpoint may go --------------------------------------------------------------
def _siblings(final: Path) -> tuple[Path, Path]:
    """``DIR.partial`` (where a save writes) and ``DIR.old`` (the non-Linux swap's)."""
    return final.with_name(final.name + ".partial"), final.with_name(final.name + ".old")


def _is_checkpoint(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and (p / META).is_file()


def recover(path: str | os.PathLike) -> None:
    """Finish a save killed between the two renames of the swap used where ``renameat2`` is
    missing: ``DIR`` gone, the previous checkpoint at ``DIR.old`` and the new one whole at
    ``DIR.partial`` (its ``pipebubble.json`` is written last) -> the new one becomes ``DIR``.
    Nothing else is touched (a folder the user renamed to ``DIR.old`` stays where it is)."""
    final = Path(path)
    partial, old = _siblings(final)
    if not os.path.lexists(final) and _is_checkpoint(old) and _is_checkpoint(partial):
        with contextlib.suppress(OSError):
            os.rename(partial, final)
            shutil.rmtree(old)


def _ours(folder: Path) -> bool:
    """Whether every entry of ``folder`` is a file a save writes (a leftover partial save)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return all(n in (META, DCP_META, DCP_META + ".tmp") or SHARD_NAME.fullmatch(n)
               or n.startswith(f".{META}.tmp-")
               for n in names)


def _kernel_folder(real: str) -> str | None:
    for top in KERNEL_FOLDERS:
        if real == top or real.startswith(top + "/"):
            return top
    return None


def check_save_dir(path: str, *, overwrite: bool = False) -> Path:
    """``--save DIR``: refuse, before any training step, every target a save could fail on.

    Valid: a new folder name in a folder where pipebubble may create folders, an empty
    folder, or (with ``overwrite``) an earlier checkpoint. Refused, one line each: an empty
    name, ``.``/``..``/``/`` or the current folder, a name over the file system's limit, a
    symbolic link (the swap would replace the link, not what it points to), an existing file
    or special file, a non-empty folder that is not a checkpoint, a place inside
    ``/proc``, ``/sys`` or ``/dev``, a parent that is missing or read-only, and ``DIR.partial``
    / ``DIR.old`` being anything but a leftover of an earlier save.
    """
    if path == "":
        raise ParamError(f"{_SAVE} '': empty folder name; give the folder to write the "
                         f"checkpoint to, e.g. {_SAVE} ckpt")
    final = Path(path)
    if final.name in ("", ".", ".."):
        raise ParamError(f"{_SAVE} {path}: give the name of a new folder for the checkpoint, "
                         "not '.', '..' or '/'")
    try:
        parent_real = os.path.realpath(final.absolute().parent)
        top = _kernel_folder(os.path.join(parent_real, final.name))
        if top is not None:
            raise ParamError(f"{_SAVE} {path}: inside {top}, a kernel file system; give a "
                             "folder on disk")
        if os.path.realpath(final) == os.path.realpath(os.getcwd()):
            raise ParamError(f"{_SAVE} {path}: is the current folder; give a new folder's name")
        try:
            name_max = os.pathconf(parent_real if os.path.isdir(parent_real) else ".",
                                   "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        if len(os.fsencode(final.name)) + len(".partial") > name_max:
            raise ParamError(f"{_SAVE} {path}: the name is {len(os.fsencode(final.name))} bytes;"
                             f" at most {name_max - len('.partial')} fit this file system "
                             "(with '.partial')")
        recover(final)  # after the name check: a name over NAME_MAX cannot be looked up
        if final.is_symlink():
            raise ParamError(f"{_SAVE} {path}: is a symbolic link (to {os.readlink(final)!r}); "
                             "give the real folder (a save replaces DIR by a rename)")
        if final.exists() and not final.is_dir():
            raise ParamError(f"{_SAVE} {path}: exists and is not a folder; give a new folder "
                             "name")
        if final.is_dir():
            if (final / META).is_file():
                if not overwrite:
                    raise ParamError(f"{_SAVE} {path}: is a checkpoint already; add {_OVERWRITE} "
                                     "to replace it (it is replaced only once the new one is "
                                     "written whole) or give a new folder")
            elif any(final.iterdir()):
                raise ParamError(f"{_SAVE} {path}: a non-empty folder that is not a pipebubble "
                                 "checkpoint; give a new or empty folder (or an earlier "
                                 "checkpoint)")
        parent = final.absolute().parent
        if not parent.is_dir():
            raise ParamError(f"{_SAVE} {path}: the parent folder {parent} "
                             + ("is a file" if parent.exists() else "does not exist"))
        for side in _siblings(final):
            if side.is_symlink() or (side.exists() and not side.is_dir()):
                kind = "a symbolic link" if side.is_symlink() else "a file"
                raise ParamError(f"{_SAVE} {path}: {side} exists and is {kind}; remove it (a "
                                 "save writes its folder there first)")
            if side.is_dir() and not _ours(side):
                raise ParamError(f"{_SAVE} {path}: {side} is a folder that an interrupted save "
                                 "did not leave (it holds other files); remove or rename it")
        try:  # can a folder be created there? (as root, os.access says yes to a 0o555 one)
            os.rmdir(tempfile.mkdtemp(prefix=f".{final.name[:200]}.", suffix=".probe",
                                      dir=parent))
        except OSError as exc:
            raise ParamError(f"{_SAVE} {path}: cannot create a folder in {parent} "
                             f"({_why(exc)}); give a writable place") from None
    except OSError as exc:  # e.g. a path too long to stat
        raise ParamError(f"{_SAVE} {path}: {_why(exc)}") from None
    return final


# ---- reading a checkpoint without running its code ------------------------------------------
def _layout(name: str) -> torch.layout:
    """What ``torch.serialization._get_layout`` gives a pickle, but only a layout: the
    original returns any attribute of torch, which a crafted pickle could then call."""
    for v in torch.__dict__.values():
        if isinstance(v, torch.layout) and str(v) == name:
            return v
    raise pickle.UnpicklingError(f"unknown layout {name[:40]!r}")


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """Every global a DCP ``.metadata`` pickle names (measured on pipebubble's checkpoints:
    the metadata dataclasses, ``_StorageInfo``, ``torch.Size``, dtypes, the layout lookup,
    the memory-format enum, ``PosixPath`` for the checkpoint id), plus plain containers."""
    import pathlib
    from collections import OrderedDict

    from torch.distributed.checkpoint import filesystem, metadata

    out: dict[tuple[str, str], Any] = {
        ("torch", "Size"): torch.Size,
        ("torch.serialization", "_get_layout"): _layout,
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): filesystem._StorageInfo,
        ("pathlib", "PosixPath"): pathlib.PosixPath,
        ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
    }
    for name in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata",
                 "BytesStorageMetadata", "TensorProperties", "StorageMeta",
                 "_MEM_FORMAT_ENCODING"):
        out[("torch.distributed.checkpoint.metadata", name)] = getattr(metadata, name)
    for name, v in vars(torch).items():
        if isinstance(v, torch.dtype):
            out[("torch", name)] = v
    return out


class _MetadataUnpickler(pickle._Unpickler):
    """Python's own unpickler with every way to run code closed, as in
    ``torch.load(weights_only=True)``: ``find_class`` resolves only the allowed globals,
    and REDUCE / NEWOBJ (calls) and BUILD (``__setstate__``, attribute writes) act only on
    the allowed classes and their instances. Persistent ids, protocol-0/1 instance opcodes
    and everything else are refused."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.allowed = _allowed_globals()
        self.callables = [v for v in self.allowed.values() if callable(v)]
        self.classes = tuple(v for v in self.allowed.values() if isinstance(v, type))

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is not DCP "
                                         "metadata") from None

    def _callable(self, f: Any) -> None:
        if not any(f is c for c in self.callables):
            raise pickle.UnpicklingError(f"it calls {getattr(f, '__name__', type(f).__name__)}"
                                         ", which is not a DCP metadata type")

    def _reduce(self) -> None:
        self._callable(self.stack[-2])
        pickle._Unpickler.load_reduce(self)

    def _newobj(self) -> None:
        self._callable(self.stack[-2])
        pickle._Unpickler.load_newobj(self)

    def _newobj_ex(self) -> None:
        self._callable(self.stack[-3])
        pickle._Unpickler.load_newobj_ex(self)

    def _build(self) -> None:
        inst = self.stack[-2]
        if isinstance(inst, type) or not isinstance(inst, self.classes):
            raise pickle.UnpicklingError(f"it sets the state of a {type(inst).__name__}, "
                                         "which is not a DCP metadata type")
        pickle._Unpickler.load_build(self)

    def _refuse(self) -> None:
        raise pickle.UnpicklingError("it uses an opcode DCP metadata never has")

    dispatch[pickle.REDUCE[0]] = _reduce
    dispatch[pickle.NEWOBJ[0]] = _newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _newobj_ex
    dispatch[pickle.BUILD[0]] = _build
    for _op in (pickle.INST, pickle.OBJ, pickle.PERSID, pickle.BINPERSID):
        dispatch[_op[0]] = _refuse
    del _op


def _load_dcp_pickle(data: bytes) -> Any:
    return _MetadataUnpickler(io.BytesIO(data)).load()


def _int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def read_dcp_metadata(path: str | os.PathLike, meta: dict | None = None) -> Any:
    """DCP's index of the checkpoint at ``path``, read without running code and checked
    against the folder (and, given ``meta``, against ``pipebubble.json``): every key a
    tensor in one whole chunk, every record in a shard file named as DCP names them,
    present, a regular file, long enough, and framed as ``torch.save`` frames a tensor.
    :class:`CheckpointError` names the file and the first thing wrong."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    folder = Path(path)
    where = f"{_RESUME} {path}"
    f = folder / DCP_META
    try:
        data = read_bytes_file(f, "DCP index", MAX_INPUT_BYTES)
    except MissingFileError:
        raise CheckpointError(f"{where}: the shards' index ({DCP_META}) is missing; the "
                              "checkpoint is damaged") from None
    except FileError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    if not data:
        raise CheckpointError(f"{where}: {f} is empty; the checkpoint is damaged")
    try:
        md = _load_dcp_pickle(data)
    except Exception as exc:  # noqa: BLE001 - whatever the bytes do, one line
        raise CheckpointError(f"{where}: {f} is refused: not DCP metadata ({_why(exc)}); "
                              "nothing in it was run") from None

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{where}: {f}: {what}; the checkpoint is damaged")

    if not isinstance(md, Metadata):
        raise bad(f"holds a {type(md).__name__}, not DCP's Metadata")
    sdm, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if not isinstance(sdm, dict) or not sdm or not isinstance(storage, dict):
        raise bad("no index of tensors")
    for key, tmd in sdm.items():
        if not isinstance(key, str):
            raise bad(f"a key {key!r} that is not a name")
        if not isinstance(tmd, TensorStorageMetadata):
            raise bad(f"{key!r} is a {type(tmd).__name__}, not a tensor (pipebubble saves "
                      "tensors only)")
        size = tmd.size
        chunks = tmd.chunks
        if (not isinstance(size, torch.Size) or len(size) > MAX_DIMS
                or not all(_int(d, 0, MAX_DIM) for d in size)):
            raise bad(f"{key!r} has shape {size!r}")
        if (not isinstance(chunks, list) or len(chunks) != 1
                or tuple(chunks[0].sizes) != tuple(size) or any(chunks[0].offsets)):
            raise bad(f"{key!r} is not one whole chunk")
        if MetadataIndex(key, chunks[0].offsets, 0) not in storage:
            raise bad(f"{key!r} has no record in any shard")
    files: dict[str, int] = {}
    for idx, info in storage.items():
        if not isinstance(idx, MetadataIndex) or idx.fqn not in sdm:
            raise bad(f"a record of {getattr(idx, 'fqn', idx)!r}, which is not indexed")
        if not isinstance(info, _StorageInfo):
            raise bad(f"the record of {idx.fqn!r} is a {type(info).__name__}")
        rel = info.relative_path
        if not isinstance(rel, str) or not SHARD_NAME.fullmatch(rel):
            raise bad(f"the record of {idx.fqn!r} is in {str(rel)[:80]!r}, not a shard file "
                      "of this folder (__R_N.distcp)")
        if not (_int(info.offset, 0, 2**62) and _int(info.length, _ZIP_END_LEN, 2**62)):
            raise bad(f"the record of {idx.fqn!r} has offset {info.offset!r}, length "
                      f"{info.length!r}")
        if info.transform_descriptors:
            raise bad(f"the record of {idx.fqn!r} is transformed "
                      f"({list(info.transform_descriptors)[:3]}); pipebubble writes none")
        files[rel] = max(files.get(rel, 0), info.offset + info.length)
    for rel, need in sorted(files.items()):
        shard = folder / rel
        try:
            st = os.lstat(shard)
        except FileNotFoundError:
            raise CheckpointError(f"{where}: shard {shard} is missing; the checkpoint is "
                                  "damaged") from None
        except OSError as exc:
            raise CheckpointError(f"{where}: shard {shard}: {_why(exc)}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: shard {shard} is not a regular file (a link, "
                                  "folder or device); the checkpoint is damaged")
        if st.st_size < need:
            raise CheckpointError(f"{where}: shard {shard} is truncated: {st.st_size:,} bytes,"
                                  f" the index needs {need:,}")
    _check_records(folder, where, storage)
    if meta is not None:
        _match_meta(where, f, sdm, meta)
    return md


def _check_records(folder: Path, where: str, storage: dict) -> None:
    """Each record starts and ends as ``torch.save``'s zip does (a zeroed or overwritten
    record fails here, before any process starts, instead of inside DCP's load)."""
    by_file: dict[str, list] = {}
    for idx, info in storage.items():
        by_file.setdefault(info.relative_path, []).append((idx.fqn, info))
    for rel, items in sorted(by_file.items()):
        shard = folder / rel
        try:
            with open(shard, "rb") as fh:
                for fqn, info in items:
                    fh.seek(info.offset)
                    head = fh.read(4)
                    fh.seek(info.offset + info.length - _ZIP_END_LEN)
                    tail = fh.read(4)
                    if head != _ZIP_START or tail != _ZIP_END:
                        raise CheckpointError(
                            f"{where}: shard {shard} is damaged: the record of {fqn!r} at "
                            f"byte {info.offset:,} is not a saved tensor")
        except OSError as exc:
            raise CheckpointError(f"{where}: shard {shard}: {_why(exc)}") from None


def _match_meta(where: str, f: Path, sdm: dict, meta: dict) -> None:
    """The index holds what ``pipebubble.json`` says: every parameter with its shape and the
    optimizer's state of it (a mismatch would fail deep inside DCP's load)."""
    for name, shape in meta["parameters"].items():
        want = {f"model.{name}": tuple(shape)}
        for k in OPTIMIZER_STATE[meta["optimizer"]]:
            want[f"optim.{name}.{k}"] = () if k == "step" else tuple(shape)
        for key, size in want.items():
            if key not in sdm:
                raise CheckpointError(f"{where}: {f} has no {key!r}, which {META} lists; "
                                      "the checkpoint is damaged")
            if tuple(sdm[key].size) != size:
                raise CheckpointError(f"{where}: {f} gives {key!r} shape "
                                      f"{list(sdm[key].size)}, {META} {list(size)}; the "
                                      "checkpoint is damaged")


def read_meta(path: str) -> dict:
    """The metadata of the checkpoint at ``path``, every field checked, and its shards'
    index (:func:`read_dcp_metadata`); :class:`CheckpointError` when it is not one."""
    if path == "":
        raise ParamError(f"{_RESUME} '': empty folder name; give a folder written by run {_SAVE}")
    recover(path)
    p = Path(path)
    if not p.is_dir():
        raise ParamError(f"{_RESUME} {path}: not a folder; give a folder written by run {_SAVE}")
    try:
        meta = read_json_file(p / META, "checkpoint file", 16 * 2**20)
    except MissingFileError:
        raise CheckpointError(f"{_RESUME} {path}: not a pipebubble checkpoint (no {META}); "
                              f"give a folder written by run {_SAVE}") from None
    except FileError as exc:
        text = str(exc)
        if "not valid JSON" in text:
            text = text.split(": ", 1)[0] + " is unreadable (not valid JSON)"
        raise CheckpointError(f"{_RESUME} {path}: {text}; the checkpoint is damaged") from None
    _check_fields(path, p / META, meta)
    md = read_dcp_metadata(path, meta)
    files = meta.get("files")
    if files is not None:
        for rel in {info.relative_path for info in md.storage_data.values()} | {DCP_META}:
            if rel not in files:
                raise CheckpointError(f"{_RESUME} {path}: {p / META} records no digest of "
                                      f"{rel}, which the index uses; the checkpoint is "
                                      "damaged")
    if files is None:  # written before digests: load every record once, here, instead
        _check_loadable(p, f"{_RESUME} {path}", md)
    _check_digests(path, meta)
    return meta


def _check_loadable(folder: Path, where: str, md: Any) -> None:
    """Each record loads (``torch.load(weights_only=True)``, as DCP will) as a tensor of its
    indexed shape: for a checkpoint without digests, the only way to find a damaged record
    before any process group exists (in a distributed run, a failure later ends every rank)."""
    by_file: dict[str, list] = {}
    for idx, info in md.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((idx.fqn, info))
    for rel, items in sorted(by_file.items()):
        shard = folder / rel
        with open(shard, "rb") as fh:
            for fqn, info in items:
                fh.seek(info.offset)
                raw = fh.read(info.length)
                try:
                    t = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
                except Exception as exc:  # noqa: BLE001 - one line naming the shard
                    raise CheckpointError(f"{where}: shard {shard} is damaged: the record of "
                                          f"{fqn!r} does not load ({_why(exc)})") from None
                want = tuple(md.state_dict_metadata[fqn].size)
                if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                    raise CheckpointError(f"{where}: shard {shard} is damaged: the record of "
                                          f"{fqn!r} is not a tensor of shape {list(want)}")


def _check_fields(path: str, f: Path, meta: Any) -> None:
    """Every field of ``pipebubble.json`` of the right type and in range."""
    where = f"{_RESUME} {path}"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: {META} is not a pipebubble checkpoint's metadata")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{where}: checkpoint version {meta.get('version')!r}; this "
                              f"pipebubble reads version {VERSION}")

    def bad(key: str, valid: str) -> CheckpointError:
        shown = json.dumps(meta.get(key))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return CheckpointError(f"{where}: {f} has {key} {shown}; {valid} (the checkpoint is "
                               "damaged or was edited)")

    for key in ("parameters", "steps_done", "optimizer", "seed"):
        if key not in meta:
            raise CheckpointError(f"{where}: {META} lacks {key!r}; the checkpoint is damaged")
    steps = meta["steps_done"]
    if not _int(steps, 1, MAX_STEPS_DONE):
        raise bad("steps_done", f"it must be an integer in 1..{MAX_STEPS_DONE}")
    if not _int(meta["seed"], 0, MAX_SEED):
        raise bad("seed", f"it must be an integer in 0..{MAX_SEED}")
    if meta["optimizer"] not in OPTIMIZER_STATE:
        raise bad("optimizer", f"it must be one of {', '.join(OPTIMIZER_STATE)}")
    params = meta["parameters"]
    if not isinstance(params, dict) or not params:
        raise bad("parameters", "it must map each parameter's name to its shape")
    for name, shape in params.items():
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(_int(d, 0, MAX_DIM) for d in shape)):
            raise CheckpointError(f"{where}: {f} gives parameter {name!r} the shape "
                                  f"{json.dumps(shape)[:60]}; a shape is a list of at most "
                                  f"{MAX_DIMS} sizes >= 0 (the checkpoint is damaged)")
    if "next_step" in meta and meta["next_step"] != steps:
        raise bad("next_step", f"it must equal steps_done ({steps})")
    lr = meta.get("lr")
    if "lr" in meta and not (isinstance(lr, int | float) and not isinstance(lr, bool)
                             and 0 <= lr <= MAX_LR):
        raise bad("lr", f"it must be a number in 0..{MAX_LR:g}")
    if "batch" in meta and not _int(meta["batch"], 1, 2**40):
        raise bad("batch", "it must be an integer >= 1")
    for key in ("model", "description", "schedule"):
        if key in meta and not isinstance(meta[key], str):
            raise bad(key, "it must be a string")
    if "boundaries" in meta and not (isinstance(meta["boundaries"], list) and all(
            _int(b, 1, 2**40) for b in meta["boundaries"])):
        raise bad("boundaries", "it must be a list of layer indices")
    files = meta.get("files")
    if files is not None and not (isinstance(files, dict) and len(files) <= 100_000 and all(
            (n == DCP_META or SHARD_NAME.fullmatch(n)) and isinstance(v, dict)
            and _int(v.get("bytes"), 0, 2**62) and isinstance(v.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", v["sha256"]) for n, v in files.items())):
        raise bad("files", "it must map each shard file to its bytes and sha256")
    losses = meta.get("losses", [])
    if not isinstance(losses, list) or len(losses) != steps:
        raise bad("losses", f"it must list one loss per step done ({steps})")
    for i, v in enumerate(losses):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise CheckpointError(f"{where}: {f} has loss {json.dumps(v)[:40]} at step {i}; a "
                                  "loss is a number (or null where it diverged)")


def check_compatible(path: str, meta: dict, shapes: dict[str, tuple[int, ...]],
                     optimizer: str, seed: int) -> None:
    """The checkpoint holds exactly this model's parameters (names and shapes), for this
    optimizer and data seed; else one UserError naming the first difference."""
    theirs = {k: tuple(v) for k, v in meta["parameters"].items()}
    what = f"{_RESUME} {path}: the checkpoint belongs to another model ({meta.get('model')!r})"
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
        raise ParamError(f"{_RESUME} {path}: the checkpoint was trained with {_OPTIMIZER} "
                         f"{meta['optimizer']}, not {optimizer}; use {_OPTIMIZER} "
                         f"{meta['optimizer']}")
    if meta["seed"] != seed:
        raise ParamError(f"{_RESUME} {path}: the checkpoint's data stream has {_SEED} "
                         f"{meta['seed']}, not {seed}; use {_SEED} {meta['seed']} (step k's "
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


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the system or file system cannot (then nothing changed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _digest(f: Path) -> dict:
    """A file's size and SHA-256 (``pipebubble.json``'s ``files``): DCP's shards carry no
    checksum, and ``torch.load`` does not check the zip's CRC, so without it a flipped byte
    inside a tensor would load as a wrong weight."""
    h = hashlib.sha256()
    size = 0
    with open(f, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            size += len(block)
    return {"bytes": size, "sha256": h.hexdigest()}


def _check_digests(path: str, meta: dict) -> None:
    """Every file ``pipebubble.json`` lists has its recorded size and SHA-256 (checkpoints
    written before digests were recorded have no ``files``: nothing to check)."""
    files = meta.get("files")
    if files is None:
        return
    folder = Path(path)
    for name, want in files.items():
        f = folder / name
        try:
            got = _digest(f)
        except OSError as exc:
            raise CheckpointError(f"{_RESUME} {path}: {f}: {_why(exc)}; the checkpoint is "
                                  "damaged") from None
        if got["bytes"] != want["bytes"]:
            raise CheckpointError(f"{_RESUME} {path}: {f} has {got['bytes']:,} bytes, "
                                  f"{META} records {want['bytes']:,}; the checkpoint is "
                                  "damaged")
        if got["sha256"] != want["sha256"]:
            raise CheckpointError(f"{_RESUME} {path}: {f} is damaged: its SHA-256 differs from "
                                  f"the one {META} records")


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(partial: Path, final: Path, meta: dict) -> None:
    """Write ``pipebubble.json`` into the finished ``partial`` folder and put the folder at
    ``final`` in one atomic step (see the module docstring); then drop the old one."""
    files = {n: _digest(partial / n) for n in sorted(os.listdir(partial))
             if n == DCP_META or SHARD_NAME.fullmatch(n)}
    write_json_atomic(partial / META, {**meta, "files": files, "format": FORMAT,
                                       "version": VERSION})
    _fsync_dir(partial)
    if not os.path.lexists(final):
        os.rename(partial, final)
    elif _exchange(partial, final):
        shutil.rmtree(partial)  # the previous checkpoint, swapped out
    else:  # two renames; recover() puts DIR.old back if a crash comes between them
        _, old = _siblings(final)
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old)
    _fsync_dir(final.absolute().parent)


def save(path: str, state: dict[str, torch.Tensor], meta: dict, *, coordinator: bool = True,
         barrier: Callable[[], None] = lambda: None) -> None:
    """Write this rank's ``state`` and (on the coordinator) ``meta`` to ``path``, atomically:
    ``DIR`` is the previous checkpoint until the new one is whole, then the new one.

    Collective: every rank of the default process group calls it (or one process alone,
    without one). ``barrier`` synchronises the ranks between the phases (the coordinator
    clears ``DIR.partial``, all write, the coordinator publishes); every rank passes every
    barrier even when a phase failed, so no rank waits for one that gave up. A failure is
    one :class:`SaveError` (on the coordinator, for its own phases) naming the folder.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    final = Path(path)
    partial, _ = _siblings(final)
    problem: str | None = None
    if coordinator:
        try:
            if os.path.lexists(partial):
                shutil.rmtree(partial)
        except OSError as exc:
            problem = f"cannot clear {partial} ({_why(exc)})"
    barrier()
    try:
        _quiet(dcp.save, state, checkpoint_id=str(partial))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - the same on every rank
        raise SaveError(f"{_SAVE} {path}: writing the shards failed ({_why(exc)}); the "
                        "previous checkpoint there, if any, is unchanged") from None
    barrier()
    if coordinator and problem is None:
        try:
            _publish(partial, final, meta)
        except OSError as exc:
            problem = f"cannot put the checkpoint in place ({_why(exc)})"
    barrier()
    if problem is not None:
        raise SaveError(f"{_SAVE} {path}: {problem}; the previous checkpoint there, if any, is "
                        "unchanged")


@functools.cache
def _reader_class() -> type:
    """DCP's ``FileSystemReader`` with a checked index in place of its ``pickle.load``, and
    each shard's failure named (built on first use: DCP is a heavy import)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadPlan

    class CheckedReader(FileSystemReader):
        def __init__(self, path: str, checked: Any) -> None:
            super().__init__(path)
            self.checked, self.where = checked, path
            self.error: CheckpointError | None = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            md = self.checked  # never the file again: read_dcp_metadata read it, safely
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

        def read_data(self, plan: Any, planner: Any) -> Any:
            by_file: dict[str, list] = {}
            for item in plan.items:
                by_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                   []).append(item)
            fut = None
            for rel, items in sorted(by_file.items()):
                try:
                    fut = super().read_data(LoadPlan(items), planner)
                    fut.wait()
                except Exception as exc:  # noqa: BLE001 - one line naming the shard
                    self.error = CheckpointError(f"{_RESUME} {self.where}: shard "
                                                 f"{Path(self.where) / rel} is damaged "
                                                 f"({_why(exc)})")
                    raise self.error from None
            return fut if fut is not None else super().read_data(plan, planner)

    return CheckedReader


def checked_reader(path: str, meta: dict | None = None) -> Any:
    """A DCP storage reader of the checkpoint at ``path`` that runs no code from it: its
    index comes from :func:`read_dcp_metadata` (checked against ``meta``, the folder's
    ``pipebubble.json``), and DCP reads the tensors with ``torch.load(weights_only=True)``."""
    return _reader_class()(path, read_dcp_metadata(path, meta))


def load(path: str, state: dict[str, torch.Tensor], *, meta: dict | None = None,
         no_dist: bool = False) -> None:
    """Fill ``state``'s tensors in place from the checkpoint (collective, like :func:`save`,
    unless ``no_dist``: then each process reads only its own keys). The index is read by
    :func:`read_dcp_metadata`, never unpickled by DCP; any failure is one
    :class:`CheckpointError` naming the file."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    reader = checked_reader(path, meta)
    try:
        _quiet(dcp.load, state, storage_reader=reader, no_dist=no_dist)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001
        if reader.error is not None:
            raise reader.error from None
        raise CheckpointError(f"{_RESUME} {path}: the checkpoint does not load into this "
                              f"model ({_why(exc)})") from None


def checkpoint_meta(*, model: str, description: str, shapes: dict[str, tuple[int, ...]],
                    steps_done: int, seed: int, optimizer: str, lr: float, schedule: str,
                    boundaries: Sequence[int], batch: int, losses: Sequence[float]) -> dict:
    """The metadata file's content (see the module docstring)."""
    return {
        "model": model, "description": description,
        "parameters": {k: list(v) for k, v in shapes.items()},
        "steps_done": steps_done, "seed": seed, "next_step": steps_done,
        "optimizer": optimizer, "lr": lr, "schedule": schedule,
        "boundaries": list(boundaries), "batch": batch,
        # a diverged step's loss is null: strict JSON, and read back as such
        "losses": [float(v) if math.isfinite(v) else None for v in losses],
    }
