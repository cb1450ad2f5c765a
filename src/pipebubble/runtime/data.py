"""Real data for ``run --data FILE``: a token file read in order, as a model's ``make_batch``.

A causal LM trains on windows of ``seq + 1`` consecutive tokens: the first ``seq`` are the
inputs, the last ``seq`` (shifted by one) the targets. :class:`TokenStream` cuts the file's
tokens into such windows, back to back (window ``i`` is tokens ``i*(seq+1) .. i*(seq+1)+seq``),
and hands them out in order: step ``k`` of a run whose global batch is ``n`` samples (the
pipeline's batch times ``--dp``) reads windows ``k*n .. k*n + n - 1``. The global batch is
then split as any batch is: replica ``r`` takes rows ``r*B .. r*B + B - 1`` and cuts them
into its microbatches, so microbatch ``j`` of replica 0 reads the next contiguous windows
after microbatch ``j - 1``'s, every process computes the same batch for the same step (no
communication: the step number decides it), and a resumed run continues where the
checkpoint stopped (its step count). After the file's last whole window the stream starts
again at its beginning (a new epoch); the tokens after the last whole window are unused.

What a file may hold (:func:`read_tokens`):

- ``.npy``: a NumPy array of integer token ids (any signed or unsigned integer dtype, any
  shape, read in C order), e.g. ``np.save("train.npy", ids.astype(np.uint16))``;
- ``.bin``: raw token ids with no header, as nanoGPT's ``prepare.py`` writes them
  (``uint16`` by default; ``--data-dtype`` ``uint32``, ``int32`` or ``int64`` for others,
  little-endian);
- anything else: UTF-8 text, tokenized with the model's own tokenizer when the ``hf:PATH``
  folder holds one (``transformers.AutoTokenizer``, ``local_files_only``: nothing is
  downloaded); without one it is an error that says so.

The model must be a causal LM whose ``make_batch`` gives integer token ids of shape
``(n, seq)`` for both inputs and targets (the built-in transformer, every ``hf:PATH`` model,
and a ``ModelSpec`` that does the same); its vocabulary is ``metadata["vocab"]`` when the
spec sets it, else the size of the first ``nn.Embedding`` in its first layer.

Bad input is one line naming the file and what is valid (:class:`DataError`): an empty file,
one too short for one step (with the number of tokens a step needs), floats, negative ids or
ids outside the vocabulary (the largest id and the vocabulary size), a directory, FIFO or
device (refused by :func:`pipebubble.files.read_bytes_file`).

>>> import numpy as np
>>> s = TokenStream(np.arange(12), seq=2, name="demo")  # windows [0 1 2] [3 4 5] ...
>>> x, y = s.at_step(1, 2)                              # step 1 of a 2-sample batch
>>> x.tolist(), y.tolist()
([[6, 7], [9, 10]], [[7, 8], [10, 11]])
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import UserError, param
from ..files import MAX_INPUT_BYTES, read_bytes_file, read_text_file
from ..limits import MAX_DATA_BYTES

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_BATCH = param("batch")
_DATA = param("data")
_DATA_DTYPE = param("data_dtype")
_DP = param("dp")
_MODEL = param("model")
_SEQ = param("seq")

BIN_DTYPES = ("uint16", "uint32", "int32", "int64")
"""Token dtypes of a raw ``.bin`` file (``--data-dtype``; little-endian, no header)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class DataError(UserError):
    """A ``--data`` file that cannot be the model's tokens; the message names the file."""


class TokenStream:
    """The windows of ``seq + 1`` tokens of ``tokens``, in order (see the module docstring).

    Called as ``make_batch(n, generator)`` it gives step 0's ``n`` samples (the generator is
    ignored: the data decides); :meth:`at_step` gives any step's, which is what
    :func:`pipebubble.runtime.train.step_batch` asks for."""

    def __init__(self, tokens: np.ndarray, seq: int, name: str = "tokens"):
        self.tokens = tokens
        self.seq = seq
        self.name = name
        self.windows = len(tokens) // (seq + 1)
        if self.windows < 1:
            raise DataError(f"{_DATA} {name}: {len(tokens)} tokens, fewer than one window of "
                            f"seq + 1 = {seq + 1}")

    def at_step(self, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (``n`` x ``seq`` int64 each) of step ``step``'s ``n`` samples:
        windows ``step*n .. step*n + n - 1``, modulo the file's windows."""
        first = (step * n + np.arange(n, dtype=np.int64)) % self.windows
        rows = first[:, None] * (self.seq + 1) + np.arange(self.seq + 1, dtype=np.int64)
        t = torch.from_numpy(self.tokens[rows].astype(np.int64))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def __call__(self, n: int, gen: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.at_step(0, n)


def _show(path: str | os.PathLike) -> str:
    return repr(os.fspath(path))


def read_tokens(path: str | os.PathLike, bin_dtype: str = "uint16",
                tokenizer_dir: str | os.PathLike | None = None) -> np.ndarray:
    """The token ids of ``path`` as a 1-D integer array (see the module docstring)."""
    name = _show(path)
    suffix = Path(path).suffix.lower()
    if suffix in (".npy", ".bin"):
        data = read_bytes_file(path, _DATA, MAX_DATA_BYTES)
        if not data:
            raise DataError(f"{_DATA} {name}: the file is empty; give token ids "
                            f"({'a .npy array' if suffix == '.npy' else 'raw ' + bin_dtype})")
        if suffix == ".npy":
            ids = _npy(data, name)
        else:
            ids = _bin(data, name, bin_dtype)
        if ids.size and int(ids.min()) < 0:
            raise DataError(f"{_DATA} {name}: token id {int(ids.min())} is negative; token ids "
                            "are 0..vocabulary-1")
        return ids
    text = read_text_file(path, _DATA, MAX_INPUT_BYTES)
    if not text.strip():
        raise DataError(f"{_DATA} {name}: the file is empty (no text to tokenize)")
    tok = _tokenizer(tokenizer_dir, name)
    tok.model_max_length = 1 << 62  # a whole file at once: no "longer than the model" warning
    ids = tok.encode(text, add_special_tokens=False)
    return np.asarray(ids, dtype=np.int64)


def _npy(data: bytes, name: str) -> np.ndarray:
    try:
        _npy_fits(data)  # before np.load allocates what the header says
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{_DATA} {name}: not a .npy array ({first}); write one with "
                        "np.save(path, ids) of integer token ids") from None
    if arr.dtype.kind not in "iu":
        raise DataError(f"{_DATA} {name}: holds {arr.dtype} values; token ids must be integers "
                        "(a .npy of an int or uint dtype, e.g. ids.astype(np.uint16))")
    if arr.size == 0:
        raise DataError(f"{_DATA} {name}: the array is empty; give token ids")
    return arr.reshape(-1)


def _npy_fits(data: bytes) -> None:
    """The .npy header's shape and dtype against the bytes that follow it: a header claiming
    10^12 tokens in a 100-byte file is refused here, before anything is allocated (np.load
    would try to allocate it first). ValueError for a header that cannot be read."""
    from numpy.lib import format as npy_format

    buf = io.BytesIO(data)
    version = npy_format.read_magic(buf)
    readers = {(1, 0): npy_format.read_array_header_1_0,
               (2, 0): npy_format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"version {version[0]}.{version[1]}, not 1.0 or 2.0")
    shape, _, dtype = readers[version](buf)
    if dtype.hasobject:
        raise ValueError("an object array (a pickle), not numbers")
    needed = math.prod(shape) * dtype.itemsize
    if needed > len(data) - buf.tell():
        raise ValueError(f"the header says shape {shape}, {needed:,} bytes, but only "
                         f"{len(data) - buf.tell():,} follow it: truncated or damaged")


def _bin(data: bytes, name: str, dtype: str) -> np.ndarray:
    if dtype not in BIN_DTYPES:
        raise DataError(f"{_DATA_DTYPE} must be one of {', '.join(BIN_DTYPES)}, got {dtype!r}")
    dt = np.dtype(dtype).newbyteorder("<")
    if len(data) % dt.itemsize:
        raise DataError(f"{_DATA} {name}: {len(data):,} bytes is not a whole number of {dtype} "
                        f"tokens ({dt.itemsize} bytes each); {_DATA_DTYPE} sets the dtype "
                        f"({', '.join(BIN_DTYPES)})")
    return np.frombuffer(data, dtype=dt)


def _tokenizer(folder: str | os.PathLike | None, name: str):
    where = f"the model folder {_show(folder)}" if folder is not None else "the model"
    if folder is None or not any((Path(folder) / f).is_file() for f in TOKENIZER_FILES):
        raise DataError(f"{_DATA} {name}: a text file is tokenized with the model's tokenizer, "
                        f"and {where} has none ({', '.join(TOKENIZER_FILES)}); give token ids "
                        f"as .npy or .bin ({', '.join(BIN_DTYPES)})")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except ImportError:
        raise DataError(f"{_DATA} {name}: tokenizing text needs the 'transformers' package: "
                        "pip install 'pipebubble[hf]'") from None
    except (OSError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{_DATA} {name}: cannot load the tokenizer of {where} ({first})"
                        ) from None


def lm_shape(spec, label: str, path: str = "") -> tuple[int, int]:
    """(seq, vocabulary) of a causal-LM ``spec``, or DataError saying why it is not one
    (naming ``path``, the ``--data`` file, when given)."""
    what = f"{_DATA} {path}" if path else _DATA
    x, y = spec.make_batch(1, torch.Generator().manual_seed(0))
    ints = not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool
    if not (ints and x.dim() == 2 and tuple(y.shape) == tuple(x.shape)
            and not y.is_floating_point()):
        raise DataError(f"{what} needs a causal LM whose batches are token ids (inputs and "
                        f"targets of shape (n, seq)); {_MODEL} {label} gives {x.dtype} inputs "
                        f"of shape {tuple(x.shape)} and {y.dtype} targets of shape "
                        f"{tuple(y.shape)}")
    vocab = (spec.metadata or {}).get("vocab")
    if vocab is None:
        emb = next((m for m in spec.layers[0].modules() if isinstance(m, nn.Embedding)), None)
        if emb is None:
            raise DataError(f"{what}: cannot tell the vocabulary of {_MODEL} {label}: its first "
                            "layer has no nn.Embedding; set metadata={'vocab': V} on its "
                            "ModelSpec")
        vocab = emb.num_embeddings
    return int(x.shape[1]), int(vocab)


def use_data(spec, path: str, batch: int, dp: int = 1, model: str = "",
             bin_dtype: str = "uint16"):
    """``spec`` with its ``make_batch`` replaced by ``path``'s tokens in order.

    ``batch`` x ``dp``: the samples of one step over every replica (the pipeline's batch
    times ``--dp``): the file must hold at least one step's windows. ``model``: the
    ``--model`` value (an ``hf:FOLDER`` gives the tokenizer for a text file)."""
    global_batch = batch * dp
    label = model or spec.name
    name = _show(path)
    seq, vocab = lm_shape(spec, label, name)
    folder = None
    if model.startswith("hf:") and Path(model[3:]).is_dir():
        folder = model[3:]
    ids = read_tokens(path, bin_dtype, folder)
    need = global_batch * (seq + 1)
    if len(ids) < need:
        raise DataError(f"{_DATA} {name}: {len(ids):,} tokens, too few for one step: "
                        f"{global_batch} samples"
                        + (f" ({_BATCH} {batch} x {_DP} {dp})" if dp > 1 else "")
                        + f" x (seq {seq} + 1) = {need:,} tokens are "
                        f"needed (a smaller {_BATCH} or {_SEQ} needs fewer)")
    top = int(ids.max())
    if top >= vocab:
        raise DataError(f"{_DATA} {name}: the largest token id, {top:,}, is outside the "
                        f"model's vocabulary of {vocab:,} (valid ids are 0..{vocab - 1:,})")
    stream = TokenStream(ids, seq, name)
    desc = (f"{spec.description or spec.name}; data {path}: {len(ids):,} tokens, "
            f"{stream.windows:,} windows of {seq + 1}")
    return replace(spec, make_batch=stream, description=desc,
                   metadata={**(spec.metadata or {}), "data": os.fspath(path)})
