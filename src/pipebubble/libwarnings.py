"""Warnings of the libraries and of the user's code, held until the result.

A bad input must be exactly one line of error. torch and transformers warn on their own
(``UserWarning: Initializing zero-element tensors is a no-op``, a transformers logger
record), and printed as they come those lines land *before* pipebubble's error line, so
the error is three lines. Where a warning says it comes from is no guide: torch's
``mse_loss`` warns with ``stacklevel=2``, so its warning names the *caller's* file, the
user's ``loss_fn`` or pipebubble's FLOP counter. ``pipebubble.cli.main`` runs every command
inside :func:`held`:

- every Python warning but pipebubble's own (:class:`PipebubbleWarning`), and every record
  of the ``transformers`` logger at WARNING or above, is kept;
- when the command succeeds, the kept lines are written to stderr *after* the result, one
  line each, ``pipebubble: warning: (torch) ...`` (the library, or the file the warning
  names: ``(my_model.py) UserWarning: ...``); when it fails, they are dropped and the error
  stays one line (no command has a ``--verbose`` flag for them; calling the library from
  Python shows them as they come);
- pipebubble's own warnings are issued again when the block ends, through the ordinary
  ``warnings`` machinery, so filters and ``pytest.warns`` still see them.

>>> import warnings
>>> with held() as kept:
...     warnings.warn_explicit("zero-element tensors", UserWarning, "/x/torch/nn/init.py", 1)
...     warnings.warn_explicit("target size", UserWarning, "/home/me/my_model.py", 9)
>>> kept.lines()
['(torch) UserWarning: zero-element tensors', '(my_model.py) UserWarning: target size']
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

LIBRARIES = ("torch", "transformers")
MAX_KEPT = 100
"""Most distinct lines kept (a warning repeated every step is kept once)."""


class PipebubbleWarning(UserWarning):
    """A warning of pipebubble's own (a noisy profile): issued again after :func:`held`,
    not held with the libraries'."""


def _library(filename: str) -> str:
    """The library a warning's file belongs to, else the file's name."""
    parts = os.path.normpath(filename or "").split(os.sep)
    return next((p for p in reversed(parts) if p in LIBRARIES), parts[-1] or "python")


class Kept:
    """The library lines held by one :func:`held` block, in order, each once."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def add(self, line: str) -> None:
        line = " ".join(line.split())  # one line each, whatever the library wrote
        if line and line not in self._lines and len(self._lines) < MAX_KEPT:
            self._lines.append(line)

    def lines(self) -> list[str]:
        return list(self._lines)

    def write(self, stream: TextIO | None = None) -> None:
        """Write the kept lines (``pipebubble: warning: ...``) and forget them."""
        stream = stream if stream is not None else sys.stderr
        for line in self._lines:
            stream.write(f"pipebubble: warning: {line}\n")
        self._lines.clear()

    def clear(self) -> None:
        self._lines.clear()


class _Handler(logging.Handler):
    def __init__(self, kept: Kept) -> None:
        super().__init__(logging.WARNING)
        self.kept = kept

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a bad format string must not end the command
            self.kept.add(f"(transformers) {record.getMessage()}")


_ACTIVE: list[tuple[logging.Handler, list[logging.Handler]]] = []
"""The handler of each open :func:`held` block and the logger's own handlers it replaced."""


def refresh() -> None:
    """Route the ``transformers`` logger to the open :func:`held` block again. Call it
    right after importing transformers: the import adds its own stderr handler."""
    if not _ACTIVE:
        return
    logger = logging.getLogger("transformers")
    handler, saved = _ACTIVE[-1]
    saved.extend(h for h in logger.handlers if h is not handler and h not in saved)
    logger.handlers = [handler]
    logger.propagate = False


@contextlib.contextmanager
def held() -> Iterator[Kept]:
    """Hold the libraries' warnings for the block; see the module docstring."""
    kept = Kept()
    logger = logging.getLogger("transformers")
    handlers, propagate = logger.handlers[:], logger.propagate
    handler = _Handler(kept)
    _ACTIVE.append((handler, handlers))
    logger.handlers = [handler]
    logger.propagate = False
    others: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield kept
            finally:
                for w in caught:
                    if issubclass(w.category, PipebubbleWarning):
                        others.append(w)
                    else:
                        kept.add(f"({_library(w.filename)}) {w.category.__name__}: "
                                 f"{w.message}")
    finally:
        _ACTIVE.pop()
        handlers.extend(h for h in logger.handlers if h is not handler and h not in handlers)
        logger.handlers = handlers
        logger.propagate = propagate
        for w in others:  # pipebubble's own warnings: as they would have been
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                   source=w.source)
