"""Safe file input and output: every file a command reads or writes goes through here.

A user who types a wrong path should get one line naming the path and what is wrong with
it, never a traceback, a hang or a file written somewhere unexpected. The checks:

Reading (:func:`read_text_file`, :func:`read_json_file`):

- the path is not empty, exists, and is a *regular* file: a directory, a FIFO (which would
  block forever), a device (``/dev/zero`` never ends) or a socket is refused;
- the file is at most ``limit`` bytes (default :data:`MAX_INPUT_BYTES`, 64 MiB: a profile
  or timeline of a million events fits in a few tens of MiB);
- the bytes are UTF-8 (a BOM is allowed); the error names the file and the first bad byte;
- JSON is nested at most :data:`MAX_JSON_DEPTH` levels (deeper would exhaust Python's
  recursion), integers have at most :data:`MAX_INT_DIGITS` digits, every number is finite
  as a float (``1e999`` and ``NaN`` are refused).

Writing (:func:`check_output_path`, :func:`write_text`, :func:`open_output`):

- the path is not empty and does not end with ``/`` (``--png newdir/`` is an error, not a
  file called ``newdir``), is not a directory, its parent exists and is a directory, the
  file name is not longer than the file system allows, and the place is writable;
- the write is atomic (a temporary file beside the target, renamed into place): a failed
  write or close (a full disk, ``/dev/full``), an exception or ``kill -9`` mid-way leaves
  the old file as it was and no partial file under the final name; a failure is one line
  naming the path.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> write_text(os.path.join(d, "a.json"), '{"x": [1, 2.5]}')  # doctest: +ELLIPSIS
PosixPath('.../a.json')
>>> read_json_file(os.path.join(d, "a.json"), "input")
{'x': [1, 2.5]}
>>> check_output_path("newdir/")
Traceback (most recent call last):
...
pipebubble.files.FileError: output 'newdir/' ends with '/': give a file name, e.g. newdir/out
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import param
from .ir.schedule import ScheduleError

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_JSON = param("json")

MAX_INPUT_BYTES = 64 * 2**20
"""Largest input file read (bytes). A timeline of a million events is about 80 MiB as JSON
with every field; a profile of 100 000 layers about 15 MiB."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays/objects accepted; our files nest at most 4 levels."""

MAX_INT_DIGITS = 30
"""Longest integer accepted in a JSON input (digits); 30 digits already exceed any byte or
FLOP count a file can mean, and Python refuses to convert more than 4300."""


class FileError(ScheduleError):
    """A file cannot be read or written as asked. The message names the path and why."""


class MissingFileError(FileError, FileNotFoundError):
    """A file or directory named in a command does not exist (also a FileNotFoundError)."""


def _show(path: str | os.PathLike) -> str:
    return repr(os.fspath(path))


# ---- reading -------------------------------------------------------------------------------
def read_bytes_file(path: str | os.PathLike, what: str = "input file",
                    limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or :class:`FileError`.

    ``what`` names the file in messages (a flag such as ``--profile``, or ``profile file``).
    The file is opened without blocking and checked with ``fstat`` on the open descriptor,
    so a FIFO is refused instead of waiting for a writer, and what is checked is what is read.
    """
    if os.fspath(path) == "":
        raise FileError(f"{what}: empty file name; give the path of a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        error = MissingFileError if exc.errno == errno.ENOENT else FileError
        raise error(f"cannot read {what} {_show(path)}: {_reason(exc, path)}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileError(f"cannot read {what} {_show(path)}: is a directory; give a file")
        if not stat.S_ISREG(st.st_mode):
            raise FileError(f"cannot read {what} {_show(path)}: not a regular file (a FIFO, "
                            "device or socket); give a file")
        if st.st_size > limit:
            raise FileError(f"cannot read {what} {_show(path)}: {st.st_size:,} bytes, over the "
                            f"limit of {limit:,} bytes")
        chunks, total = [], 0
        while True:  # a file may grow while we read: never read past the limit
            block = os.read(fd, min(1 << 20, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise FileError(f"cannot read {what} {_show(path)}: over the limit of "
                                f"{limit:,} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise FileError(f"cannot read {what} {_show(path)}: {_reason(exc, path)}") from None
    finally:
        os.close(fd)


def read_text_file(path: str | os.PathLike, what: str = "input file",
                   limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file (a leading BOM is dropped); see :func:`read_bytes_file`.

    Non-UTF-8 bytes are an error naming the file and the offset of the first bad byte.
    """
    data = read_bytes_file(path, what, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileError(f"cannot read {what} {_show(path)}: not UTF-8 text (byte "
                        f"0x{data[exc.start]:02x} at offset {exc.start})") from None


def parse_json(text: str, what: str = "JSON input", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with the checks of this module: nesting depth, integer digits, finite
    floats, no ``NaN``/``Infinity``. Errors are :class:`FileError` naming ``what``."""
    depth = json_depth(text)
    if depth > max_depth:
        raise FileError(f"{what} nests {depth} levels deep; at most {max_depth} are accepted")

    def parse_int(s: str) -> int:
        digits = len(s.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            raise FileError(f"{what}: an integer with {digits} digits; at most "
                            f"{MAX_INT_DIGITS} are accepted")
        return int(s)

    def parse_float(s: str) -> float:
        value = float(s)
        if not math.isfinite(value):
            raise FileError(f"{what}: number {s[:40]!r} is too large for a float")
        return value

    def parse_constant(s: str) -> float:
        raise FileError(f"{what}: {s} is not a number; give a finite number")

    try:
        return json.loads(text, parse_int=parse_int, parse_float=parse_float,
                          parse_constant=parse_constant)
    except json.JSONDecodeError as exc:
        raise FileError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:  # cannot happen below MAX_JSON_DEPTH, but never a traceback
        raise FileError(f"{what} nests too deeply") from None


def read_json_file(path: str | os.PathLike, what: str = "input file",
                   limit: int = MAX_INPUT_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read and parse a JSON file with every check of :func:`read_text_file` and
    :func:`parse_json`; messages name ``what`` and the path."""
    return parse_json(read_text_file(path, what, limit), f"{what} {_show(path)}", max_depth)


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings ignored.

    >>> json_depth('{"a": [1, {"b": "]]]"}]}')
    3
    """
    depth = best = 0
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            best = max(best, depth)
        elif c in "]}":
            depth -= 1
    return best


# ---- writing -------------------------------------------------------------------------------
def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """Refuse, before any work is done, an output path that cannot be a file we write.

    Returns the path. Existing non-directories (a file to overwrite, ``/dev/null``,
    ``/dev/stdout``) are accepted; a full disk shows only when writing (:func:`write_text`).
    """
    text = os.fspath(path)
    if text == "":
        raise FileError(f"{what}: empty file name; give a path such as out.png")
    if text.endswith(("/", os.sep)) or text in (".", ".."):
        stem = text.rstrip("/" + os.sep).split(os.sep)[-1] or "dir"
        raise FileError(f"{what} {text!r} ends with '/': give a file name, e.g. "
                        f"{stem}/out")
    p = Path(text)
    parent = p.parent
    try:
        try:
            name_max = os.pathconf(parent if parent.is_dir() else ".", "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        if len(os.fsencode(p.name)) > name_max:
            raise FileError(f"{what}: file name of {len(os.fsencode(p.name))} bytes is longer "
                            f"than the {name_max} this file system allows")
        if p.is_dir():
            raise FileError(f"{what} {text!r} is a directory; give a file name inside it")
        if not parent.exists():
            raise MissingFileError(f"{what} {text!r}: directory {str(parent)!r} does not exist")
        if not parent.is_dir():
            raise FileError(f"{what} {text!r}: {str(parent)!r} is a file, not a directory")
        exists = p.exists()
        if not os.access(p if exists else parent, os.W_OK):
            where = text if exists else str(parent)
            raise FileError(f"{what} {text!r}: permission denied to write in {where!r}")
    except FileError:
        raise
    except OSError as exc:  # e.g. a path too long to stat
        raise FileError(f"{what} {text!r}: {_reason(exc, text)}") from None
    return p


@contextlib.contextmanager
def open_output(path: str | os.PathLike, what: str = "output", mode: str = "w",
                newline: str | None = None) -> Iterator[IO]:
    """Open ``path`` for writing (text ``w`` or binary ``wb``), *atomically*: every file
    pipebubble writes goes through here.

    The bytes go to a temporary file beside the target (same directory, so the same file
    system), which is flushed, ``fsync``-ed and renamed over the target (``os.replace``)
    only once the writer finished without error. So a failed write (a full disk, an
    exception in the writer) or a ``kill -9`` mid-way leaves the old file exactly as it
    was and never a partial file under the final name; a crash may leave only a
    ``.NAME.*.tmp`` file beside it. An existing file keeps its permission bits. A symbolic
    link is followed: the file it points to is replaced, the link stays.

    Targets that cannot be renamed over (``/dev/null``, ``/dev/stdout``, a FIFO) are
    written in place. ``-`` means standard output (text mode only); it is flushed, not
    closed. Any OSError while opening, writing or closing becomes one :class:`FileError`
    naming the path.
    """
    text = os.fspath(path)
    if text == "-":
        if "b" in mode:
            raise FileError(f"{what}: '-' (standard output) cannot take binary output; "
                            "give a file name")
        yield sys.stdout
        try:
            sys.stdout.flush()
        except OSError as exc:
            raise FileError(f"cannot write standard output: {_reason(exc, text)}") from None
        return
    p = check_output_path(text, what)
    kw = {"newline": newline, **({} if "b" in mode else {"encoding": "utf-8"})}
    real = Path(os.path.realpath(p))
    try:
        st = os.stat(real)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # a device or FIFO: in place
        try:
            f = open(_open_fifo(real, text, what) if stat.S_ISFIFO(st.st_mode) else real,
                     mode, **kw)
        except OSError as exc:
            raise FileError(f"cannot write {what} {text!r}: {_reason(exc, text)}") from None
        try:
            with f:
                yield f
        except OSError as exc:
            raise FileError(f"cannot write {what} {text!r}: {_reason(exc, text)}") from None
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name[:200]}.", suffix=".tmp",
                                   dir=real.parent)
    except OSError as exc:
        raise FileError(f"cannot write {what} {text!r}: {_reason(exc, text)}") from None
    try:
        with open(fd, mode, **kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
        tmp = None
    except OSError as exc:
        raise FileError(f"cannot write {what} {text!r}: {_reason(exc, text)}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _open_fifo(real: Path, text: str, what: str) -> int:
    """A file descriptor writing into the FIFO ``real``, or :class:`FileError` at once when
    no process reads it: a plain ``open`` would block until a reader comes, maybe never."""
    try:
        fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise FileError(f"cannot write {what} {text!r}: it is a FIFO that no process "
                            "reads; start its reader first") from None
        raise
    os.set_blocking(fd, True)  # a reader is there: write as to any pipe
    return fd


def _umask() -> int:
    """This process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str, what: str = "output") -> Path:
    """Write ``text`` (UTF-8) to ``path`` with the checks of :func:`open_output`."""
    with open_output(path, what) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes, what: str = "output") -> Path:
    """Write ``data`` to ``path`` with the checks of :func:`open_output`."""
    with open_output(path, what, "wb") as f:
        f.write(data)
    return Path(path)


def flush_stdout() -> None:
    """Flush standard output now, so that a full disk (``> /dev/full``) is one line of error
    instead of Python's "Exception ignored" at exit. On failure, standard output is pointed
    at /dev/null (so the flush at exit succeeds) and :class:`FileError` is raised."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise stdout_failed(exc) from None


def stdout_failed(exc: OSError) -> FileError:
    """Standard output failed with ``exc``: point it at /dev/null (nothing more can reach the
    user there, and Python's flush at exit must not fail again) and return the error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return FileError(f"cannot write standard output: {_reason(exc, '-')}")


def _reason(exc: OSError, path: str | os.PathLike) -> str:
    """A short phrase for an OSError, in the user's terms."""
    code = exc.errno
    if code == errno.ENOENT:
        return "not found (no such file)"
    if code == errno.ENOTDIR:
        return "a directory in the path is a file"
    if code == errno.EISDIR:
        return "is a directory"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.ENOSPC:
        return "no space left on the device (disk full)"
    if code == errno.ENAMETOOLONG:
        return "name too long for the file system"
    if code == errno.EROFS:
        return "read-only file system"
    if code == errno.ELOOP:
        return "too many levels of symbolic links"
    return exc.strerror or type(exc).__name__


# ---- JSON out ------------------------------------------------------------------------------
def json_text(obj: Any, what: str = _JSON, indent: int | None = None,
              separators: tuple[str, str] | None = None) -> str:
    """``obj`` as strict JSON text: the one serialiser for what the CLI prints or saves.

    ``json.dumps`` would write ``NaN`` and ``Infinity``, which no strict JSON reader
    accepts; here a non-finite number is a :class:`FileError` naming where it is (``what``
    and the path inside the document), so the user sees which input produced it.

    >>> json_text({"a": [1, 2.5]})
    '{"a": [1, 2.5]}'
    >>> json_text({"plans": [{"step": float("inf")}]})
    Traceback (most recent call last):
    ...
    pipebubble.files.FileError: json: plans[0].step is inf, not a finite number; \
the inputs overflow (check the profile and flags for huge or zero values)
    """
    try:
        return json.dumps(obj, allow_nan=False, indent=indent, separators=separators)
    except ValueError:
        where, value = _non_finite(obj, "")
        if where is None:
            raise
        raise FileError(f"{what}: {where or 'the value'} is {value}, not a finite number; "
                        "the inputs overflow (check the profile and flags for huge or zero "
                        "values)") from None


def _non_finite(obj: Any, where: str) -> tuple[str | None, float | None]:
    """The first non-finite float in ``obj`` as (path, value), or (None, None)."""
    stack = [(obj, where)]
    while stack:
        o, w = stack.pop()
        if isinstance(o, float) and not math.isfinite(o):
            return w, o
        if isinstance(o, dict):
            stack.extend((v, f"{w}.{k}" if w else str(k)) for k, v in reversed(o.items()))
        elif isinstance(o, list | tuple):
            stack.extend((v, f"{w}[{i}]") for i, v in reversed(list(enumerate(o))))
    return None, None
