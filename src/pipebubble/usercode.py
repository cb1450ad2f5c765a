"""User code kept in its box: the model's own code fails in one line, and prints to stderr.

A run calls code that is not pipebubble's: the model file's top level, its builder, every
layer's forward and backward, ``make_batch`` and ``loss_fn``. Whatever that code does, the run
ends the same way as for any bad input: one line naming *where* (the layer, or the builder;
the stage, the rank, the training step) and the cause, exit code 2. Three pieces do it:

- :class:`UserCodeError`: a :class:`~pipebubble.errors.UserError` that carries where it
  happened. The code that calls the user's function knows the layer; the caller above it
  knows the stage and the rank; the training loop knows the step. Each adds what it knows
  with :meth:`UserCodeError.at` as the error passes up, and the message grows with it::

      model 'mine': layer 3 ('blocks.1', Block) raised RuntimeError during the forward of
      microbatch 2 (stage 1, rank 1, step 4)

- :func:`describe`: the cause in one line, never empty: an exception with no message is
  named by its type (``RuntimeError``), ``sys.exit(3)`` is ``SystemExit (exit code 3)``.
- :func:`user_prints_to_stderr` / :func:`results_to_stdout`: while a command runs user code,
  ``print()`` writes to standard error, so that ``--json`` owns standard output; the
  command prints its result inside :func:`results_to_stdout`. Every process of a
  distributed run does the same (a forked worker enters its own
  :func:`user_prints_to_stderr`).

``KeyboardInterrupt`` is never caught: Ctrl-C stops the run as it always does.

>>> describe(RuntimeError()), describe(ValueError("bad\\nwidth")), describe(SystemExit(3))
('RuntimeError', 'ValueError: bad width', 'SystemExit (exit code 3)')
>>> err = UserCodeError(ZeroDivisionError("division by zero"), "layer 1 ('1', Linear)",
...                     during="the forward of microbatch 0")
>>> str(err.at(stage=1, rank=0).at(step=4, model="toy"))
"model 'toy': layer 1 ('1', Linear) raised ZeroDivisionError: division by zero during the \
forward of microbatch 0 (stage 1, rank 0, step 4)"
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any, TextIO

from .errors import UserError

USER_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)
"""What user code may raise that a run turns into one line (not KeyboardInterrupt)."""

_WHERE = ("stage", "rank", "step")


def describe(exc: BaseException) -> str:
    """One line for an exception: ``Type: message`` (whitespace folded), or the type alone
    when the message is empty; ``SystemExit`` says its exit code."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or isinstance(code, int):
            return f"SystemExit (exit code {code or 0})"
        return f"SystemExit: {' '.join(str(code).split())}"[:300]
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}"[:300] if text else name


class UserCodeError(UserError):
    """The user's code raised (or called ``sys.exit``): one line naming where, and the cause.

    ``cause``: the exception (or its one-line text); ``what``: the code that raised, in words
    (``"layer 3 ('blocks.1', Block)"``, ``"the model builder file.py:build"``); ``during``:
    what it was doing (``"the forward of microbatch 2"``); ``where``: ``stage``, ``rank``,
    ``step``, ``model`` (the model's name, shown first), each added once by whoever knows it.
    """

    def __init__(self, cause: BaseException | str, what: str = "the model's code",
                 during: str | None = None, **where: Any):
        self.cause = cause if isinstance(cause, str) else describe(cause)
        self.what, self.during = what, during
        self.where = {k: v for k, v in where.items() if v is not None}
        self.layer: int | None = None  # the failing layer's index in its stage, when known
        super().__init__(self._text())

    def at(self, **where: Any) -> UserCodeError:
        """Add what the caller knows (a field already set is kept); return self."""
        for key, value in where.items():
            if value is not None:
                self.where.setdefault(key, value)
        self.args = (self._text(),)
        return self

    def rename(self, what: str) -> UserCodeError:
        """Say who raised in better words (the model's own layer name); return self."""
        self.what = what
        self.args = (self._text(),)
        return self

    def _text(self) -> str:
        model = self.where.get("model")
        head = f"model {model!r}: " if model and f"model {model!r}" not in self.what else ""
        place = [f"{k} {self.where[k]}" for k in _WHERE if k in self.where]
        return (f"{head}{self.what} raised {self.cause}"
                + (f" during {self.during}" if self.during else "")
                + (f" ({', '.join(place)})" if place else ""))


@contextmanager
def user_code(what: str, during: str | None = None, **where: Any) -> Iterator[None]:
    """Run user code: its failure (any exception but a UserError, or ``SystemExit``) becomes a
    :class:`UserCodeError` naming ``what``; a UserError it raises gets ``where`` added.

    >>> with user_code("the model builder m.py:build"):
    ...     raise SystemExit()
    Traceback (most recent call last):
    ...
    pipebubble.usercode.UserCodeError: the model builder m.py:build raised SystemExit (exit code 0)
    """
    try:
        yield
    except UserCodeError as exc:
        raise exc.at(**where) from None
    except UserError:
        raise
    except USER_FAILURES as exc:
        raise UserCodeError(exc, what, during, **where) from exc


def is_ours(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc`` is pipebubble's own code (outside the model
    and torch): a bug of ours, to be shown with its traceback, not blamed on the model."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(here)


def layer_in(exc: BaseException, layers: Any) -> int | None:
    """The index in ``layers`` of the layer whose code raised ``exc``: the outermost frame of
    its traceback (or of its causes') that is a method of one of ``layers``; None if none is."""
    ids = {id(m): i for i, m in enumerate(layers)}
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if owner is not None and id(owner) in ids:
                return ids[id(owner)]
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return None


def call_layer(layer: Any, x: Any, index: int, name: str, during: str) -> Any:
    """``layer(x)`` for a pass of pipebubble's own (the check's scan for random layers): an
    exception or ``sys.exit`` in it, or anything but one tensor returned, is one line naming
    the layer (a :class:`UserCodeError` or a UserError), never a traceback."""
    import torch

    with user_code(f"layer {index} ({name!r}, {type(layer).__name__})", during=during):
        y = layer(x)
    if not isinstance(y, torch.Tensor):
        raise UserError(f"layer {index} ({name!r}) returned a {type(y).__name__} during "
                        f"{during}; each layer must return one tensor (what the next stage "
                        "receives)")
    return y


# ---- standard output: the results', not the model's ---------------------------------------
_results: list[TextIO] = []


@contextmanager
def user_prints_to_stderr() -> Iterator[None]:
    """Inside, ``print()`` (``sys.stdout``) writes to standard error; the standard output of
    the moment is kept for :func:`results_to_stdout`."""
    # nested (a torchrun worker inside the command): the real one is the outer one's
    _results.append(_results[-1] if _results and sys.stdout is sys.stderr else sys.stdout)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _results.pop()


@contextmanager
def results_to_stdout() -> Iterator[None]:
    """Inside, ``sys.stdout`` is the real standard output again (for the command's result)."""
    if not _results:
        yield
        return
    with redirect_stdout(_results[-1]):
        yield


__all__ = ["USER_FAILURES", "UserCodeError", "call_layer", "describe", "is_ours", "layer_in",
           "results_to_stdout", "user_code", "user_prints_to_stderr"]
